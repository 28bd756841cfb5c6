//! The one redaction of secrets typed into commands or returned in messages, used wherever
//! text leaves taskbox's hands or is kept: the journal (a command is journaled redacted),
//! `show --json`, `taskbox export`, `taskbox doctor`.
//!
//! Redaction works in two passes: first find secret values (`NAME=value` where the name says
//! token/secret/password/key/pass, `Bearer …` anywhere, `--token …`, passwords in URLs,
//! private-key blocks, JWTs, well-known token prefixes such as `ghp_`, and the password flags of
//! the tools that take one on their command line: `curl -u user:pw`, `mysql -ppw`, `sshpass -p`,
//! `docker login -p`, `redis-cli -a`, `openssl -k`/`-pass pass:pw`), then replace each
//! occurrence of those values everywhere with [`REDACTED`]. Redacting twice changes nothing
//! more. A name that only points at a secret (`--token-file FILE`, `PASSWORD_FILE=…`,
//! `--password-stdin`) is not one. The forms, and the text that must stay, are the corpus
//! `tests/it/redaction_corpus.txt`.

use std::collections::BTreeSet;

use serde_json::Value;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Name fragments (upper case, `-` read as `_`) that make a `NAME=value` pair a secret.
const KEY_WORDS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "APIKEY",
    "API_KEY",
    "ACCESS_KEY",
    "ACCESSKEY",
    "PRIVATE_KEY",
    "CLIENT_KEY",
    "SIGNING_KEY",
    "ENCRYPTION_KEY",
    "SESSION_KEY",
    "CREDENTIAL",
    "AUTHORIZATION",
    "AUTH_",
    "_AUTH",
    "COOKIE",
    "BEARER",
];

/// Name segments (between `_`) that make a name a password's: `DB_PASS`, `MYSQL_PWD`,
/// `--pass`. Whole words only: `BYPASS`, `PASSTHROUGH` and `COMPASS` are not passwords.
const PASSWORD_SEGMENTS: &[&str] = &["PASS", "PWD", "PW"];

/// Names that hold no secret although a segment says so: the working directory.
const NOT_SECRET_NAMES: &[&str] = &["PWD", "OLDPWD"];

/// Last name segments that make a name point at a secret rather than hold one
/// (`--token-file FILE`, `VERCEL_TOKEN_PATH`, `--password-stdin`).
const POINTER_SEGMENTS: &[&str] = &["FILE", "PATH", "DIR", "STDIN", "ENV", "URL"];

/// Prefixes of well-known token formats (GitHub, GitLab, Slack, OpenAI/Stripe, AWS, npm, PyPI,
/// Hugging Face, DigitalOcean, Shopify).
const TOKEN_PREFIXES: &[&str] = &[
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "xoxs-",
    "xapp-",
    "sk-",
    "sk_live_",
    "sk_test_",
    "rk_live_",
    "AKIA",
    "ASIA",
    "npm_",
    "pypi-",
    "hf_",
    "dop_v1_",
    "shpat_",
];

/// Fields whose values are vocabulary (enum tags, state names), never free text: left alone so
/// that a redacted entry still decodes.
const VOCABULARY_FIELDS: &[&str] = &[
    "type",
    "kind",
    "state",
    "state_before",
    "state_after",
    "status",
    "timer",
];

/// A value that ends a secret when it is not quoted.
fn ends_value(c: char) -> bool {
    c.is_whitespace() || "'\"`;&|<>(){},".contains(c)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'
}

/// Adds the secret values found in `text` to `out`.
pub fn find_secrets(text: &str, out: &mut BTreeSet<String>) {
    find_assignments(text, out);
    find_prefixed_tokens(text, out);
    find_url_passwords(text, out);
    find_private_keys(text, out);
    find_bearer_tokens(text, out);
    find_jwts(text, out);
    find_tool_passwords(text, out);
}

fn plausible(value: &str) -> bool {
    value.chars().count() >= 4
        && !value.starts_with('$')
        && !value.starts_with('%')
        && value != REDACTED
        && !value.chars().all(|c| c == '*' || c == 'x' || c == 'X')
}

/// Whether a value after `NAME:` looks like a credential rather than prose ("TOKEN: missing").
fn looks_like_credential(value: &str) -> bool {
    let has_digit = value.chars().any(|c| c.is_ascii_digit());
    let has_upper = value.chars().any(|c| c.is_ascii_uppercase());
    let has_lower = value.chars().any(|c| c.is_ascii_lowercase());
    value.chars().count() >= 8 && (has_digit || (has_upper && has_lower))
}

fn secret_name(name: &str) -> bool {
    let upper = name
        .trim_start_matches('-')
        .to_ascii_uppercase()
        .replace('-', "_");
    let segments: Vec<&str> = upper.split('_').filter(|s| !s.is_empty()).collect();
    if NOT_SECRET_NAMES.contains(&upper.as_str())
        || segments
            .last()
            .is_some_and(|s| POINTER_SEGMENTS.contains(s))
    {
        return false;
    }
    KEY_WORDS.iter().any(|k| upper.contains(k))
        || segments.iter().any(|s| PASSWORD_SEGMENTS.contains(s))
}

/// `NAME=value`, `NAME: value`, `"NAME": "value"`, `--name value`, `Authorization: Bearer x`.
fn find_assignments(text: &str, out: &mut BTreeSet<String>) {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        if !is_name_char(chars[i].1) || (i > 0 && is_name_char(chars[i - 1].1)) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_name_char(chars[i].1) {
            i += 1;
        }
        let name = &text[chars[start].0..chars.get(i).map_or(text.len(), |c| c.0)];
        if !secret_name(name) {
            continue;
        }
        let mut j = i;
        if j < chars.len() && (chars[j].1 == '"' || chars[j].1 == '\'') {
            j += 1; // the closing quote of a quoted key
        }
        while j < chars.len() && chars[j].1 == ' ' {
            j += 1;
        }
        let sep = chars.get(j).map(|c| c.1);
        let flag = name.starts_with("--");
        let colon = match sep {
            Some('=') => false,
            Some(':') => true,
            Some(c) if flag && c != '-' && j > i => {
                j -= 1; // `--token VALUE`: the space was the separator
                false
            }
            _ => continue,
        };
        j += 1;
        let Some((value, end)) = read_value(text, &chars, j) else {
            continue;
        };
        let (value, end) =
            if ["bearer", "basic", "token"].contains(&value.to_ascii_lowercase().as_str()) {
                match read_value(text, &chars, end) {
                    Some(v) => v,
                    None => continue,
                }
            } else {
                (value, end)
            };
        let credential = !colon || name.to_ascii_uppercase().contains("AUTHORIZATION");
        if plausible(value) && (credential || looks_like_credential(value)) {
            out.insert(value.to_string());
        }
        i = end.max(i);
    }
}

/// Reads one value starting at char index `j` (after spaces and an optional opening quote);
/// returns it and the char index just after it.
fn read_value<'t>(
    text: &'t str,
    chars: &[(usize, char)],
    mut j: usize,
) -> Option<(&'t str, usize)> {
    while j < chars.len() && chars[j].1 == ' ' {
        j += 1;
    }
    let quote = match chars.get(j)?.1 {
        q @ ('"' | '\'') => {
            j += 1;
            Some(q)
        }
        _ => None,
    };
    let start = j;
    while j < chars.len() {
        let c = chars[j].1;
        let stop = match quote {
            Some(q) => c == q,
            None => ends_value(c),
        };
        if stop {
            break;
        }
        j += 1;
    }
    if j == start {
        return None;
    }
    let byte = |k: usize| chars.get(k).map_or(text.len(), |c| c.0);
    Some((&text[byte(start)..byte(j)], j))
}

fn find_prefixed_tokens(text: &str, out: &mut BTreeSet<String>) {
    for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')) {
        for p in TOKEN_PREFIXES {
            if word.starts_with(p) && word.len() >= p.len() + 12 {
                out.insert(word.to_string());
            }
        }
    }
}

/// `Bearer VALUE` wherever it appears (`echo "Bearer …"`, a header in a file), not only after
/// `Authorization:`; the value must look like a credential, so prose ("the bearer of") stays.
fn find_bearer_tokens(text: &str, out: &mut BTreeSet<String>) {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let lower = text.to_ascii_lowercase();
    let mut from = 0;
    while let Some(pos) = lower[from..].find("bearer ") {
        let at = from + pos;
        from = at + "bearer ".len();
        let glued = text[..at].chars().next_back().is_some_and(is_name_char);
        if glued {
            continue;
        }
        let Ok(j) = chars.binary_search_by_key(&from, |c| c.0) else {
            continue;
        };
        if let Some((value, _)) = read_value(text, &chars, j) {
            if plausible(value) && looks_like_credential(value) {
                out.insert(value.to_string());
            }
        }
    }
}

/// A JSON Web Token: `eyJ…` (a base64url JSON header), a payload and a signature, dot-joined.
fn find_jwts(text: &str, out: &mut BTreeSet<String>) {
    let jwt_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.';
    for word in text.split(|c: char| !jwt_char(c)) {
        let parts: Vec<&str> = word.split('.').collect();
        if word.starts_with("eyJ")
            && parts.len() == 3
            && parts[0].len() >= 10
            && parts[1].len() >= 4
        {
            out.insert(word.to_string());
        }
    }
}

/// Which part of a tool flag's value is the secret.
#[derive(Clone, Copy)]
enum Part {
    /// All of it (`-p SECRET`; `pass:SECRET` for openssl).
    Whole,
    /// What follows the first `:` (`-u user:SECRET`); no `:`, no secret (the tool prompts).
    AfterColon,
}

/// A flag of a tool that takes a password on its command line.
struct ToolFlag {
    /// The flag (`-p`).
    flag: &'static str,
    /// Whether the next word is its value (`-p SECRET`; `mysql -p db` names a database).
    separate: bool,
    /// Whether the value may be glued to it (`-pSECRET`).
    glued: bool,
}

/// A tool whose password flags are read when it appears in a command.
struct Tool {
    /// Its program names.
    programs: &'static [&'static str],
    /// A word that must also appear in the command (`docker login`, not `docker run -p`).
    with: Option<&'static str>,
    flags: &'static [ToolFlag],
    part: Part,
}

const fn sep(flag: &'static str) -> ToolFlag {
    ToolFlag {
        flag,
        separate: true,
        glued: false,
    }
}

const fn both(flag: &'static str) -> ToolFlag {
    ToolFlag {
        flag,
        separate: true,
        glued: true,
    }
}

/// The tools that take a password on their command line, with the flags that carry it.
const TOOLS: &[Tool] = &[
    Tool {
        programs: &["curl"],
        with: None,
        flags: &[both("-u"), sep("--user"), both("-U"), sep("--proxy-user")],
        part: Part::AfterColon,
    },
    Tool {
        programs: &["http", "https"],
        with: None,
        flags: &[sep("-a"), sep("--auth")],
        part: Part::AfterColon,
    },
    Tool {
        programs: &[
            "mysql",
            "mysqldump",
            "mysqladmin",
            "mysqlimport",
            "mysqlshow",
            "mysqlcheck",
            "mariadb",
            "mariadb-dump",
        ],
        with: None,
        flags: &[ToolFlag {
            flag: "-p",
            separate: false,
            glued: true,
        }],
        part: Part::Whole,
    },
    Tool {
        programs: &["sshpass"],
        with: None,
        flags: &[both("-p")],
        part: Part::Whole,
    },
    Tool {
        programs: &[
            "docker", "podman", "nerdctl", "buildah", "skopeo", "helm", "oras", "crane",
        ],
        with: Some("login"),
        flags: &[sep("-p")],
        part: Part::Whole,
    },
    Tool {
        programs: &["redis-cli", "valkey-cli"],
        with: None,
        flags: &[sep("-a")],
        part: Part::Whole,
    },
    Tool {
        programs: &["openssl"],
        with: None,
        flags: &[
            sep("-k"),
            sep("-K"),
            sep("-pass"),
            sep("-passin"),
            sep("-passout"),
        ],
        part: Part::Whole,
    },
];

/// The password flags of [`TOOLS`], read per simple command (split at `;`, `|`, `&`, newlines).
/// A value glued to its flag (`-pSECRET`) is kept with the flag, as the whole word is what
/// [`scrub`] can replace.
fn find_tool_passwords(text: &str, out: &mut BTreeSet<String>) {
    for command in text.split(|c: char| ";|&\n()`".contains(c)) {
        let words: Vec<&str> = command
            .split_whitespace()
            .map(|w| w.trim_matches(|c| c == '"' || c == '\''))
            .collect();
        let program = |w: &str| w.rsplit('/').next().unwrap_or(w).to_string();
        for tool in TOOLS {
            if !words
                .iter()
                .any(|w| tool.programs.contains(&program(w).as_str()))
                || tool.with.is_some_and(|with| !words.contains(&with))
            {
                continue;
            }
            for (i, word) in words.iter().enumerate() {
                for f in tool.flags {
                    let (value, glued) = if *word == f.flag && f.separate {
                        match words.get(i + 1) {
                            Some(v) => (*v, false),
                            None => continue,
                        }
                    } else if let Some(v) = word.strip_prefix(f.flag).filter(|v| !v.is_empty()) {
                        match v.strip_prefix('=') {
                            Some(v) if f.flag.starts_with("--") => (v, false),
                            _ if f.glued => (v, true),
                            _ => continue,
                        }
                    } else {
                        continue;
                    };
                    if let Some(secret) = tool_secret(value, tool.part) {
                        if glued {
                            out.insert(word.to_string());
                        }
                        out.insert(secret.to_string());
                    }
                }
            }
        }
    }
}

/// The secret in a tool flag's value, if it holds one (not a `$VAR`, not `env:`/`file:`).
fn tool_secret(value: &str, part: Part) -> Option<&str> {
    let secret = match part {
        Part::Whole => value.strip_prefix("pass:").unwrap_or(value),
        Part::AfterColon => value.split_once(':')?.1,
    };
    let pointer = ["env:", "file:", "fd:", "stdin"]
        .iter()
        .any(|p| secret.starts_with(p));
    (secret.chars().count() >= 3 && !pointer && plausible_short(secret)).then_some(secret)
}

/// [`plausible`] for a value a tool's flag certainly holds as a password (3 characters do).
fn plausible_short(value: &str) -> bool {
    !value.starts_with('$')
        && !value.starts_with('-')
        && value != REDACTED
        && !value.contains(REDACTED)
        && !value.chars().all(|c| c == '*' || c == 'x' || c == 'X')
}

/// `scheme://user:password@host`.
fn find_url_passwords(text: &str, out: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let after = &rest[pos + 3..];
        let authority_end = after
            .find(|c: char| c == '/' || ends_value(c))
            .unwrap_or(after.len());
        let authority = &after[..authority_end];
        if let Some(at) = authority.rfind('@') {
            if let Some(colon) = authority[..at].find(':') {
                let password = &authority[colon + 1..at];
                if password.chars().count() >= 3 && !password.starts_with('$') {
                    out.insert(password.to_string());
                }
            }
        }
        rest = after;
    }
}

fn find_private_keys(text: &str, out: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let block = &rest[start..];
        let Some(end_marker) = block.find("-----END ") else {
            // A key cut off by output bounding: everything from the marker on.
            out.insert(block.to_string());
            return;
        };
        let after_end = &block[end_marker + 9..];
        let close = after_end.find("-----").map_or(after_end.len(), |p| p + 5);
        let whole = &block[..end_marker + 9 + close];
        if whole.contains("PRIVATE KEY") {
            out.insert(whole.to_string());
        }
        rest = &block[end_marker + 9 + close..];
    }
}

/// Replaces every bounded occurrence of each secret (longest first) in `text`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut s = text.to_string();
    for secret in secrets {
        if secret.is_empty() || !s.contains(secret.as_str()) {
            continue;
        }
        let mut out = String::with_capacity(s.len());
        let mut rest = s.as_str();
        let mut prev: Option<char> = None;
        while let Some(pos) = rest.find(secret.as_str()) {
            let before = rest[..pos].chars().next_back().or(prev);
            let after = rest[pos + secret.len()..].chars().next();
            // Only whole values: `abc` in `abcdef` is not the secret `abc`.
            let glued = |c: Option<char>, edge: Option<char>| matches!((c, edge), (Some(c), Some(e)) if c.is_ascii_alphanumeric() && e.is_ascii_alphanumeric());
            let bounded =
                !glued(before, secret.chars().next()) && !glued(after, secret.chars().next_back());
            out.push_str(&rest[..pos]);
            out.push_str(if bounded { REDACTED } else { secret });
            prev = secret.chars().next_back();
            rest = &rest[pos + secret.len()..];
        }
        out.push_str(rest);
        s = out;
    }
    s
}

/// Adds the secret values found in every string of `v` (but vocabulary fields) to `out`.
pub fn collect(v: &Value, key: Option<&str>, out: &mut BTreeSet<String>) {
    match v {
        Value::String(s) if !key.is_some_and(|k| VOCABULARY_FIELDS.contains(&k)) => {
            find_secrets(s, out)
        }
        Value::Array(xs) => xs.iter().for_each(|x| collect(x, None, out)),
        Value::Object(m) => m.iter().for_each(|(k, x)| collect(x, Some(k), out)),
        _ => {}
    }
}

/// Replaces `secrets` (longest first) in every string of `v` (but vocabulary fields).
pub fn replace(v: &mut Value, key: Option<&str>, secrets: &[String]) {
    match v {
        Value::String(s) if !key.is_some_and(|k| VOCABULARY_FIELDS.contains(&k)) => {
            *s = scrub(s, secrets)
        }
        Value::Array(xs) => xs.iter_mut().for_each(|x| replace(x, None, secrets)),
        Value::Object(m) => m.iter_mut().for_each(|(k, x)| replace(x, Some(k), secrets)),
        _ => {}
    }
}

/// `text` with every secret value found in it replaced by [`REDACTED`].
pub fn redact(text: &str) -> String {
    let mut found = BTreeSet::new();
    find_secrets(text, &mut found);
    if found.is_empty() {
        return text.to_string();
    }
    let mut secrets: Vec<String> = found.into_iter().collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    scrub(text, &secrets)
}

/// `v` with every secret value found in any of its strings replaced by [`REDACTED`] in all of
/// them; how many distinct values were found.
pub fn redact_value(v: &mut Value) -> usize {
    let mut found = BTreeSet::new();
    collect(v, None, &mut found);
    if found.is_empty() {
        return 0;
    }
    let mut secrets: Vec<String> = found.into_iter().collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    replace(v, None, &secrets);
    secrets.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(text: &str) -> Vec<String> {
        let mut out = BTreeSet::new();
        find_secrets(text, &mut out);
        out.into_iter().collect()
    }

    fn redacted(text: &str) -> String {
        let mut s = secrets(text);
        s.sort_by_key(|x| std::cmp::Reverse(x.len()));
        scrub(text, &s)
    }

    #[test]
    fn finds_assignments_flags_headers_urls_and_known_tokens() {
        assert_eq!(
            redacted("export GITHUB_TOKEN=abc123def; npm publish"),
            "export GITHUB_TOKEN=[redacted]; npm publish"
        );
        assert_eq!(
            redacted("curl -H 'Authorization: Bearer eyJhbGciOi.x.y' https://api"),
            "curl -H 'Authorization: Bearer [redacted]' https://api"
        );
        assert_eq!(
            redacted("tool --api-key s3cr3t-value --verbose"),
            "tool --api-key [redacted] --verbose"
        );
        assert_eq!(
            redacted("tool --password=hunter22"),
            "tool --password=[redacted]"
        );
        assert_eq!(
            redacted("git clone https://me:pa55word@example.com/r.git"),
            "git clone https://me:[redacted]@example.com/r.git"
        );
        assert_eq!(
            redacted("echo ghp_abcdefghijklmnopqrstuvwxyz0123 > f"),
            "echo [redacted] > f"
        );
        assert_eq!(
            redacted(r#"{"client_secret": "Zm9vYmFyYmF6"}"#),
            r#"{"client_secret": "[redacted]"}"#
        );
        assert_eq!(
            redacted("x\n-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\ny"),
            "x\n[redacted]\ny"
        );
    }

    #[test]
    fn leaves_ordinary_text_and_variable_references_alone() {
        for text in [
            "echo hello > notes.txt; cat notes.txt",
            "export TOKEN=$VERCEL_TOKEN",
            "create sandbox: VERCEL_TOKEN: missing, set it",
            "cd /work && cargo test --all-targets",
            "the sandbox taskbox-demo-g1 expired at 2025-01-01T00:00:00Z",
            "author=ann",
        ] {
            assert_eq!(redacted(text), text, "{text}");
        }
    }

    #[test]
    fn redacting_twice_changes_nothing_more() {
        for text in [
            "export GITHUB_TOKEN=abc123def; git clone https://me:pa55word@example.com/r.git",
            "curl -H 'Authorization: Bearer eyJhbGciOi.x.y' https://api",
        ] {
            let once = redact(text);
            assert_ne!(once, text);
            assert_eq!(redact(&once), once, "{text}");
        }
    }

    #[test]
    fn replaces_whole_values_only() {
        let s = vec!["abcd".to_string()];
        assert_eq!(
            scrub("abcd abcdef xabcd abcd.", &s),
            "[redacted] abcdef xabcd [redacted]."
        );
    }
}
