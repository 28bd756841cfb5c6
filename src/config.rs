//! The configuration file: Hermes-style `terminal.*` keys in TOML, with typed get/set.
//!
//! `taskbox config set terminal.backend vercel_sandbox` edits `config.toml` under the config
//! dir. Unknown keys and bad values are errors that name the key and the accepted values; the
//! file is rewritten atomically (write to a temporary file, then rename), so a failed `set`
//! never loses what was stored.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::core::{RetryPolicy, TaskSettings};

/// A configuration problem, naming the key and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The key is not one of [`KEYS`].
    #[error("unknown config key `{key}`")]
    UnknownKey {
        /// The key given.
        key: String,
    },
    /// The value does not parse or is out of range.
    #[error("invalid value `{value}` for `{key}`: {expected}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: String,
    },
    /// The file could not be read or written.
    #[error("cannot {action} config file {path}")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path} is not valid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

/// The sandbox backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Real processes in per-sandbox workspaces under the data dir (the embedded default).
    #[default]
    Local,
    /// Vercel Sandbox microVMs over the v2 REST API.
    VercelSandbox,
}

impl Backend {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::VercelSandbox => "vercel_sandbox",
        }
    }
}

/// The `[terminal]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TerminalConfig {
    /// `local` or `vercel_sandbox`.
    pub backend: Backend,
    /// Keep files in snapshots across sandboxes.
    pub container_persistent: bool,
    /// Per-command timeout, seconds.
    pub timeout: u64,
    /// Idle time before a sandbox is snapshotted and stopped, seconds.
    pub lifetime_seconds: u64,
    /// A sandbox's platform lifetime at creation, seconds.
    pub sandbox_timeout_seconds: u64,
    /// The plan's cap on a sandbox's total lifetime (extensions stop there), seconds.
    pub max_sandbox_lifetime_seconds: u64,
    /// How long before the deadline a checkpoint is taken, seconds.
    pub checkpoint_margin_seconds: u64,
    /// Complete snapshots kept per task.
    pub keep_snapshots: u32,
    /// Sandbox creations in flight at once.
    pub max_concurrent_creates: u32,
    /// Vercel runtime: `node24`, `node22` or `python3.13`.
    pub vercel_runtime: String,
    /// vCPUs.
    pub container_cpu: u32,
    /// Memory, MB (Vercel: must be 2048 × cpu).
    pub container_memory: u32,
    /// Disk, MB (unsupported on Vercel: leave unset).
    pub container_disk: Option<u32>,
    /// Vercel API base URL.
    pub vercel_api_url: String,
}

impl Default for TerminalConfig {
    fn default() -> Self {
        TerminalConfig {
            backend: Backend::Local,
            container_persistent: true,
            timeout: 180,
            lifetime_seconds: 300,
            sandbox_timeout_seconds: 300,
            max_sandbox_lifetime_seconds: 2_700,
            checkpoint_margin_seconds: 30,
            keep_snapshots: 2,
            max_concurrent_creates: 8,
            vercel_runtime: "node24".into(),
            container_cpu: 1,
            container_memory: 5120,
            container_disk: None,
            vercel_api_url: "https://vercel.com/api".into(),
        }
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `terminal.*` keys.
    pub terminal: TerminalConfig,
}

/// Every settable key, with a one-line description.
pub const KEYS: &[(&str, &str)] = &[
    (
        "terminal.backend",
        "sandbox backend: local | vercel_sandbox",
    ),
    (
        "terminal.container_persistent",
        "keep files in snapshots across sandboxes: true | false",
    ),
    ("terminal.timeout", "per-command timeout, seconds"),
    (
        "terminal.lifetime_seconds",
        "idle seconds before a sandbox is snapshotted and stopped",
    ),
    (
        "terminal.sandbox_timeout_seconds",
        "a sandbox's platform lifetime at creation, seconds",
    ),
    (
        "terminal.max_sandbox_lifetime_seconds",
        "the plan's cap on a sandbox's total lifetime, seconds",
    ),
    (
        "terminal.checkpoint_margin_seconds",
        "seconds before the deadline to checkpoint",
    ),
    (
        "terminal.keep_snapshots",
        "complete snapshots kept per task (>= 1)",
    ),
    (
        "terminal.max_concurrent_creates",
        "sandbox creations in flight at once (>= 1)",
    ),
    ("terminal.vercel_runtime", "node24 | node22 | python3.13"),
    (
        "terminal.container_cpu",
        "vCPUs: 1 or an even number up to 8",
    ),
    (
        "terminal.container_memory",
        "memory in MB (Vercel: 2048 per vCPU)",
    ),
    (
        "terminal.container_disk",
        "disk in MB (unsupported on Vercel: leave unset; `none` unsets)",
    ),
    ("terminal.vercel_api_url", "Vercel API base URL"),
];

fn parse_u64(key: &str, value: &str, min: u64) -> Result<u64, ConfigError> {
    match value.trim().parse::<u64>() {
        Ok(v) if v >= min => Ok(v),
        _ => Err(ConfigError::InvalidValue {
            key: key.into(),
            value: value.into(),
            expected: format!("a whole number >= {min}"),
        }),
    }
}

fn parse_u32(key: &str, value: &str, min: u32) -> Result<u32, ConfigError> {
    let v = parse_u64(key, value, u64::from(min))?;
    u32::try_from(v).map_err(|_| ConfigError::InvalidValue {
        key: key.into(),
        value: value.into(),
        expected: format!("a whole number between {min} and {}", u32::MAX),
    })
}

impl Config {
    /// Loads `path`, or the defaults when it does not exist.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.message().to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Config::default()),
            Err(source) => Err(ConfigError::Io {
                action: "read",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Writes the config atomically (temporary file + rename).
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let io = |source| ConfigError::Io {
            action: "write",
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let text = toml::to_string_pretty(self).expect("config always serializes to TOML");
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, text).map_err(io)?;
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// The value of `key` as text.
    pub fn get(&self, key: &str) -> Result<String, ConfigError> {
        let t = &self.terminal;
        Ok(match key {
            "terminal.backend" => t.backend.as_str().to_string(),
            "terminal.container_persistent" => t.container_persistent.to_string(),
            "terminal.timeout" => t.timeout.to_string(),
            "terminal.lifetime_seconds" => t.lifetime_seconds.to_string(),
            "terminal.sandbox_timeout_seconds" => t.sandbox_timeout_seconds.to_string(),
            "terminal.max_sandbox_lifetime_seconds" => t.max_sandbox_lifetime_seconds.to_string(),
            "terminal.checkpoint_margin_seconds" => t.checkpoint_margin_seconds.to_string(),
            "terminal.keep_snapshots" => t.keep_snapshots.to_string(),
            "terminal.max_concurrent_creates" => t.max_concurrent_creates.to_string(),
            "terminal.vercel_runtime" => t.vercel_runtime.clone(),
            "terminal.container_cpu" => t.container_cpu.to_string(),
            "terminal.container_memory" => t.container_memory.to_string(),
            "terminal.container_disk" => t
                .container_disk
                .map(|d| d.to_string())
                .unwrap_or_else(|| "none".into()),
            "terminal.vercel_api_url" => t.vercel_api_url.clone(),
            _ => return Err(ConfigError::UnknownKey { key: key.into() }),
        })
    }

    /// Sets `key` from text, checking the value's type and range. Backend-specific rules (the
    /// Vercel memory/cpu pairing) are checked when the backend is used and by `taskbox doctor`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let t = &mut self.terminal;
        let invalid = |expected: &str| ConfigError::InvalidValue {
            key: key.into(),
            value: value.into(),
            expected: expected.into(),
        };
        match key {
            "terminal.backend" => {
                t.backend = match value.trim() {
                    "local" => Backend::Local,
                    "vercel_sandbox" | "vercel" => Backend::VercelSandbox,
                    _ => return Err(invalid("one of: local, vercel_sandbox")),
                }
            }
            "terminal.container_persistent" => {
                t.container_persistent = match value.trim() {
                    "true" | "yes" | "on" | "1" => true,
                    "false" | "no" | "off" | "0" => false,
                    _ => return Err(invalid("true or false")),
                }
            }
            "terminal.timeout" => t.timeout = parse_u64(key, value, 1)?,
            "terminal.lifetime_seconds" => t.lifetime_seconds = parse_u64(key, value, 1)?,
            "terminal.sandbox_timeout_seconds" => {
                t.sandbox_timeout_seconds = parse_u64(key, value, 1)?
            }
            "terminal.max_sandbox_lifetime_seconds" => {
                t.max_sandbox_lifetime_seconds = parse_u64(key, value, 1)?
            }
            "terminal.checkpoint_margin_seconds" => {
                t.checkpoint_margin_seconds = parse_u64(key, value, 0)?
            }
            "terminal.keep_snapshots" => t.keep_snapshots = parse_u32(key, value, 1)?,
            "terminal.max_concurrent_creates" => {
                t.max_concurrent_creates = parse_u32(key, value, 1)?
            }
            "terminal.vercel_runtime" => {
                let v = value.trim();
                if v.is_empty() {
                    return Err(invalid("one of: node24, node22, python3.13"));
                }
                t.vercel_runtime = v.to_string()
            }
            "terminal.container_cpu" => t.container_cpu = parse_u32(key, value, 1)?,
            "terminal.container_memory" => t.container_memory = parse_u32(key, value, 1)?,
            "terminal.container_disk" => {
                t.container_disk = match value.trim() {
                    "" | "none" | "unset" => None,
                    v => Some(parse_u32(key, v, 1)?),
                }
            }
            "terminal.vercel_api_url" => {
                let v = value.trim();
                if !(v.starts_with("http://") || v.starts_with("https://")) {
                    return Err(invalid("an http:// or https:// URL"));
                }
                t.vercel_api_url = v.trim_end_matches('/').to_string()
            }
            _ => return Err(ConfigError::UnknownKey { key: key.into() }),
        }
        Ok(())
    }

    /// The lifecycle settings a task runs with under this config.
    pub fn task_settings(&self) -> TaskSettings {
        let t = &self.terminal;
        TaskSettings {
            persistent: t.container_persistent,
            sandbox_timeout_ms: t.sandbox_timeout_seconds.saturating_mul(1000),
            idle_lifetime_ms: t.lifetime_seconds.saturating_mul(1000),
            command_timeout_ms: t.timeout.saturating_mul(1000),
            keep_snapshots: t.keep_snapshots.max(1),
            checkpoint_margin_ms: t.checkpoint_margin_seconds.saturating_mul(1000),
            max_sandbox_lifetime_ms: t
                .max_sandbox_lifetime_seconds
                .max(t.sandbox_timeout_seconds)
                .saturating_mul(1000),
            retry: RetryPolicy::default(),
        }
    }
}
