//! The configuration file: Hermes-style `terminal.*` keys in TOML, with typed get/set.
//!
//! `taskbox config set terminal.backend vercel_sandbox` edits `config.toml` under the config
//! dir. Unknown keys and bad values are errors that name the key and the accepted values; the
//! file is rewritten atomically (write to a temporary file, then rename), so a failed `set`
//! never loses what was stored.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::core::{RetryPolicy, TaskSettings};

mod checkpoint;
mod env;
pub mod live;
mod values;

pub use checkpoint::{CheckpointSetting, MAX_CHECKPOINT_SECONDS};
pub use env::{CommandEnv, EnvError, MAX_ENV_BYTES, RESERVED_PREFIX};
pub use values::Usd;
use values::*;

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
    #[error("invalid value `{value}` for `{key}` {source_}: expected {expected}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What is accepted (the bound, and where it comes from).
        expected: String,
        /// Where the value came from.
        source_: ValueSource,
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

impl ConfigError {
    /// How to fix it: where the bad value came from and what the key accepts.
    pub fn hint(&self) -> Option<String> {
        match self {
            ConfigError::UnknownKey { .. } => {
                Some("`taskbox config show` lists every key with its value".to_string())
            }
            ConfigError::InvalidValue { key, source_, .. } => Some(match Key::find(key) {
                Ok(k) => format!("{}; {}: {}", source_.fix(key), k.name, k.doc),
                Err(_) => source_.fix(key),
            }),
            ConfigError::Parse { path, .. } => Some(format!(
                "fix or remove {} (`taskbox config set` rewrites it)",
                path.display()
            )),
            ConfigError::Io { .. } => None,
        }
    }
}

/// Where a configuration value came from, so that an error about it says where to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueSource {
    /// The config file.
    File(PathBuf),
    /// `taskbox config set`.
    Set,
    /// An environment variable.
    Env(&'static str),
    /// A command-line flag (or the server API's field of the same meaning).
    Flag(&'static str),
    /// A [`Config`] built by the program that embeds taskbox (checked when the engine opens).
    Program,
}

impl std::fmt::Display for ValueSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ValueSource::File(p) => write!(f, "in {}", p.display()),
            ValueSource::Set => write!(f, "given to `taskbox config set`"),
            ValueSource::Env(v) => write!(f, "from the environment variable {v}"),
            ValueSource::Flag(flag) => write!(f, "given as {flag}"),
            ValueSource::Program => write!(f, "in the program's Config"),
        }
    }
}

impl ValueSource {
    /// How to fix a bad value of `key` from this source.
    pub fn fix(&self, key: &str) -> String {
        match self {
            ValueSource::File(p) => {
                let (table, field) = key.split_once('.').unwrap_or(("terminal", key));
                format!(
                    "edit `{field}` under [{table}] in {} (or `taskbox config set {key} VALUE`, which checks the value)",
                    p.display()
                )
            }
            ValueSource::Set => format!("`taskbox config set {key} VALUE` with a value in range"),
            ValueSource::Env(v) => format!("set {v} to a value in range, or unset it"),
            ValueSource::Flag(flag) => {
                format!("give {flag} a value in range, or leave it out to use {key}")
            }
            ValueSource::Program => format!("set `{key}` in range before opening the engine"),
        }
    }
}

/// The longest a Vercel sandbox may live, in seconds (5 hours, the Pro and Enterprise plans'
/// cap; Hobby's is 45 minutes, `terminal.max_sandbox_lifetime_seconds`'s default). Every
/// lifetime and timeout key is bounded by it, so no deadline can overflow or outlive the
/// platform.
pub const MAX_SANDBOX_LIFETIME_SECONDS: u64 = 5 * 60 * 60;

/// The most sandbox creations in flight at once (Vercel Pro's cap on concurrent sandboxes).
pub const MAX_CONCURRENT_CREATES: u32 = 2_000;

/// The most complete snapshots kept per task.
pub const MAX_KEEP_SNAPSHOTS: u32 = 1_000;

/// The longest an auto-started server may idle before it exits (30 days).
pub const MAX_SERVER_IDLE_SECONDS: u64 = 30 * 24 * 60 * 60;

/// `terminal.vercel_image`'s default: Vercel's managed universal image (the SDK's default since
/// `@vercel/sandbox` 3.0).
pub const DEFAULT_VERCEL_IMAGE: &str = "vercel/sandbox/universal";

/// The default process limit of an isolated local sandbox (`terminal.container_pids`).
pub const DEFAULT_CONTAINER_PIDS: u32 = 4096;

/// `terminal.local_resolv_conf`'s default: the host's own resolver configuration.
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

/// `terminal.store_reserve_mb`'s default: room for thousands of journal commits and the snapshot
/// of a small workspace once a task filled the disk (see `store::reserve`).
pub const DEFAULT_STORE_RESERVE_MB: u32 = 64;

/// The name of a sandbox backend (`terminal.backend`): 1 to 64 lowercase letters, digits or `_`,
/// starting with a letter. The config checks only the spelling; which names exist is the
/// provider registry's to say (`provider::registry::resolve`, asked where the config becomes a
/// provider, by `taskbox config set` and by `taskbox doctor`), so a new backend needs nothing
/// here.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Backend(String);

impl Backend {
    /// The backend named `name`, if it is spelled as a backend's name is (see [`Backend`]);
    /// otherwise what a name must be.
    pub fn new(name: &str) -> Result<Backend, String> {
        let well_spelled = name.len() <= 64
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if well_spelled {
            Ok(Backend(name.to_string()))
        } else {
            Err(
                "a backend's name: 1 to 64 lowercase letters, digits or `_`, starting with a \
                 letter (a name no backend has is refused with the list of backends)"
                    .to_string(),
            )
        }
    }

    /// The name as written in the config.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Backend {
    /// `local`, the embedded default (the registry's test holds that it is registered).
    fn default() -> Backend {
        Backend("local".to_string())
    }
}

/// `terminal.local_isolation`: how the local backend isolates a sandbox's commands (issue 31).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LocalIsolation {
    /// Commands run as the server's user in the host's namespaces: an opt-out said on purpose,
    /// warned about on every task's first command and marked ✗ by `taskbox doctor`.
    None,
    /// Each sandbox in namespaces of its own (user, mount, PID, network, IPC, UTS, cgroup):
    /// see `provider::local::isolation`. The default.
    #[default]
    Namespaces,
}

impl LocalIsolation {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            LocalIsolation::None => "none",
            LocalIsolation::Namespaces => "namespaces",
        }
    }
}

/// `terminal.local_network`: what an isolated local sandbox's commands can reach on the network
/// (issue 31; only with `terminal.local_isolation = namespaces`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LocalNetwork {
    /// The sandbox's own network namespace with outbound access through `pasta` (a user-mode
    /// network stack), and no route to the host's loopback services; loopback only where
    /// `pasta` is missing.
    #[default]
    Isolated,
    /// The sandbox's own network namespace with its loopback only.
    None,
    /// The host's network namespace (its loopback services included): opt-in, flagged by
    /// `doctor`.
    Host,
}

impl LocalNetwork {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            LocalNetwork::Isolated => "isolated",
            LocalNetwork::None => "none",
            LocalNetwork::Host => "host",
        }
    }
}

/// `terminal.server`: whether the CLI drives tasks through a `taskbox serve` process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ServerMode {
    /// Through the data dir's server, starting one in the background when none answers.
    #[default]
    Auto,
    /// In-process, as a one-shot engine per command (the server is not used).
    Never,
    /// Through the data dir's server; fail when none runs.
    Always,
}

impl ServerMode {
    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerMode::Auto => "auto",
            ServerMode::Never => "never",
            ServerMode::Always => "always",
        }
    }
}

/// The environment variable that overrides `terminal.server`.
pub const SERVER_ENV: &str = "TASKBOX_SERVER";

/// One settable key: its name, its default, what it means, which environment variable
/// overrides it, and how its value is read and checked. [`KEYS`] lists every key; `config get`,
/// `config set`, `config show` and [`Config::validate`] read nothing else, and the
/// [`TerminalConfig`] fields and their defaults are generated from the same list.
#[derive(Debug)]
pub struct Key {
    /// The full name, such as `terminal.backend`.
    pub name: &'static str,
    /// One line: what it means and what it accepts.
    pub doc: &'static str,
    /// The environment variable that overrides the file's value where the key is used.
    pub env: Option<&'static str>,
    /// The value as text.
    get: fn(&Config) -> String,
    /// Parses and stores a value, or says what is accepted.
    set: fn(&mut Config, &str) -> Result<(), String>,
}

impl Key {
    /// The key named `name`.
    pub fn find(name: &str) -> Result<&'static Key, ConfigError> {
        KEYS.iter()
            .find(|k| k.name == name)
            .ok_or_else(|| ConfigError::UnknownKey { key: name.into() })
    }

    /// The key's value in `config`, as `config get` prints it.
    pub fn value(&self, config: &Config) -> String {
        (self.get)(config)
    }

    /// The built-in default, as `config get` prints it.
    pub fn default_value(&self) -> String {
        (self.get)(&Config::default())
    }

    fn invalid(&self, value: &str, expected: String, source: ValueSource) -> ConfigError {
        ConfigError::InvalidValue {
            key: self.name.into(),
            // A URL's password never reaches an error, nor a value of a secret key.
            value: if SECRET_KEYS.contains(&self.name) {
                "(hidden)".to_string()
            } else {
                crate::redact::redact(value)
            },
            expected,
            source_: source,
        }
    }
}

/// The keys whose values are secrets: `config get` and errors show them hidden.
const SECRET_KEYS: &[&str] = &["terminal.env"];

/// Generates each table's struct ([`TerminalConfig`], [`CostConfig`]: a field per key,
/// documented by the key's line), its `Default` and [`KEYS`] from one list, so that a key cannot
/// be added in one place and forgotten in another. A table is `[section] Struct { entries }`;
/// an entry is `field: Type = default, parse PARSER, env ENV, "doc";`, where `PARSER` turns text
/// into the value or says what is accepted.
macro_rules! config_keys {
    ($(
        [$section:ident] $table:ident, $table_doc:literal {
            $(
                $field:ident: $ty:ty = $default:expr, parse $parse:expr, env $env:expr, $doc:literal;
            )*
        }
    )*) => {
        $(
            #[doc = $table_doc]
            #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
            #[serde(default, deny_unknown_fields)]
            pub struct $table {
                $(
                    #[doc = concat!("`", stringify!($section), ".", stringify!($field), "`: ", $doc, ".")]
                    pub $field: $ty,
                )*
            }

            impl Default for $table {
                fn default() -> Self {
                    $table {
                        $($field: $default,)*
                    }
                }
            }
        )*

        /// Every settable key, in the order `config show` prints them.
        pub const KEYS: &[Key] = &[$($(
            Key {
                name: concat!(stringify!($section), ".", stringify!($field)),
                doc: $doc,
                env: $env,
                get: |c| Render::render(&c.$section.$field),
                set: |c, text| {
                    c.$section.$field = ($parse)(text)?;
                    Ok(())
                },
            },
        )*)*];
    };
}

config_keys! {
[terminal] TerminalConfig, "The `[terminal]` table: Hermes's keys (see [`KEYS`])." {
    backend: Backend = Backend::default(), parse backend, env None,
        "sandbox backend: local (the default) or another the registry has; `taskbox doctor` lists them";
    local_isolation: LocalIsolation = LocalIsolation::Namespaces, parse local_isolation, env None,
        "local backend isolation: namespaces (the default: each sandbox in its own user, mount, PID and network namespaces) | none (unisolated, on purpose: warned on every task's first command)";
    container_persistent: bool = true, parse boolean, env None,
        "keep files in snapshots across sandboxes: true | false";
    local_network: LocalNetwork = LocalNetwork::Isolated, parse local_network, env None,
        "an isolated local sandbox's network: isolated (its own, outbound through pasta, no route to the host's loopback) | none (loopback only) | host (the host's, flagged by doctor)";
    local_pasta: String = "pasta".into(), parse pasta_program, env None,
        "the pasta program giving local_network = isolated its outbound access: a name looked up on PATH or an absolute path (where it is missing, the sandbox has loopback only)";
    local_resolv_conf: String = DEFAULT_RESOLV_CONF.into(), parse resolv_conf, env None,
        "the resolver configuration a local_network = isolated sandbox sees as /etc/resolv.conf: an absolute path (a resolver on the host's loopback is relayed to it)";
    timeout: u64 = 180, parse |v| lifetime(v, 1), env None,
        "per-command timeout, seconds (1 to 18000, Vercel's maximum sandbox lifetime)";
    lifetime_seconds: u64 = 300, parse |v| lifetime(v, 1), env None,
        "idle seconds before a sandbox is snapshotted and stopped (1 to 18000)";
    sandbox_timeout_seconds: u64 = 300, parse |v| lifetime(v, 1), env None,
        "a sandbox's platform lifetime at creation, seconds (1 to 18000)";
    max_sandbox_lifetime_seconds: u64 = 2_700, parse |v| lifetime(v, 1), env None,
        "the plan's cap on a sandbox's total lifetime, seconds (1 to 18000)";
    max_busy_seconds: u64 = 3_600, parse |v| lifetime(v, 0), env None,
        "how long after the last command a sandbox whose processes keep working (CPU or IO) is kept from its idle snapshot, seconds (0 to 18000; 0: idle counts from the last command only)";
    checkpoint_margin_seconds: u64 = 30, parse |v| lifetime(v, 0), env None,
        "seconds before the deadline to checkpoint (0 to 18000)";
    keep_snapshots: u32 = 2, parse |v| between_u32(v, 1, MAX_KEEP_SNAPSHOTS), env None,
        "complete snapshots kept per task (1 to 1000)";
    checkpoint: CheckpointSetting = CheckpointSetting::Off, parse checkpoint::parse, env None,
        "checkpoints taken by themselves: off | every_command (after each command; one that changed no file costs no snapshot) | a number of seconds (after a command ending that long after the latest snapshot); on a backend whose snapshot stops the sandbox (Vercel) none are taken";
    keep_checkpoints: u32 = 20, parse |v| between_u32(v, 0, MAX_KEEP_SNAPSHOTS), env None,
        "complete checkpoints kept per task, counted apart from keep_snapshots so they never push a suspend's snapshot out (1 to 1000; 0: counted with keep_snapshots, as before checkpoints existed)";
    max_concurrent_creates: u32 = 8, parse |v| between_u32(v, 1, MAX_CONCURRENT_CREATES),
        env None, "sandbox creations in flight at once (1 to 2000)";
    vercel_image: String = DEFAULT_VERCEL_IMAGE.into(), parse image,
        env Some("TERMINAL_VERCEL_IMAGE"),
        "image for new Vercel sandboxes (created through POST /v3/sandboxes), e.g. vercel/sandbox/universal";
    vercel_runtime: Option<String> = None, parse runtime, env Some("TERMINAL_VERCEL_RUNTIME"),
        "deprecated legacy runtime (node24 | node22 | python3.13, through POST /v2/sandboxes); when set it wins over vercel_image; `none` unsets";
    container_cpu: u32 = 1, parse |v| between_u32(v, 1, 8), env None,
        "vCPUs: 1 or an even number up to 8";
    container_memory: u32 = 5120, parse |v| between_u32(v, 1, 16_384), env None,
        "memory in MB (Vercel: 2048 per vCPU)";
    container_pids: u32 = DEFAULT_CONTAINER_PIDS, parse |v| between_u32(v, 16, 1_000_000),
        env None, "processes and threads of an isolated local sandbox (16 to 1000000)";
    container_disk: Option<u32> = None, parse disk, env None,
        "disk in MB (unsupported on Vercel: leave unset; `none` unsets)";
    store_reserve_mb: u32 = DEFAULT_STORE_RESERVE_MB, parse |v| between_u32(v, 0, 65_536),
        env None,
        "MB of the data dir's disk kept for the store (journal, snapshots) and given back when a task fills the disk (0 to 65536; 0: none)";
    vercel_api_url: String = "https://vercel.com/api".into(), parse http_url,
        env Some("TASKBOX_VERCEL_API_URL"), "Vercel API base URL";
    server: ServerMode = ServerMode::Auto, parse server_mode, env Some(SERVER_ENV),
        "run commands through a taskbox server: auto | never | always";
    server_idle_exit_seconds: u64 = 600, parse |v| between(v, 1, MAX_SERVER_IDLE_SECONDS, ""),
        env None,
        "seconds an auto-started server stays idle, with no live sandbox, before it exits";
    gc_interval_seconds: u64 = 900, parse |v| between(v, 1, MAX_SERVER_IDLE_SECONDS, ""),
        env None,
        "seconds between the server's gc runs (orphaned sandboxes, unretained snapshots; 1 to 30 days)";
    store: StoreSetting = StoreSetting::default(), parse store_setting, env Some(STORE_ENV),
        "where tasks are stored: sqlite (the data dir's file) | postgres://user@host/database (a fleet's shared store)";
    lease_seconds: u64 = 15, parse |v| between(v, 1, 3_600, ""), env None,
        "a fleet server's lease on a task it drives (PostgreSQL store), seconds; renewed every third of it, taken over by another server once it expires (1 to 3600)";
    env: CommandEnv = CommandEnv::new(), parse command_env, env None,
        "variables every command gets (a `[terminal.env]` table in the file; for config set a JSON object {\"NAME\": \"value\"}, or none); a name is letters, digits and _, not starting with a digit, and not TASKBOX_*; values are secrets, shown hidden and never journaled";
}

[cost] CostConfig, "The `[cost]` table: the list prices `taskbox cost` estimates with (USD; defaults are Vercel's published Pro prices)." {
    active_cpu_hour_usd: Usd = Usd::new(0.128), parse price, env None,
        "USD per hour of active CPU (Vercel list price 0.128)";
    memory_gb_hour_usd: Usd = Usd::new(0.0212), parse price, env None,
        "USD per GB-hour of provisioned memory (Vercel list price 0.0212)";
    creations_per_million_usd: Usd = Usd::new(0.60), parse price, env None,
        "USD per million sandbox creations (Vercel list price 0.60)";
    transfer_gb_usd: Usd = Usd::new(0.15), parse price, env None,
        "USD per GB of network transfer (Vercel list price 0.15)";
    snapshot_gb_month_usd: Usd = Usd::new(0.08), parse price, env None,
        "USD per GB-month of snapshot storage (Vercel list price 0.08)";
}
}

/// The environment variable that overrides `terminal.store` (a password is better kept here or
/// in a 0600 config file than on a command line).
pub const STORE_ENV: &str = "TASKBOX_STORE";

/// `terminal.store`: the data dir's SQLite file (the default), or a PostgreSQL URL. Shown only
/// with any password replaced (`Debug`, `config get`/`show`, errors).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoreSetting(Option<String>);

impl StoreSetting {
    /// The PostgreSQL URL, or `None` for the SQLite file.
    pub fn url(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// A PostgreSQL store at `url`.
    pub fn postgres(url: impl Into<String>) -> StoreSetting {
        StoreSetting(Some(url.into()))
    }
}

impl std::fmt::Debug for StoreSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render())
    }
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `terminal.*` keys.
    pub terminal: TerminalConfig,
    /// `cost.*` keys.
    pub cost: CostConfig,
}

impl Config {
    /// Loads `path`, or the defaults when it does not exist. A value `set` would refuse makes
    /// the file invalid.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let config = Config::load_unchecked(path)?;
        config.validate(ValueSource::File(path.to_path_buf()))?;
        Ok(config)
    }

    /// Loads `path` (or the defaults) without checking the values' bounds, for `taskbox config
    /// set` to repair a file [`Config::load`] refuses. Anything else must use `load`.
    pub fn load_unchecked(path: &Path) -> Result<Config, ConfigError> {
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
        Ok(Key::find(key)?.value(self))
    }

    /// Sets `key` from text, checking the value's type and range. Backend-specific rules (the
    /// Vercel memory/cpu pairing) are checked when the backend is used and by `taskbox doctor`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        self.set_from(key, value, ValueSource::Set)
    }

    /// Sets `key` from text given by `source` (a flag, say), checked as `set` does.
    pub fn set_from(
        &mut self,
        key: &str,
        value: &str,
        source: ValueSource,
    ) -> Result<(), ConfigError> {
        let k = Key::find(key)?;
        (k.set)(self, value).map_err(|expected| k.invalid(value, expected, source))
    }

    /// Checks every value as `set` would: a file edited by hand (or a config built in code)
    /// gets the same checks, from the same table, as `taskbox config set`. `source` is where the
    /// values came from, for the error.
    pub fn validate(&self, source: ValueSource) -> Result<(), ConfigError> {
        let mut scratch = self.clone();
        for k in KEYS {
            let value = (k.get)(self);
            (k.set)(&mut scratch, &value)
                .map_err(|expected| k.invalid(&value, expected, source.clone()))?;
        }
        Ok(())
    }

    /// Checks a value given as `flag` (such as `run --timeout`) for `key` against the key's
    /// bounds, as if it were set in the config: the same table decides.
    pub fn check_flag(key: &str, flag: &'static str, value: u64) -> Result<(), ConfigError> {
        let k = Key::find(key)?;
        let text = value.to_string();
        (k.set)(&mut Config::default(), &text)
            .map_err(|expected| k.invalid(&text, expected, ValueSource::Flag(flag)))
    }

    /// `terminal.server`, unless `TASKBOX_SERVER` (read through `env`; blank counts as unset)
    /// overrides it.
    pub fn server_mode(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ServerMode, ConfigError> {
        match env(SERVER_ENV).filter(|v| !v.trim().is_empty()) {
            None => Ok(self.terminal.server),
            Some(v) => server_mode(&v).map_err(|expected| ConfigError::InvalidValue {
                key: "terminal.server".into(),
                value: v,
                expected,
                source_: ValueSource::Env(SERVER_ENV),
            }),
        }
    }

    /// The list prices `taskbox cost` estimates with.
    pub fn prices(&self) -> crate::core::ledger::Prices {
        let c = &self.cost;
        crate::core::ledger::Prices {
            active_cpu_hour: c.active_cpu_hour_usd.get(),
            memory_gb_hour: c.memory_gb_hour_usd.get(),
            creations_per_million: c.creations_per_million_usd.get(),
            transfer_gb: c.transfer_gb_usd.get(),
            snapshot_gb_month: c.snapshot_gb_month_usd.get(),
        }
    }

    /// `terminal.store`, unless `TASKBOX_STORE` (read through `env`; blank counts as unset)
    /// overrides it.
    pub fn store(&self, env: impl Fn(&str) -> Option<String>) -> Result<StoreSetting, ConfigError> {
        match env(STORE_ENV).filter(|v| !v.trim().is_empty()) {
            None => Ok(self.terminal.store.clone()),
            Some(v) => store_setting(&v).map_err(|expected| ConfigError::InvalidValue {
                key: "terminal.store".into(),
                value: crate::redact::redact(&v),
                expected,
                source_: ValueSource::Env(STORE_ENV),
            }),
        }
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
            max_busy_ms: t.max_busy_seconds.saturating_mul(1000),
            retry: RetryPolicy::default(),
            // Providers' properties, not the config's: the engine sets them.
            late_checkpoint: false,
            reports_usage: false,
            live_checkpoint: false,
            record_kinds: false,
            checkpoint: t.checkpoint.to_core(),
            keep_checkpoints: t.keep_checkpoints,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_is_a_well_spelled_name_and_which_exist_is_not_the_configs_to_say() {
        for name in ["local", "vercel_sandbox", "docker", "e2b"] {
            assert_eq!(
                backend(&format!(" {name} ")).map(|b| b.0),
                Ok(name.to_string())
            );
        }
        for bad in ["", "Local", "9lives", "dock er", "a-b", &"x".repeat(65)] {
            let err = backend(bad).expect_err(bad);
            assert!(err.contains("lowercase letters"), "{bad}: {err}");
        }
        assert_eq!(Backend::default().as_str(), "local");
    }

    #[test]
    fn every_key_reads_back_what_it_stores() {
        let mut cfg = Config::default();
        for k in KEYS {
            let default = k.default_value();
            cfg.set(k.name, &default)
                .expect("a default is a valid value");
            assert_eq!(
                cfg.get(k.name).expect("a listed key"),
                default,
                "{}",
                k.name
            );
        }
        assert_eq!(cfg, Config::default());
        cfg.set("terminal.container_disk", "4096").expect("valid");
        assert_eq!(cfg.terminal.container_disk, Some(4096));
        cfg.set("terminal.vercel_api_url", "http://127.0.0.1:9/")
            .expect("valid");
        assert_eq!(
            cfg.get("terminal.vercel_api_url").expect("known"),
            "http://127.0.0.1:9"
        );
        assert!(matches!(
            cfg.set("terminal.keep_snapshots", "0"),
            Err(ConfigError::InvalidValue { expected, .. }) if expected == "a whole number from 1 to 1000"
        ));
        assert!(matches!(
            cfg.get("terminal.nope"),
            Err(ConfigError::UnknownKey { .. })
        ));
    }

    #[test]
    fn a_file_gets_the_checks_set_makes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("config.toml");
        std::fs::write(&path, "[terminal]\nkeep_snapshots = 0\n").expect("write");
        let err = Config::load(&path).expect_err("keep_snapshots must be at least 1");
        assert!(err.to_string().contains("terminal.keep_snapshots"), "{err}");
        std::fs::write(&path, "[terminal]\nkeep_snapshots = 3\n").expect("write");
        assert_eq!(
            Config::load(&path).expect("valid").terminal.keep_snapshots,
            3
        );
    }

    #[test]
    fn the_docs_list_every_key_with_its_default_and_variable() {
        let doc = include_str!("../../docs/configuration.md");
        for k in KEYS {
            let row = doc
                .lines()
                .find(|l| l.starts_with(&format!("| `{}` |", k.name)))
                .unwrap_or_else(|| panic!("docs/configuration.md's table lacks {}", k.name));
            let default = match k.default_value().as_str() {
                "none" => "unset".to_string(),
                d => format!("`{d}`"),
            };
            assert!(
                row.starts_with(&format!("| `{}` | {default} |", k.name)),
                "docs/configuration.md's default for {} is not {default}: {row}",
                k.name
            );
            if let Some(env) = k.env {
                assert!(
                    row.contains(env),
                    "docs/configuration.md does not name {env}: {row}"
                );
            }
        }
    }
}
