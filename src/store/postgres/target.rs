//! A PostgreSQL store's address: parsed once, and shown only with its password replaced, so
//! that no log line, error, journal entry or `--json` output carries the secret.

use std::fmt;
use std::str::FromStr;

use crate::store::StoreError;

/// Where a PostgreSQL store lives: a `postgres://` or `postgresql://` URL.
#[derive(Clone)]
pub struct PgTarget {
    pub(super) config: tokio_postgres::Config,
    redacted: String,
}

impl PgTarget {
    /// Parses a `postgres://user[:password]@host[:port]/database[?options]` URL. The error
    /// names the URL with its password replaced.
    pub fn parse(url: &str) -> Result<PgTarget, StoreError> {
        let redacted = redact_url(url);
        if !is_postgres_url(url) {
            return Err(StoreError::BadTarget {
                target: redacted,
                reason: "a PostgreSQL store is a `postgres://user@host/database` URL".to_string(),
            });
        }
        let config = tokio_postgres::Config::from_str(url).map_err(|e| StoreError::BadTarget {
            target: redacted.clone(),
            // tokio-postgres names the bad option or value, never the password.
            reason: format!(
                "{e}{}",
                std::error::Error::source(&e)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default()
            ),
        })?;
        if config.get_hosts().is_empty() {
            return Err(StoreError::BadTarget {
                target: redacted,
                reason: "the URL names no host (write `postgres://user@host/database`)".to_string(),
            });
        }
        Ok(PgTarget { config, redacted })
    }

    /// The same server and credentials, database `name` (a scratch database of a chaos run).
    /// Returns the target and its URL (with the password: for the engines it is handed to,
    /// never shown).
    pub fn url_with_database(url: &str, name: &str) -> Result<(PgTarget, String), StoreError> {
        let (head, query) = match url.find('?') {
            Some(q) => url.split_at(q),
            None => (url, ""),
        };
        let scheme_end = head.find("://").map_or(0, |i| i + 3);
        let authority_end = head[scheme_end..]
            .find('/')
            .map_or(head.len(), |i| scheme_end + i);
        let changed = format!("{}/{name}{query}", &head[..authority_end]);
        Ok((PgTarget::parse(&changed)?, changed))
    }

    /// The URL with its password replaced by `[redacted]`: the only form that is ever shown.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }
}

impl fmt::Display for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PgTarget").field(&self.redacted).finish()
    }
}

/// Whether `s` is spelled as a PostgreSQL URL (`postgres://` or `postgresql://`).
pub fn is_postgres_url(s: &str) -> bool {
    let lower = s.get(..13).unwrap_or(s).to_ascii_lowercase();
    lower.starts_with("postgres://") || lower.starts_with("postgresql://")
}

/// `url` with the password of its user info and any `password=` option replaced by `[redacted]`.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    };
    // The authority ends at the first `/` or `?`; its user info at the last `@` within it.
    let auth_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(auth_end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, host) = authority.split_at(at);
            match userinfo.find(':') {
                Some(colon) => format!("{}:{}{host}", &userinfo[..colon], crate::redact::REDACTED),
                None => authority.to_string(),
            }
        }
        None => authority.to_string(),
    };
    let tail = match tail.find('?') {
        Some(q) => {
            let (path, query) = tail.split_at(q + 1);
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => {
                        format!("{k}={}", crate::redact::REDACTED)
                    }
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_replaced_wherever_they_are_written() {
        assert_eq!(
            redact_url("postgres://tb:s3cret@db:5432/taskbox"),
            "postgres://tb:[redacted]@db:5432/taskbox"
        );
        assert_eq!(
            redact_url("postgresql://tb:p@ss@word@db/x?password=hunter2&sslmode=disable"),
            "postgresql://tb:[redacted]@db/x?password=[redacted]&sslmode=disable"
        );
        assert_eq!(
            redact_url("postgres://tb@db/taskbox"),
            "postgres://tb@db/taskbox"
        );
        let (t, url) =
            PgTarget::url_with_database("postgres://tb:s3cret@db:5/x?sslmode=disable", "y")
                .expect("parse");
        assert_eq!(url, "postgres://tb:s3cret@db:5/y?sslmode=disable");
        assert_eq!(
            t.redacted(),
            "postgres://tb:[redacted]@db:5/y?sslmode=disable"
        );
        let (_, url) = PgTarget::url_with_database("postgres://tb@db", "y").expect("parse");
        assert_eq!(url, "postgres://tb@db/y");
        let err = PgTarget::parse("postgres://tb:s3cret@db/x?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert!(err.to_string().contains("bogus"), "{err}");
    }
}
