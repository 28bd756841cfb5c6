//! The values behind the keys: `Usd`, how each value is printed (`Render`) and parsed back.
//! The key table in `config/mod.rs` names one parser and one renderer per key.

use serde::{Deserialize, Serialize};

use super::{
    Backend, CommandEnv, LocalIsolation, LocalNetwork, ServerMode, StoreSetting,
    DEFAULT_VERCEL_IMAGE, MAX_SANDBOX_LIFETIME_SECONDS,
};

/// A price in USD: a finite, non-negative number (compared by its bits, so that configs compare
/// as equal exactly when they read the same).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Usd(pub(super) f64);

impl Usd {
    /// `v`, which must be finite and not negative (the defaults are).
    pub const fn new(v: f64) -> Usd {
        Usd(v)
    }

    /// The amount.
    pub fn get(self) -> f64 {
        self.0
    }
}

impl PartialEq for Usd {
    fn eq(&self, other: &Usd) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Usd {}

impl From<Usd> for f64 {
    fn from(u: Usd) -> f64 {
        u.0
    }
}

impl TryFrom<f64> for Usd {
    type Error = String;
    fn try_from(v: f64) -> Result<Usd, String> {
        price(&v.to_string())
    }
}

/// A value as `config get` prints it (and as its parser reads it back).
pub(super) trait Render {
    fn render(&self) -> String;
}

impl Render for Backend {
    fn render(&self) -> String {
        self.as_str().to_string()
    }
}

impl Render for LocalIsolation {
    fn render(&self) -> String {
        self.as_str().to_string()
    }
}

impl Render for LocalNetwork {
    fn render(&self) -> String {
        self.as_str().to_string()
    }
}

impl Render for ServerMode {
    fn render(&self) -> String {
        self.as_str().to_string()
    }
}

impl Render for super::CheckpointSetting {
    fn render(&self) -> String {
        super::CheckpointSetting::render(*self)
    }
}

impl Render for bool {
    fn render(&self) -> String {
        self.to_string()
    }
}

impl Render for u64 {
    fn render(&self) -> String {
        self.to_string()
    }
}

impl Render for u32 {
    fn render(&self) -> String {
        self.to_string()
    }
}

impl Render for String {
    fn render(&self) -> String {
        self.clone()
    }
}

impl Render for StoreSetting {
    fn render(&self) -> String {
        match &self.0 {
            None => "sqlite".to_string(),
            Some(url) => crate::redact::redact(url),
        }
    }
}

impl Render for Option<String> {
    fn render(&self) -> String {
        self.clone().unwrap_or_else(|| "none".into())
    }
}

impl Render for Usd {
    fn render(&self) -> String {
        self.0.to_string()
    }
}

impl Render for Option<u32> {
    fn render(&self) -> String {
        self.map(|d| d.to_string()).unwrap_or_else(|| "none".into())
    }
}

impl Render for CommandEnv {
    /// The names, each value hidden (a secret): `{"NAME":"(hidden)"}`, or `none`.
    fn render(&self) -> String {
        if self.is_empty() {
            return "none".into();
        }
        let hidden: std::collections::BTreeMap<&str, &str> =
            self.names().map(|n| (n, "(hidden)")).collect();
        serde_json::to_string(&hidden).expect("a map of strings serializes")
    }
}

// The parsers: text to a value, or what is accepted instead.

/// `none` (or nothing) for no variables, else a JSON object of names to string values.
pub(super) fn command_env(value: &str) -> Result<CommandEnv, String> {
    let expected = r#"a JSON object of variables, {"NAME": "value", ...}, or none"#;
    match value.trim() {
        "" | "none" => Ok(CommandEnv::new()),
        v => {
            let map: std::collections::BTreeMap<String, String> =
                serde_json::from_str(v).map_err(|_| expected.to_string())?;
            CommandEnv::try_from(map).map_err(|e| format!("{expected} ({e})"))
        }
    }
}

pub(super) fn backend(value: &str) -> Result<Backend, String> {
    Backend::new(value.trim())
}

pub(super) fn local_isolation(value: &str) -> Result<LocalIsolation, String> {
    match value.trim() {
        "none" => Ok(LocalIsolation::None),
        "namespaces" => Ok(LocalIsolation::Namespaces),
        _ => Err("one of: none, namespaces".into()),
    }
}

pub(super) fn local_network(value: &str) -> Result<LocalNetwork, String> {
    match value.trim() {
        "isolated" => Ok(LocalNetwork::Isolated),
        "none" => Ok(LocalNetwork::None),
        "host" => Ok(LocalNetwork::Host),
        _ => Err("one of: isolated, none, host".into()),
    }
}

pub(super) fn pasta_program(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.is_empty() || v.contains('\0') {
        return Err("a program name (looked up on PATH, e.g. pasta) or an absolute path".into());
    }
    if v.contains('/') && !v.starts_with('/') {
        return Err(format!(
            "an absolute path (such as /usr/bin/pasta) or a bare name looked up on PATH, not the relative path {v:?}"
        ));
    }
    Ok(v.to_string())
}

pub(super) fn resolv_conf(value: &str) -> Result<String, String> {
    let v = value.trim();
    if !v.starts_with('/') || v.contains('\0') {
        return Err(format!(
            "an absolute path to a resolv.conf (such as /etc/resolv.conf), not {v:?}"
        ));
    }
    Ok(v.to_string())
}

pub(super) fn store_setting(value: &str) -> Result<StoreSetting, String> {
    let v = value.trim();
    let lower = v.get(..13).unwrap_or(v).to_ascii_lowercase();
    if v == "sqlite" || v.is_empty() {
        Ok(StoreSetting(None))
    } else if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        Ok(StoreSetting(Some(v.to_string())))
    } else {
        Err("sqlite, or a PostgreSQL URL postgres://user@host/database".into())
    }
}

pub(super) fn server_mode(value: &str) -> Result<ServerMode, String> {
    match value.trim() {
        "auto" => Ok(ServerMode::Auto),
        "never" => Ok(ServerMode::Never),
        "always" => Ok(ServerMode::Always),
        _ => Err("one of: auto, never, always".into()),
    }
}

pub(super) fn boolean(value: &str) -> Result<bool, String> {
    match value.trim() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err("true or false".into()),
    }
}

pub(super) fn between(value: &str, min: u64, max: u64, why: &str) -> Result<u64, String> {
    match value.trim().parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(format!("a whole number from {min} to {max}{why}")),
    }
}

/// A number of seconds a sandbox or command may last: at most the platform's lifetime.
pub(super) fn lifetime(value: &str, min: u64) -> Result<u64, String> {
    between(
        value,
        min,
        MAX_SANDBOX_LIFETIME_SECONDS,
        " (18000 s, 5 h, is Vercel's maximum sandbox lifetime)",
    )
}

pub(super) fn between_u32(value: &str, min: u32, max: u32) -> Result<u32, String> {
    let v = between(value, u64::from(min), u64::from(max), "")?;
    Ok(u32::try_from(v).expect("bounded by a u32"))
}

/// Any name, or `none` to unset: which runtimes exist is the platform's to say (the Vercel
/// backend and `taskbox doctor` check it).
pub(super) fn runtime(value: &str) -> Result<Option<String>, String> {
    match value.trim() {
        "" => {
            Err("one of: node24, node22, python3.13, or none to use terminal.vercel_image".into())
        }
        "none" | "unset" => Ok(None),
        v => Ok(Some(v.to_string())),
    }
}

/// An image reference: any non-empty name without whitespace (managed `vercel/sandbox/...`
/// images and custom ones alike; which exist is the platform's to say).
pub(super) fn image(value: &str) -> Result<String, String> {
    let v = value.trim();
    if v.is_empty() || v.chars().any(char::is_whitespace) {
        return Err(format!(
            "an image name without spaces, such as {DEFAULT_VERCEL_IMAGE} or vercel/sandbox/node:24"
        ));
    }
    Ok(v.to_string())
}

pub(super) fn disk(value: &str) -> Result<Option<u32>, String> {
    match value.trim() {
        "" | "none" | "unset" => Ok(None),
        v => between_u32(v, 1, u32::MAX).map(Some),
    }
}

/// A price: a finite number of USD, zero or more.
pub(super) fn price(value: &str) -> Result<Usd, String> {
    match value.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(Usd(v)),
        _ => Err("a price in USD, a number of 0 or more (e.g. 0.128)".into()),
    }
}

pub(super) fn http_url(value: &str) -> Result<String, String> {
    let v = value.trim();
    if !(v.starts_with("http://") || v.starts_with("https://")) {
        return Err("an http:// or https:// URL".into());
    }
    Ok(v.trim_end_matches('/').to_string())
}
