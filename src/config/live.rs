//! Which keys a running server applies from its next request on, and which it reads only as it
//! starts (issue 32 item 13: `config set terminal.timeout 1` changed nothing until a restart).
//!
//! A live key feeds what the engine decides per request or per task — a task's
//! [`TaskSettings`](crate::core::TaskSettings), `terminal.env`, the prices `cost` estimates
//! with — so a server that sees the file change takes it for the next command. Every other key
//! built something the server holds for its whole life (the provider and its sandbox shape, the
//! store, the listeners, its timers), and changes only with a restart: `config set` names those,
//! and the server keeps its value and logs that it waits for one. A key added to the table is a
//! restart key until someone decides it is live here.

use super::Config;

/// The keys a running server applies from its next request on. `terminal.server` is the CLI's
/// own (read by every command), so it needs no restart either.
pub const LIVE_KEYS: &[&str] = &[
    "terminal.timeout",
    "terminal.lifetime_seconds",
    "terminal.sandbox_timeout_seconds",
    "terminal.max_sandbox_lifetime_seconds",
    "terminal.checkpoint_margin_seconds",
    "terminal.keep_snapshots",
    "terminal.keep_checkpoints",
    "terminal.checkpoint",
    "terminal.max_busy_seconds",
    "terminal.env",
    "terminal.server",
    "cost.active_cpu_hour_usd",
    "cost.memory_gb_hour_usd",
    "cost.creations_per_million_usd",
    "cost.transfer_gb_usd",
    "cost.snapshot_gb_month_usd",
];

/// Whether a running server applies `key` without a restart.
pub fn applies_live(key: &str) -> bool {
    LIVE_KEYS.contains(&key)
}

/// What a running server makes of a config file that changed: the config it runs with from
/// now on, and the keys whose change waits for a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// `running` with every live key's value taken from the file.
    pub config: Config,
    /// The keys whose value in the file differs from the running one and that need a restart,
    /// in the table's order.
    pub restart: Vec<&'static str>,
}

/// Takes the live keys' values of `file` over `running`; names the other keys that differ.
pub fn reload(running: &Config, file: &Config) -> Reloaded {
    let mut config = running.clone();
    let (to, from) = (&mut config.terminal, &file.terminal);
    to.timeout = from.timeout;
    to.lifetime_seconds = from.lifetime_seconds;
    to.sandbox_timeout_seconds = from.sandbox_timeout_seconds;
    to.max_sandbox_lifetime_seconds = from.max_sandbox_lifetime_seconds;
    to.checkpoint_margin_seconds = from.checkpoint_margin_seconds;
    to.keep_snapshots = from.keep_snapshots;
    to.keep_checkpoints = from.keep_checkpoints;
    to.checkpoint = from.checkpoint;
    to.max_busy_seconds = from.max_busy_seconds;
    // Compared and copied as values: `config get` shows its values hidden.
    to.env = from.env.clone();
    to.server = from.server;
    config.cost = file.cost.clone();
    let restart = super::KEYS
        .iter()
        .filter(|k| !applies_live(k.name) && k.value(&config) != k.value(file))
        .map(|k| k.name)
        .collect();
    Reloaded { config, restart }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::config::Key;

    /// Each live key, set in the file to a value other than its default, is the running
    /// config's after a reload, and names no restart: the list and the copy agree.
    #[test]
    fn every_live_key_is_taken_from_the_file() {
        for name in LIVE_KEYS {
            let key = Key::find(name).expect("a live key is a config key");
            let value = match *name {
                "terminal.env" => r#"{"LIVE": "value"}"#,
                "terminal.server" => "never",
                n if n.starts_with("cost.") => "0.5",
                _ => "7",
            };
            let mut file = Config::default();
            file.set(name, value).expect("a valid value");
            assert_ne!(file, Config::default(), "{name}");
            let r = reload(&Config::default(), &file);
            assert_eq!(r.config, file, "{name} was not taken from the file");
            assert!(r.restart.is_empty(), "{name}: {:?}", r.restart);
            assert_eq!(key.value(&r.config), key.value(&file));
        }
    }

    #[test]
    fn live_keys_are_taken_and_the_others_named() {
        let running = Config::default();
        let mut file = Config::default();
        file.set("terminal.timeout", "1").expect("valid");
        file.set("terminal.env", r#"{"A": "b"}"#).expect("valid");
        file.set("terminal.container_memory", "4096")
            .expect("valid");
        file.set("terminal.gc_interval_seconds", "60")
            .expect("valid");
        let r = reload(&running, &file);
        assert_eq!(r.config.terminal.timeout, 1);
        assert_eq!(r.config.terminal.env, file.terminal.env);
        assert_eq!(r.config.terminal.container_memory, 5120);
        assert_eq!(r.config.terminal.gc_interval_seconds, 900);
        assert_eq!(
            r.restart,
            ["terminal.container_memory", "terminal.gc_interval_seconds"]
        );
        let same = reload(&r.config, &r.config);
        assert_eq!(same.config, r.config);
        assert!(same.restart.is_empty());
    }
}
