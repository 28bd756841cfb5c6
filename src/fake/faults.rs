//! Fault injection: what can go wrong with the real service, on demand and reproducibly.
//!
//! [`Faults`] is plain data (set from options at start and replaced at runtime with
//! `POST /_admin/faults`); [`FaultState`] applies it request by request. Which requests fail is
//! drawn from the seeded generator ([`crate::rng`]), so the same seed and the same request
//! sequence fail the same way every run.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::endpoint::Endpoint;
use crate::rng::SplitMix64;

/// The fault configuration. Every field off (the default) means a well-behaved service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Seed of the generator that decides which requests fail.
    pub seed: u64,
    /// Added before every API request is handled.
    pub latency_ms: u64,
    /// Probability (0 to 1) that a request answers a 5xx, by endpoint name (see
    /// [`Endpoint::name`]); `"*"` covers the endpoints not named.
    pub error_rate: BTreeMap<String, f64>,
    /// The status injected errors answer (500 to 599).
    pub error_status: u16,
    /// The next `count` requests answer 429 with `Retry-After`.
    pub rate_limit: Option<RateLimitBurst>,
    /// The next `count` creates make the sandbox, then lose the response.
    pub drop_create: Option<DropCreate>,
    /// Cut command streams (run with `wait`, `/logs`, `?wait=true` polls) after a while.
    pub cut_streams: Option<StreamCut>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            seed: 1,
            latency_ms: 0,
            error_rate: BTreeMap::new(),
            error_status: 500,
            rate_limit: None,
            drop_create: None,
            cut_streams: None,
        }
    }
}

/// A burst of 429 answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitBurst {
    /// How many requests answer 429.
    pub count: u32,
    /// The `Retry-After` header, in seconds.
    #[serde(default = "default_retry_after")]
    pub retry_after_s: u64,
    /// Only requests to this endpoint (name); all endpoints when absent.
    #[serde(default)]
    pub endpoint: Option<String>,
}

fn default_retry_after() -> u64 {
    1
}

/// Creates whose response is lost after the sandbox exists (the case that makes a client's
/// retried create meet its own sandbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropCreate {
    /// How many creates lose their response.
    pub count: u32,
    /// How the response is lost.
    #[serde(default)]
    pub mode: DropMode,
}

/// How a dropped create response is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropMode {
    /// The connection closes before any response byte is sent.
    #[default]
    Close,
    /// The server answers 500 `internal_server_error`.
    Error,
}

/// Command streams cut after a while, like the real service's ~5-minute cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamCut {
    /// How long a stream lives.
    pub after_ms: u64,
    /// How it ends.
    #[serde(default)]
    pub mode: CutMode,
}

/// How a cut stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CutMode {
    /// The connection is aborted mid-body (a transport error for the client).
    #[default]
    Abort,
    /// An in-band `{"stream":"error","data":{"code":"sandbox_stream_closed",...}}` record, then
    /// a clean end. (A `?wait=true` poll has no body to carry it and is aborted either way.)
    ErrorRecord,
}

/// A fault spec that makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fault spec `{spec}`: {reason}")]
pub struct FaultSpecError {
    /// The spec as given.
    pub spec: String,
    /// What is wrong and how to write it.
    pub reason: String,
}

impl FaultSpecError {
    fn new(spec: &str, reason: impl Into<String>) -> Self {
        FaultSpecError {
            spec: spec.to_string(),
            reason: reason.into(),
        }
    }
}

impl Faults {
    /// Checks endpoint names, probabilities and statuses.
    pub fn validate(&self) -> Result<(), FaultSpecError> {
        for (name, p) in &self.error_rate {
            if name != "*" {
                name.parse::<Endpoint>()
                    .map_err(|e| FaultSpecError::new(name, e.to_string()))?;
            }
            if !(0.0..=1.0).contains(p) {
                return Err(FaultSpecError::new(
                    &format!("{name}={p}"),
                    "an error rate is a probability between 0 and 1",
                ));
            }
        }
        if !(500..=599).contains(&self.error_status) {
            return Err(FaultSpecError::new(
                &self.error_status.to_string(),
                "error_status must be a 5xx status (500 to 599)",
            ));
        }
        if let Some(RateLimitBurst {
            endpoint: Some(name),
            ..
        }) = &self.rate_limit
        {
            name.parse::<Endpoint>()
                .map_err(|e| FaultSpecError::new(name, e.to_string()))?;
        }
        Ok(())
    }
}

/// `ENDPOINT=P` (or just `P` for every endpoint): an error rate, as the CLI takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointRate {
    /// Endpoint name or `*`.
    pub endpoint: String,
    /// Probability 0 to 1.
    pub rate: f64,
}

impl FromStr for EndpointRate {
    type Err = FaultSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (endpoint, rate) = match s.split_once('=') {
            Some((e, r)) => (e.trim().to_string(), r.trim()),
            None => ("*".to_string(), s.trim()),
        };
        if endpoint != "*" {
            endpoint
                .parse::<Endpoint>()
                .map_err(|e| FaultSpecError::new(s, e.to_string()))?;
        }
        let rate: f64 = rate.parse().map_err(|_| {
            FaultSpecError::new(s, "write ENDPOINT=P or P, with P a probability like 0.2")
        })?;
        if !(0.0..=1.0).contains(&rate) {
            return Err(FaultSpecError::new(s, "P must be between 0 and 1"));
        }
        Ok(EndpointRate { endpoint, rate })
    }
}

impl FromStr for RateLimitBurst {
    type Err = FaultSpecError;

    /// `COUNT[:RETRY_AFTER_S[:ENDPOINT]]`, e.g. `3`, `3:2`, `3:2:create_sandbox`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "write COUNT[:RETRY_AFTER_S[:ENDPOINT]], e.g. 3:2:create_sandbox";
        let mut parts = s.split(':');
        let count = parts
            .next()
            .and_then(|c| c.trim().parse().ok())
            .ok_or_else(|| FaultSpecError::new(s, usage))?;
        let retry_after_s = match parts.next() {
            Some(r) => r
                .trim()
                .parse()
                .map_err(|_| FaultSpecError::new(s, usage))?,
            None => default_retry_after(),
        };
        let endpoint = match parts.next() {
            Some(e) => {
                let e = e.trim();
                e.parse::<Endpoint>()
                    .map_err(|err| FaultSpecError::new(s, err.to_string()))?;
                Some(e.to_string())
            }
            None => None,
        };
        if parts.next().is_some() {
            return Err(FaultSpecError::new(s, usage));
        }
        Ok(RateLimitBurst {
            count,
            retry_after_s,
            endpoint,
        })
    }
}

impl FromStr for DropCreate {
    type Err = FaultSpecError;

    /// `COUNT[:close|error]`, e.g. `1`, `2:error`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "write COUNT[:close|error], e.g. 1:close";
        let (count, mode) = match s.split_once(':') {
            Some((c, m)) => (c, Some(m.trim())),
            None => (s, None),
        };
        let count = count
            .trim()
            .parse()
            .map_err(|_| FaultSpecError::new(s, usage))?;
        let mode = match mode {
            None | Some("close") => DropMode::Close,
            Some("error") => DropMode::Error,
            Some(_) => return Err(FaultSpecError::new(s, usage)),
        };
        Ok(DropCreate { count, mode })
    }
}

impl FromStr for StreamCut {
    type Err = FaultSpecError;

    /// `MS[:abort|error_record]`, e.g. `2000`, `2000:error_record`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "write MS[:abort|error_record], e.g. 2000:abort";
        let (ms, mode) = match s.split_once(':') {
            Some((m, mode)) => (m, Some(mode.trim())),
            None => (s, None),
        };
        let after_ms = ms
            .trim()
            .parse()
            .map_err(|_| FaultSpecError::new(s, usage))?;
        let mode = match mode {
            None | Some("abort") => CutMode::Abort,
            Some("error_record") => CutMode::ErrorRecord,
            Some(_) => return Err(FaultSpecError::new(s, usage)),
        };
        Ok(StreamCut { after_ms, mode })
    }
}

impl fmt::Display for DropMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropMode::Close => "close",
            DropMode::Error => "error",
        })
    }
}

/// What the fault layer decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Handle it normally.
    Proceed,
    /// Answer 429 with this `Retry-After`.
    RateLimited { retry_after_s: u64 },
    /// Answer this 5xx.
    Error { status: u16 },
}

/// The faults in force plus what is left of their bursts.
#[derive(Debug, Clone)]
pub(crate) struct FaultState {
    faults: Faults,
    rng: SplitMix64,
    rate_limit_left: u32,
    drop_create_left: u32,
}

impl FaultState {
    pub(crate) fn new(faults: Faults) -> Self {
        FaultState {
            rng: SplitMix64::new(faults.seed),
            rate_limit_left: faults.rate_limit.as_ref().map_or(0, |r| r.count),
            drop_create_left: faults.drop_create.as_ref().map_or(0, |d| d.count),
            faults,
        }
    }

    /// The configuration as it stands, with bursts reduced to what is left of them.
    pub(crate) fn current(&self) -> Faults {
        let mut f = self.faults.clone();
        if let Some(r) = f.rate_limit.as_mut() {
            r.count = self.rate_limit_left;
        }
        if let Some(d) = f.drop_create.as_mut() {
            d.count = self.drop_create_left;
        }
        f
    }

    /// The added latency for every request.
    pub(crate) fn latency_ms(&self) -> u64 {
        self.faults.latency_ms
    }

    /// Decides the fate of one request to `endpoint` (a 429 burst wins over a random error).
    pub(crate) fn decide(&mut self, endpoint: Endpoint) -> Verdict {
        if let Some(burst) = &self.faults.rate_limit {
            let applies = burst
                .endpoint
                .as_deref()
                .is_none_or(|name| name == endpoint.name());
            if applies && self.rate_limit_left > 0 {
                self.rate_limit_left -= 1;
                return Verdict::RateLimited {
                    retry_after_s: burst.retry_after_s,
                };
            }
        }
        let rate = self
            .faults
            .error_rate
            .get(endpoint.name())
            .or_else(|| self.faults.error_rate.get("*"))
            .copied()
            .unwrap_or(0.0);
        if rate > 0.0 && self.rng.chance(rate) {
            return Verdict::Error {
                status: self.faults.error_status,
            };
        }
        Verdict::Proceed
    }

    /// Whether this create loses its response, and how (uses up one of the burst).
    pub(crate) fn take_drop_create(&mut self) -> Option<DropMode> {
        let mode = self.faults.drop_create.as_ref()?.mode;
        if self.drop_create_left == 0 {
            return None;
        }
        self.drop_create_left -= 1;
        Some(mode)
    }

    /// The stream cut in force.
    pub(crate) fn stream_cut(&self) -> Option<StreamCut> {
        self.faults.cut_streams.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_failures() {
        let faults = Faults {
            seed: 7,
            error_rate: BTreeMap::from([("*".to_string(), 0.5)]),
            ..Faults::default()
        };
        let draw = |f: &Faults| {
            let mut s = FaultState::new(f.clone());
            (0..64)
                .map(|_| s.decide(Endpoint::RunCommand) != Verdict::Proceed)
                .collect::<Vec<_>>()
        };
        let a = draw(&faults);
        assert_eq!(a, draw(&faults));
        let failures = a.iter().filter(|f| **f).count();
        assert!((16..=48).contains(&failures), "{failures} of 64 at p=0.5");
        let other = Faults {
            seed: 8,
            ..faults.clone()
        };
        assert_ne!(a, draw(&other));
    }

    #[test]
    fn rate_per_endpoint_overrides_star() {
        let mut s = FaultState::new(Faults {
            error_rate: BTreeMap::from([("*".to_string(), 1.0), ("get_session".to_string(), 0.0)]),
            error_status: 503,
            ..Faults::default()
        });
        assert_eq!(s.decide(Endpoint::GetSession), Verdict::Proceed);
        assert_eq!(
            s.decide(Endpoint::RunCommand),
            Verdict::Error { status: 503 }
        );
    }

    #[test]
    fn bursts_are_used_up() {
        let mut s = FaultState::new(Faults {
            rate_limit: Some("2:3:create_sandbox".parse().unwrap()),
            drop_create: Some("1:error".parse().unwrap()),
            ..Faults::default()
        });
        assert_eq!(s.decide(Endpoint::GetSession), Verdict::Proceed);
        assert_eq!(
            s.decide(Endpoint::CreateSandbox),
            Verdict::RateLimited { retry_after_s: 3 }
        );
        assert_eq!(s.current().rate_limit.unwrap().count, 1);
        assert_eq!(
            s.decide(Endpoint::CreateSandbox),
            Verdict::RateLimited { retry_after_s: 3 }
        );
        assert_eq!(s.decide(Endpoint::CreateSandbox), Verdict::Proceed);
        assert_eq!(s.take_drop_create(), Some(DropMode::Error));
        assert_eq!(s.take_drop_create(), None);
    }

    #[test]
    fn specs_parse_and_reject_with_usage() {
        assert_eq!(
            "run_command=0.25".parse::<EndpointRate>().unwrap(),
            EndpointRate {
                endpoint: "run_command".into(),
                rate: 0.25
            }
        );
        assert_eq!("0.1".parse::<EndpointRate>().unwrap().endpoint, "*");
        assert!("run_command=2".parse::<EndpointRate>().is_err());
        let err = "bogus=0.1".parse::<EndpointRate>().unwrap_err().to_string();
        assert!(err.contains("unknown endpoint `bogus`"), "{err}");
        assert_eq!(
            "2000:error_record".parse::<StreamCut>().unwrap(),
            StreamCut {
                after_ms: 2000,
                mode: CutMode::ErrorRecord
            }
        );
        assert!("x"
            .parse::<DropCreate>()
            .unwrap_err()
            .to_string()
            .contains("COUNT"));
        assert!("1:2:3:4".parse::<RateLimitBurst>().is_err());
    }

    #[test]
    fn validate_names_the_problem() {
        let bad = Faults {
            error_rate: BTreeMap::from([("run_comand".to_string(), 0.1)]),
            ..Faults::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("run_comand"));
        let bad_status = Faults {
            error_status: 404,
            ..Faults::default()
        };
        assert!(bad_status.validate().is_err());
        assert!(Faults::default().validate().is_ok());
    }

    #[test]
    fn faults_json_shape() {
        let f: Faults = serde_json::from_str(
            r#"{"seed":3,"error_rate":{"*":0.1},"rate_limit":{"count":2},
                "drop_create":{"count":1,"mode":"error"},"cut_streams":{"after_ms":50}}"#,
        )
        .unwrap();
        assert_eq!(f.rate_limit.unwrap().retry_after_s, 1);
        assert_eq!(f.cut_streams.unwrap().mode, CutMode::Abort);
        assert!(serde_json::from_str::<Faults>(r#"{"latency":5}"#).is_err());
    }
}
