//! The faults a [`SimProvider`](super::SimProvider) injects: each a rate in `[0, 1]` drawn per
//! call from the provider's seeded generator, plus the parameters that shape it (how long a
//! retry-after hint is, how slow a slow snapshot is, ...).
//!
//! The text form `name=value,name=value` is what the chaos CLI takes (`--faults LIST`) and what a
//! chaos report prints to reproduce a run; [`SimFaults::parse_list`] reads it and
//! [`SimFaults::to_list`] writes it back.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Fault rates and their parameters. Every rate is the probability, per call of the operations
/// it applies to, that the fault is injected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimFaults {
    /// Any operation answers 429 (before taking effect), with a retry-after hint.
    pub rate_limit: f64,
    /// The largest retry-after hint a 429 carries; the hint is drawn in `[1, retry_after_ms]`.
    pub retry_after_ms: u64,
    /// Any operation answers a 5xx (before taking effect).
    pub server_error: f64,
    /// Any operation times out: the caller waits `timeout_ms` and gets a transient error. Every
    /// operation but `exec` *did* take effect (its answer is lost, so idempotency keys are
    /// exercised); `exec` did not run, because a command is not idempotent.
    pub timeout: f64,
    /// How long a timed-out call waits before failing.
    pub timeout_ms: u64,
    /// A create succeeds but its answer is lost: the sandbox exists, the call fails transiently.
    pub lost_create: f64,
    /// The sandbox's deadline is pulled to a point inside the command about to run, so the
    /// command fails with "sandbox gone" part-way.
    pub expire_mid_command: f64,
    /// A snapshot fails for good (the sandbox keeps running; nothing is stored).
    pub snapshot_fail_permanent: f64,
    /// A snapshot fails transiently (the sandbox keeps running; nothing is stored).
    pub snapshot_fail_transient: f64,
    /// A snapshot takes `snapshot_slow_ms` longer than other calls.
    pub snapshot_slow: f64,
    /// The extra time a slow snapshot takes.
    pub snapshot_slow_ms: u64,
    /// A snapshot is stored but expires soon, in `[1, snapshot_gone_after_ms]`.
    pub snapshot_gone: f64,
    /// The latest expiry of a snapshot hit by `snapshot_gone`.
    pub snapshot_gone_after_ms: u64,
    /// A snapshot delete fails transiently (nothing is deleted).
    pub delete_fail: f64,
    /// Least latency of any call.
    pub latency_min_ms: u64,
    /// Most latency of any call; the latency is drawn in `[latency_min_ms, latency_max_ms]`.
    pub latency_max_ms: u64,
}

impl Default for SimFaults {
    fn default() -> Self {
        SimFaults::none()
    }
}

/// Why a fault list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimFaultsError {
    /// A name that is neither a fault nor a parameter.
    #[error("unknown fault `{name}` in the fault list; known names: {known}")]
    UnknownKind {
        /// The name given.
        name: String,
        /// Every accepted name, comma-separated.
        known: String,
    },
    /// An item without `=`.
    #[error("fault list item `{item}` is not `name=value` (for example `transient=0.1`)")]
    Malformed {
        /// The item given.
        item: String,
    },
    /// A value of the wrong shape or out of range.
    #[error("fault `{name}`: `{value}` is not {expected}")]
    BadValue {
        /// The fault or parameter.
        name: String,
        /// The value given.
        value: String,
        /// What was expected instead.
        expected: &'static str,
    },
    /// The latency range is inverted.
    #[error("latency_min_ms ({min}) is above latency_max_ms ({max}); give `latency=MIN..MAX`")]
    LatencyRange {
        /// The minimum given.
        min: u64,
        /// The maximum given.
        max: u64,
    },
}

/// The rate fields, by name, in the order they are listed.
const RATES: [&str; 10] = [
    "rate_limit",
    "server_error",
    "timeout",
    "lost_create",
    "expire_mid_command",
    "snapshot_fail_permanent",
    "snapshot_fail_transient",
    "snapshot_slow",
    "snapshot_gone",
    "delete_fail",
];

/// The millisecond parameters, by name.
const PARAMS: [&str; 6] = [
    "retry_after_ms",
    "timeout_ms",
    "snapshot_slow_ms",
    "snapshot_gone_after_ms",
    "latency_min_ms",
    "latency_max_ms",
];

/// Shorthands accepted by the parser on top of the field names.
const SHORTHANDS: [&str; 3] = ["transient", "all", "latency"];

impl SimFaults {
    /// No faults and no latency: the provider behaves like a perfect platform.
    pub fn none() -> SimFaults {
        SimFaults {
            rate_limit: 0.0,
            retry_after_ms: 2_000,
            server_error: 0.0,
            timeout: 0.0,
            timeout_ms: 10_000,
            lost_create: 0.0,
            expire_mid_command: 0.0,
            snapshot_fail_permanent: 0.0,
            snapshot_fail_transient: 0.0,
            snapshot_slow: 0.0,
            snapshot_slow_ms: 20_000,
            snapshot_gone: 0.0,
            snapshot_gone_after_ms: 60_000,
            delete_fail: 0.0,
            latency_min_ms: 0,
            latency_max_ms: 0,
        }
    }

    /// Every fault at `rate` (clamped to `[0, 1]`), parameters and latency at their defaults.
    pub fn all(rate: f64) -> SimFaults {
        let mut f = SimFaults::none();
        let rate = if rate.is_nan() {
            0.0
        } else {
            rate.clamp(0.0, 1.0)
        };
        for name in RATES {
            *f.rate_mut(name).expect("RATES lists only rate fields") = rate;
        }
        f
    }

    /// Whether no fault can be injected (latency aside).
    pub fn is_none(&self) -> bool {
        RATES.iter().all(|n| self.rate(n).unwrap_or(0.0) <= 0.0)
    }

    /// Parses `name=value,...`. Names are the field names, plus three shorthands:
    /// `transient=R` sets `rate_limit`, `server_error` and `timeout` to `R/3` each (a total
    /// transient rate of about `R`); `all=R` sets every rate to `R`; `latency=MIN..MAX` (or
    /// `latency=MS`) sets the latency range. Items apply left to right, so later ones override.
    /// An empty list or `none` gives [`SimFaults::none`].
    pub fn parse_list(list: &str) -> Result<SimFaults, SimFaultsError> {
        let mut f = SimFaults::none();
        let trimmed = list.trim();
        if trimmed.is_empty() || trimmed == "none" {
            return Ok(f);
        }
        for item in trimmed.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .map(|(n, v)| (n.trim(), v.trim()))
                .ok_or_else(|| SimFaultsError::Malformed {
                    item: item.to_string(),
                })?;
            f.set(name, value)?;
        }
        f.validate()?;
        Ok(f)
    }

    /// Checks that every rate is a number in `[0, 1]` and the latency range is ordered.
    pub fn validate(&self) -> Result<(), SimFaultsError> {
        for name in RATES {
            let r = self.rate(name).unwrap_or(0.0);
            if !(0.0..=1.0).contains(&r) {
                return Err(SimFaultsError::BadValue {
                    name: name.to_string(),
                    value: r.to_string(),
                    expected: "a rate between 0 and 1",
                });
            }
        }
        if self.latency_min_ms > self.latency_max_ms {
            return Err(SimFaultsError::LatencyRange {
                min: self.latency_min_ms,
                max: self.latency_max_ms,
            });
        }
        Ok(())
    }

    /// The list form, every field included, which [`SimFaults::parse_list`] reads back to an
    /// equal value.
    pub fn to_list(&self) -> String {
        let rates = RATES
            .iter()
            .map(|n| format!("{n}={}", self.rate(n).unwrap_or(0.0)));
        let params = PARAMS
            .iter()
            .map(|n| format!("{n}={}", self.param(n).unwrap_or(0)));
        rates.chain(params).collect::<Vec<_>>().join(",")
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), SimFaultsError> {
        match name {
            "transient" => {
                let r = parse_rate(name, value)?;
                self.rate_limit = r / 3.0;
                self.server_error = r / 3.0;
                self.timeout = r / 3.0;
            }
            "all" => {
                let r = parse_rate(name, value)?;
                *self = SimFaults {
                    latency_min_ms: self.latency_min_ms,
                    latency_max_ms: self.latency_max_ms,
                    ..SimFaults::all(r)
                };
            }
            "latency" => {
                let (lo, hi) = match value.split_once("..") {
                    Some((lo, hi)) => (parse_ms(name, lo.trim())?, parse_ms(name, hi.trim())?),
                    None => {
                        let ms = parse_ms(name, value)?;
                        (ms, ms)
                    }
                };
                self.latency_min_ms = lo;
                self.latency_max_ms = hi;
            }
            _ => {
                if RATES.contains(&name) {
                    let r = parse_rate(name, value)?;
                    *self.rate_mut(name).expect("name is in RATES") = r;
                } else if PARAMS.contains(&name) {
                    let ms = parse_ms(name, value)?;
                    *self.param_mut(name).expect("name is in PARAMS") = ms;
                } else {
                    return Err(SimFaultsError::UnknownKind {
                        name: name.to_string(),
                        known: RATES
                            .iter()
                            .chain(PARAMS.iter())
                            .chain(SHORTHANDS.iter())
                            .copied()
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            }
        }
        Ok(())
    }

    fn rate(&self, name: &str) -> Option<f64> {
        Some(match name {
            "rate_limit" => self.rate_limit,
            "server_error" => self.server_error,
            "timeout" => self.timeout,
            "lost_create" => self.lost_create,
            "expire_mid_command" => self.expire_mid_command,
            "snapshot_fail_permanent" => self.snapshot_fail_permanent,
            "snapshot_fail_transient" => self.snapshot_fail_transient,
            "snapshot_slow" => self.snapshot_slow,
            "snapshot_gone" => self.snapshot_gone,
            "delete_fail" => self.delete_fail,
            _ => return None,
        })
    }

    fn param(&self, name: &str) -> Option<u64> {
        Some(match name {
            "retry_after_ms" => self.retry_after_ms,
            "timeout_ms" => self.timeout_ms,
            "snapshot_slow_ms" => self.snapshot_slow_ms,
            "snapshot_gone_after_ms" => self.snapshot_gone_after_ms,
            "latency_min_ms" => self.latency_min_ms,
            "latency_max_ms" => self.latency_max_ms,
            _ => return None,
        })
    }

    fn rate_mut(&mut self, name: &str) -> Option<&mut f64> {
        Some(match name {
            "rate_limit" => &mut self.rate_limit,
            "server_error" => &mut self.server_error,
            "timeout" => &mut self.timeout,
            "lost_create" => &mut self.lost_create,
            "expire_mid_command" => &mut self.expire_mid_command,
            "snapshot_fail_permanent" => &mut self.snapshot_fail_permanent,
            "snapshot_fail_transient" => &mut self.snapshot_fail_transient,
            "snapshot_slow" => &mut self.snapshot_slow,
            "snapshot_gone" => &mut self.snapshot_gone,
            "delete_fail" => &mut self.delete_fail,
            _ => return None,
        })
    }

    fn param_mut(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "retry_after_ms" => &mut self.retry_after_ms,
            "timeout_ms" => &mut self.timeout_ms,
            "snapshot_slow_ms" => &mut self.snapshot_slow_ms,
            "snapshot_gone_after_ms" => &mut self.snapshot_gone_after_ms,
            "latency_min_ms" => &mut self.latency_min_ms,
            "latency_max_ms" => &mut self.latency_max_ms,
            _ => return None,
        })
    }
}

impl fmt::Display for SimFaults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_list())
    }
}

fn parse_rate(name: &str, value: &str) -> Result<f64, SimFaultsError> {
    match value.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(SimFaultsError::BadValue {
            name: name.to_string(),
            value: value.to_string(),
            expected: "a rate between 0 and 1",
        }),
    }
}

fn parse_ms(name: &str, value: &str) -> Result<u64, SimFaultsError> {
    value.parse::<u64>().map_err(|_| SimFaultsError::BadValue {
        name: name.to_string(),
        value: value.to_string(),
        expected: "a whole number of milliseconds",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rates_parameters_and_shorthands() {
        let f = SimFaults::parse_list(
            " transient=0.3, lost_create=0.05 ,latency=5..50,snapshot_slow_ms=1000",
        )
        .expect("valid list");
        assert!((f.rate_limit - 0.1).abs() < 1e-12);
        assert!((f.server_error - 0.1).abs() < 1e-12);
        assert!((f.timeout - 0.1).abs() < 1e-12);
        assert_eq!(f.lost_create, 0.05);
        assert_eq!((f.latency_min_ms, f.latency_max_ms), (5, 50));
        assert_eq!(f.snapshot_slow_ms, 1000);
        assert_eq!(f.delete_fail, 0.0);

        let all = SimFaults::parse_list("latency=7,all=0.2,delete_fail=0").expect("valid");
        assert_eq!(all.snapshot_gone, 0.2);
        assert_eq!(all.delete_fail, 0.0);
        assert_eq!((all.latency_min_ms, all.latency_max_ms), (7, 7));

        assert_eq!(SimFaults::parse_list("").expect("empty"), SimFaults::none());
        assert_eq!(
            SimFaults::parse_list("none").expect("none"),
            SimFaults::none()
        );
        assert!(SimFaults::none().is_none());
        assert!(!SimFaults::all(0.01).is_none());
    }

    #[test]
    fn refuses_bad_lists_with_a_clear_message() {
        let err = SimFaults::parse_list("transient=0.1,cosmic_ray=0.5").expect_err("unknown");
        assert!(matches!(&err, SimFaultsError::UnknownKind { name, .. } if name == "cosmic_ray"));
        let msg = err.to_string();
        assert!(msg.contains("`cosmic_ray`"), "{msg}");
        assert!(
            msg.contains("lost_create") && msg.contains("latency"),
            "{msg}"
        );

        let err = SimFaults::parse_list("lost_create").expect_err("no value");
        assert_eq!(
            err,
            SimFaultsError::Malformed {
                item: "lost_create".into()
            }
        );
        for bad in ["timeout=1.5", "timeout=-0.1", "timeout=NaN", "timeout=lots"] {
            let err = SimFaults::parse_list(bad).expect_err(bad);
            assert!(
                matches!(
                    err,
                    SimFaultsError::BadValue {
                        expected: "a rate between 0 and 1",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
        let err = SimFaults::parse_list("timeout_ms=0.5").expect_err("fractional ms");
        assert!(err.to_string().contains("milliseconds"), "{err}");
        let err = SimFaults::parse_list("latency=50..5").expect_err("inverted");
        assert_eq!(err, SimFaultsError::LatencyRange { min: 50, max: 5 });
    }

    #[test]
    fn list_form_and_serde_round_trip() {
        let f = SimFaults::parse_list("all=0.125,latency=1..9,retry_after_ms=300").expect("ok");
        assert_eq!(SimFaults::parse_list(&f.to_list()).expect("reads back"), f);
        let json = serde_json::to_string(&f).expect("serializes");
        assert_eq!(
            serde_json::from_str::<SimFaults>(&json).expect("deserializes"),
            f
        );
        let partial: SimFaults = serde_json::from_str(r#"{"lost_create":0.5}"#).expect("partial");
        assert_eq!(partial.lost_create, 0.5);
        assert_eq!(partial.timeout_ms, SimFaults::none().timeout_ms);
    }
}
