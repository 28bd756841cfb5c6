//! A server on another machine (`taskbox --server URL`): its checked URL and bearer token, and
//! the owner address a fleet's `task_elsewhere` answer names.

use std::sync::Arc;

use super::{ApiError, ClientError};

/// A server on another machine, reached over TCP (`taskbox --server URL`): where it listens
/// and the bearer token it wants. Its `Debug` and every message name the URL, never the token.
#[derive(Clone)]
pub struct Remote {
    /// The URL as the user gave it, without a trailing `/`.
    pub(super) url: String,
    /// `host:port`, to connect to and to send as `Host`.
    pub(super) authority: String,
    /// The bearer token.
    pub(super) token: Arc<String>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// A server at `url` (`http://HOST:PORT`, as `taskbox serve --listen` prints it), with
    /// its bearer `token`: refused when the URL is not plain HTTP to a host, or the token is
    /// missing or empty.
    pub fn new(url: &str, token: Option<&str>) -> Result<Remote, ClientError> {
        let bad = |what: String, hint: &str| ClientError::BadRemote {
            what,
            hint: hint.to_string(),
        };
        let form = "give it as http://HOST:PORT, the address of `taskbox serve --listen HOST:PORT`";
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(if url.starts_with("https://") {
                bad(
                    format!("the server URL {url} is https: taskbox serve speaks plain HTTP"),
                    "use http://HOST:PORT, and put the server behind a TLS tunnel or proxy of your own (ssh -L, a load balancer) when the network is not trusted",
                )
            } else {
                bad(
                    format!("the server URL `{url}` is not an http:// URL"),
                    form,
                )
            });
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains(['/', '@', '?', '#', ' ']) {
            return Err(bad(
                format!("the server URL `{url}` is not http://HOST:PORT (no user, path or query)"),
                form,
            ));
        }
        let authority = match authority.rsplit_once(':') {
            Some((_, port)) if port.parse::<u16>().is_ok() => authority.to_string(),
            _ if authority.ends_with(']') || !authority.contains(':') => format!("{authority}:80"),
            _ => {
                return Err(bad(
                    format!("the server URL `{url}` has no valid port"),
                    form,
                ))
            }
        };
        let token = token.map(str::trim).unwrap_or_default();
        if token.is_empty() {
            return Err(bad(
                format!("--server {url} needs the server's bearer token"),
                "set TASKBOX_TOKEN, or pass --token-file FILE with the token of the server's --token-file",
            ));
        }
        Ok(Remote {
            url: format!("http://{}", rest.trim_end_matches('/')),
            authority,
            token: Arc::new(token.to_string()),
        })
    }

    /// The URL, for messages.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The same token at another server's address (`HOST:PORT`).
    pub(super) fn at(&self, authority: &str) -> Remote {
        Remote {
            url: format!("http://{authority}"),
            authority: authority.to_string(),
            token: self.token.clone(),
        }
    }
}

/// The TCP address a `task_elsewhere` answer names for the task's owner: its message quotes
/// the owner as `` `HOST pid N since T at ADDR` `` (`at ADDR` only when that server listens on
/// TCP). `None` without one, or for an address no client can dial (`0.0.0.0`, `[::]`).
pub(super) fn owner_address(error: &ApiError) -> Option<String> {
    if error.code != "task_elsewhere" {
        return None;
    }
    // The quoted parts are the task (`` `t1` ``) and the owner; the owner's has a pid.
    let owner = error
        .message
        .split('`')
        .skip(1)
        .step_by(2)
        .find(|quoted| quoted.contains(" pid "))?;
    let (_, addr) = owner.rsplit_once(" at ")?;
    let addr = addr.trim();
    let (host, port) = addr.rsplit_once(':')?;
    let unspecified = matches!(host, "0.0.0.0" | "[::]" | "::" | "");
    (port.parse::<u16>().is_ok() && !unspecified).then(|| addr.to_string())
}
