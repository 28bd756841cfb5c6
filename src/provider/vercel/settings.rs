//! The Vercel-specific reading of the `terminal.*` config: image or legacy runtime, resources,
//! disk and API URL, checked against what Vercel Sandbox accepts before any request is made.
//!
//! Image or runtime ([`SandboxBase`]): since `@vercel/sandbox` 3.0 (August 2026) sandboxes are
//! created from an **image** through `POST /v3/sandboxes` (`terminal.vercel_image`, default
//! `vercel/sandbox/universal`), and the `runtime` presets of `POST /v2/sandboxes` are
//! deprecated. A set `terminal.vercel_runtime` (or `TERMINAL_VERCEL_RUNTIME`) still wins, as in
//! Hermes, and `doctor` and `config show` say it is deprecated.
//!
//! Hermes passes `terminal.container_memory` through and lets the platform reject it ("memory
//! allocation validation error"), with its own default of 5120 MB guaranteed to fail. Here the
//! pairing rule (2048 MB per vCPU) is checked up front and the error names both values and a
//! valid pair, so the fix is one `taskbox config set` away.

use std::fmt;

use crate::config::TerminalConfig;

/// Memory Vercel Sandbox allocates per vCPU, MB. Memory is not sent; it follows from `vcpus`.
pub const MB_PER_VCPU: u32 = 2048;

/// The most vCPUs a Hobby or Pro plan allows (Enterprise allows 32; taskbox keeps to the
/// common plans, so a config works for everyone who can run it).
pub const MAX_VCPUS: u32 = 8;

/// The environment variable that overrides `terminal.vercel_runtime` (Hermes's name).
pub const RUNTIME_ENV: &str = "TERMINAL_VERCEL_RUNTIME";

/// The environment variable that overrides `terminal.vercel_image`.
pub const IMAGE_ENV: &str = "TERMINAL_VERCEL_IMAGE";

/// The environment variable that overrides `terminal.vercel_api_url`.
pub const API_URL_ENV: &str = "TASKBOX_VERCEL_API_URL";

/// A Vercel Sandbox runtime image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// Node.js 24 (the default).
    Node24,
    /// Node.js 22.
    Node22,
    /// Python 3.13.
    Python313,
}

impl Runtime {
    /// Every runtime taskbox accepts, default first.
    pub const ALL: [Runtime; 3] = [Runtime::Node24, Runtime::Node22, Runtime::Python313];

    /// The name the API and the config use.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Node24 => "node24",
            Runtime::Node22 => "node22",
            Runtime::Python313 => "python3.13",
        }
    }

    /// Parses a runtime name (surrounding whitespace ignored).
    pub fn parse(s: &str) -> Option<Runtime> {
        let s = s.trim();
        Runtime::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a fresh sandbox is created from, and so which create endpoint is used. A restore from
/// a snapshot carries neither (the snapshot fixes it) but goes to the same endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SandboxBase {
    /// A container image, created through `POST /v3/sandboxes` (the default).
    Image(String),
    /// A deprecated runtime preset, created through `POST /v2/sandboxes`.
    Runtime(Runtime),
}

impl SandboxBase {
    /// The create endpoint's path, as `doctor` prints it.
    pub fn create_path(&self) -> &'static str {
        match self {
            SandboxBase::Image(_) => "POST /v3/sandboxes",
            SandboxBase::Runtime(_) => "POST /v2/sandboxes",
        }
    }

    /// `image vercel/sandbox/universal` or `runtime node24`.
    pub fn describe(&self) -> String {
        match self {
            SandboxBase::Image(i) => format!("image {i}"),
            SandboxBase::Runtime(r) => format!("runtime {r}"),
        }
    }
}

/// The deprecation note for a set runtime (`doctor` and `config show` print it).
pub fn runtime_deprecation(runtime: Runtime, origin: Origin) -> String {
    let (name, unset) = match origin {
        Origin::Config => (
            "terminal.vercel_runtime",
            "taskbox config set terminal.vercel_runtime none".to_string(),
        ),
        Origin::Env => (RUNTIME_ENV, format!("unset {RUNTIME_ENV}")),
    };
    format!(
        "{name} = {runtime} is deprecated (Vercel's runtimes gave way to images in August 2026) and wins over terminal.vercel_image; to create from an image instead: {unset}"
    )
}

/// Where a setting's value came from (so a message can say which one to change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The config file.
    Config,
    /// An environment variable.
    Env,
}

/// The validated Vercel settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VercelSettings {
    /// What fresh sandboxes are created from (neither is sent when restoring from a snapshot).
    pub base: SandboxBase,
    /// Where `base` came from.
    pub base_origin: Origin,
    /// Create sandboxes with `persistent: true` (`terminal.container_persistent`), so that the
    /// platform snapshots one it stops while no engine watches.
    pub persistent: bool,
    /// vCPUs per sandbox.
    pub vcpus: u32,
    /// Memory per sandbox, MB (always `vcpus * 2048`).
    pub memory_mb: u32,
    /// API base URL without a trailing slash, e.g. `https://vercel.com/api`.
    pub api_url: String,
    /// Where `api_url` came from.
    pub api_url_origin: Origin,
}

/// A config value Vercel Sandbox cannot run with. Each variant knows its fix: [`Self::hint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VercelConfigError {
    /// The runtime is not one Vercel Sandbox offers.
    #[error("{} is `{value}`, which is not a Vercel Sandbox runtime", origin_name(*origin, "terminal.vercel_runtime", RUNTIME_ENV))]
    UnknownRuntime {
        /// The value given.
        value: String,
        /// Config or environment.
        origin: Origin,
    },
    /// The image name is empty or has whitespace.
    #[error("{} is `{value}`, which is not an image name", origin_name(*origin, "terminal.vercel_image", IMAGE_ENV))]
    InvalidImage {
        /// The value given.
        value: String,
        /// Config or environment.
        origin: Origin,
    },
    /// The vCPU count is not 1 or an even number up to [`MAX_VCPUS`].
    #[error("terminal.container_cpu is {cpu} but Vercel Sandbox accepts 1 or an even number of vCPUs up to {MAX_VCPUS}")]
    InvalidCpu {
        /// The value given.
        cpu: u32,
    },
    /// Memory is not 2048 MB per vCPU.
    #[error("terminal.container_memory is {memory} but Vercel Sandbox allocates {MB_PER_VCPU} MB per vCPU: with terminal.container_cpu = {cpu} it must be {expected}")]
    MemoryMismatch {
        /// `terminal.container_cpu`.
        cpu: u32,
        /// `terminal.container_memory` as given.
        memory: u32,
        /// The only valid memory for `cpu`.
        expected: u32,
    },
    /// A disk size is set; Vercel Sandbox has no such knob.
    #[error("terminal.container_disk is {disk} MB, but custom disk sizes are not supported on Vercel Sandbox")]
    DiskUnsupported {
        /// The value given.
        disk: u32,
    },
    /// The API URL is not an http(s) URL.
    #[error("{} is `{value}`, which is not an http:// or https:// URL", origin_name(*origin, "terminal.vercel_api_url", API_URL_ENV))]
    InvalidApiUrl {
        /// The value given.
        value: String,
        /// Config or environment.
        origin: Origin,
    },
}

fn origin_name(origin: Origin, key: &'static str, env: &'static str) -> &'static str {
    match origin {
        Origin::Config => key,
        Origin::Env => env,
    }
}

impl VercelConfigError {
    /// How to fix it, as one line (printed by the CLI after `hint: `).
    pub fn hint(&self) -> String {
        match self {
            VercelConfigError::UnknownRuntime { origin, .. } => {
                let names: Vec<&str> = Runtime::ALL.iter().map(|r| r.as_str()).collect();
                match origin {
                    Origin::Config => format!(
                        "use one of {}: taskbox config set terminal.vercel_runtime node24",
                        names.join(", ")
                    ),
                    Origin::Env => format!(
                        "set {RUNTIME_ENV} to one of {}, or unset it to use terminal.vercel_runtime",
                        names.join(", ")
                    ),
                }
            }
            VercelConfigError::InvalidImage { origin, .. } => match origin {
                Origin::Config => format!(
                    "taskbox config set terminal.vercel_image {}",
                    crate::config::DEFAULT_VERCEL_IMAGE
                ),
                Origin::Env => format!(
                    "set {IMAGE_ENV} to an image such as {}, or unset it",
                    crate::config::DEFAULT_VERCEL_IMAGE
                ),
            },
            VercelConfigError::InvalidCpu { cpu } => {
                let (c, m) = nearest_valid_pair(*cpu);
                format!(
                    "set terminal.container_cpu to {c} and terminal.container_memory to {m} ({MB_PER_VCPU} MB per vCPU)"
                )
            }
            VercelConfigError::MemoryMismatch { cpu, expected, .. } => {
                let (other_cpu, other_mem) = if *cpu == 1 {
                    (2, 2 * MB_PER_VCPU)
                } else {
                    (1, MB_PER_VCPU)
                };
                format!(
                    "set terminal.container_memory to {expected} ({MB_PER_VCPU} MB per vCPU), or pick another valid pair such as cpu {other_cpu} / memory {other_mem}"
                )
            }
            VercelConfigError::DiskUnsupported { .. } => {
                "unset it: taskbox config set terminal.container_disk none".to_string()
            }
            VercelConfigError::InvalidApiUrl { origin, .. } => match origin {
                Origin::Config => {
                    "taskbox config set terminal.vercel_api_url https://vercel.com/api".to_string()
                }
                Origin::Env => {
                    format!("set {API_URL_ENV} to an http(s) URL such as https://vercel.com/api, or unset it")
                }
            },
        }
    }
}

/// The valid (cpu, memory) pair closest to `cpu` (rounding up to even, capped at the maximum).
fn nearest_valid_pair(cpu: u32) -> (u32, u32) {
    let c = match cpu {
        0 | 1 => 1,
        c if c >= MAX_VCPUS => MAX_VCPUS,
        c => c + c % 2,
    };
    (c, c * MB_PER_VCPU)
}

/// Reads a variable, treating an empty value as unset (an `export X=` must not count as set).
pub(crate) fn env_value(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    env(name).filter(|v| !v.trim().is_empty())
}

/// The runtime, from [`RUNTIME_ENV`] if set, else `terminal.vercel_runtime`; `None` when
/// neither is set (the image is used).
pub fn check_runtime(
    t: &TerminalConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(Runtime, Origin)>, VercelConfigError> {
    let (value, origin) = match env_value(env, RUNTIME_ENV) {
        Some(v) => (v, Origin::Env),
        None => match &t.vercel_runtime {
            Some(v) => (v.clone(), Origin::Config),
            None => return Ok(None),
        },
    };
    match Runtime::parse(&value) {
        Some(r) => Ok(Some((r, origin))),
        None => Err(VercelConfigError::UnknownRuntime { value, origin }),
    }
}

/// The image, from [`IMAGE_ENV`] if set, else `terminal.vercel_image`.
pub fn check_image(
    t: &TerminalConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, Origin), VercelConfigError> {
    let (value, origin) = match env_value(env, IMAGE_ENV) {
        Some(v) => (v, Origin::Env),
        None => (t.vercel_image.clone(), Origin::Config),
    };
    let image = value.trim();
    if image.is_empty() || image.chars().any(char::is_whitespace) {
        return Err(VercelConfigError::InvalidImage { value, origin });
    }
    Ok((image.to_string(), origin))
}

/// What fresh sandboxes are created from: a set runtime wins (deprecated), else the image.
pub fn check_base(
    t: &TerminalConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(SandboxBase, Origin), VercelConfigError> {
    match check_runtime(t, env)? {
        Some((runtime, origin)) => Ok((SandboxBase::Runtime(runtime), origin)),
        None => {
            let (image, origin) = check_image(t, env)?;
            Ok((SandboxBase::Image(image), origin))
        }
    }
}

/// The vCPU count and memory, checked against the 2048-MB-per-vCPU rule.
pub fn check_resources(t: &TerminalConfig) -> Result<(u32, u32), VercelConfigError> {
    let cpu = t.container_cpu;
    if cpu == 0 || cpu > MAX_VCPUS || (cpu != 1 && !cpu.is_multiple_of(2)) {
        return Err(VercelConfigError::InvalidCpu { cpu });
    }
    let expected = cpu * MB_PER_VCPU;
    if t.container_memory != expected {
        return Err(VercelConfigError::MemoryMismatch {
            cpu,
            memory: t.container_memory,
            expected,
        });
    }
    Ok((cpu, expected))
}

/// `terminal.container_disk` must be unset.
pub fn check_disk(t: &TerminalConfig) -> Result<(), VercelConfigError> {
    match t.container_disk {
        Some(disk) => Err(VercelConfigError::DiskUnsupported { disk }),
        None => Ok(()),
    }
}

/// The API base URL, from [`API_URL_ENV`] if set, else `terminal.vercel_api_url`.
pub fn check_api_url(
    t: &TerminalConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(String, Origin), VercelConfigError> {
    let (value, origin) = match env_value(env, API_URL_ENV) {
        Some(v) => (v.trim().to_string(), Origin::Env),
        None => (t.vercel_api_url.trim().to_string(), Origin::Config),
    };
    let ok = reqwest::Url::parse(&value)
        .map(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .unwrap_or(false);
    if !ok {
        return Err(VercelConfigError::InvalidApiUrl { value, origin });
    }
    Ok((value.trim_end_matches('/').to_string(), origin))
}

impl VercelSettings {
    /// Validates the Vercel view of `t`; `env` looks up environment variables (injected so that
    /// tests and `taskbox doctor` see exactly the same rules). The first problem found is
    /// returned; `doctor` runs the checks one by one to show them all.
    pub fn from_config(
        t: &TerminalConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<VercelSettings, VercelConfigError> {
        let (base, base_origin) = check_base(t, env)?;
        let (vcpus, memory_mb) = check_resources(t)?;
        check_disk(t)?;
        let (api_url, api_url_origin) = check_api_url(t, env)?;
        Ok(VercelSettings {
            base,
            base_origin,
            persistent: t.container_persistent,
            vcpus,
            memory_mb,
            api_url,
            api_url_origin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_are_the_ones_the_config_table_names() {
        let env = |name| crate::config::Key::find(name).expect("known").env;
        assert_eq!(env("terminal.vercel_runtime"), Some(RUNTIME_ENV));
        assert_eq!(env("terminal.vercel_image"), Some(IMAGE_ENV));
        assert_eq!(env("terminal.vercel_api_url"), Some(API_URL_ENV));
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn nearest_pair_rounds_up_to_even_and_caps() {
        assert_eq!(nearest_valid_pair(0), (1, 2048));
        assert_eq!(nearest_valid_pair(3), (4, 8192));
        assert_eq!(nearest_valid_pair(9), (8, 16384));
        assert_eq!(nearest_valid_pair(16), (8, 16384));
    }

    #[test]
    fn every_valid_cpu_with_matching_memory_passes() {
        for cpu in [1, 2, 4, 6, 8] {
            let t = TerminalConfig {
                container_cpu: cpu,
                container_memory: cpu * 2048,
                ..TerminalConfig::default()
            };
            let s = VercelSettings::from_config(&t, &no_env).expect("valid pair");
            assert_eq!((s.vcpus, s.memory_mb), (cpu, cpu * 2048));
        }
        for cpu in [0, 3, 5, 7, 10] {
            let t = TerminalConfig {
                container_cpu: cpu,
                container_memory: cpu * 2048,
                ..TerminalConfig::default()
            };
            assert_eq!(
                VercelSettings::from_config(&t, &no_env),
                Err(VercelConfigError::InvalidCpu { cpu })
            );
        }
    }
}
