//! Vercel credentials: which token, which team, which project — resolved from the environment
//! and the nearest `.vercel/project.json`, checked before any request is sent.
//!
//! Two modes, as in the Vercel SDKs:
//! - **access token**: `VERCEL_TOKEN` with `VERCEL_PROJECT_ID` and `VERCEL_TEAM_ID` (the last two
//!   default from `.vercel/project.json`'s `projectId` and `orgId`). It does not expire under a
//!   running process, so it is the mode for deployments and long-running engines.
//! - **OIDC**: `VERCEL_OIDC_TOKEN` from `vercel env pull`, a JWT whose payload names the team
//!   (`owner_id`) and project (`project_id`). It lasts about 12 hours and there is no headless
//!   refresh, so it is for one-off local development.
//!
//! **When both are set, the access token wins**: a process started with both must not die 12
//! hours later because an OIDC token that happened to be exported expired. The doctor report
//! says which mode is active.
//!
//! The JWT is decoded without verifying its signature (the server verifies it); decoding only
//! reads the team, project and expiry, so an expired token is refused here with the fix instead
//! of by a bare 403 from the server. No token value ever appears in `Debug`, `Display` or an
//! error: tokens live in [`Secret`], which prints as `[redacted]`.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::settings::env_value;
use crate::clock::format_ms;
use crate::core::Millis;

/// The OIDC token variable.
pub const OIDC_TOKEN_ENV: &str = "VERCEL_OIDC_TOKEN";
/// The access token variable.
pub const TOKEN_ENV: &str = "VERCEL_TOKEN";
/// The project id variable (access-token mode).
pub const PROJECT_ENV: &str = "VERCEL_PROJECT_ID";
/// The team id variable (access-token mode).
pub const TEAM_ENV: &str = "VERCEL_TEAM_ID";

/// Every variable auth looks at, in the order reports list them.
pub const AUTH_VARS: [&str; 4] = [OIDC_TOKEN_ENV, TOKEN_ENV, PROJECT_ENV, TEAM_ENV];

/// The fix for an expired or refused OIDC token (the seed doc's advice, plus the way out).
pub const OIDC_FIX: &str = "run `vercel env pull` in the linked project and export the fresh token; for long-running processes use access-token auth: VERCEL_TOKEN, VERCEL_PROJECT_ID, VERCEL_TEAM_ID";

/// A bearer token. Its only way out is `Secret::expose`; every printing shows `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a token.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The token, for the `Authorization` header only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Which credential is in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    /// `VERCEL_TOKEN` + project + team.
    AccessToken,
    /// `VERCEL_OIDC_TOKEN`.
    Oidc,
}

impl AuthMode {
    /// A short name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthMode::AccessToken => "access token",
            AuthMode::Oidc => "OIDC token",
        }
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Resolved credentials. `Debug` and `Display` never show the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    mode: AuthMode,
    token: Secret,
    team_id: String,
    project_id: String,
    expires_at_ms: Option<Millis>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("mode", &self.mode)
            .field("token", &self.token)
            .field("team_id", &self.team_id)
            .field("project_id", &self.project_id)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish()
    }
}

impl fmt::Display for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (team {}, project {})",
            self.mode, self.team_id, self.project_id
        )?;
        if let Some(exp) = self.expires_at_ms {
            write!(f, ", expires {}", format_ms(exp))?;
        }
        Ok(())
    }
}

/// Why no usable credentials could be resolved. Messages name variables, never their values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Neither mode's variables are set.
    #[error("no Vercel credentials: neither {OIDC_TOKEN_ENV} nor {TOKEN_ENV} is set")]
    NoCredentials,
    /// Access-token mode is incomplete.
    #[error("Vercel access-token auth needs {TOKEN_ENV}, {PROJECT_ENV} and {TEAM_ENV} together; missing: {}", missing.join(", "))]
    MissingAccessTokenVars {
        /// The variables not set (and not supplied by `.vercel/project.json`).
        missing: Vec<&'static str>,
        /// The `.vercel/project.json` consulted for defaults, if one was found.
        project_json: Option<PathBuf>,
    },
    /// `VERCEL_OIDC_TOKEN` is not a JWT we can read.
    #[error("{OIDC_TOKEN_ENV} is not a valid Vercel OIDC token: {reason}")]
    MalformedOidc {
        /// What is wrong (never the token itself).
        reason: String,
    },
    /// The OIDC token's `exp` has passed.
    #[error("{OIDC_TOKEN_ENV} expired at {}", format_ms(*expired_at_ms))]
    OidcExpired {
        /// When it expired.
        expired_at_ms: Millis,
    },
    /// The OIDC token names no project and none is configured.
    #[error("{OIDC_TOKEN_ENV} names no project, and neither {PROJECT_ENV} nor .vercel/project.json gives one")]
    OidcNoProject,
    /// `.vercel/project.json` exists but cannot be read.
    #[error("cannot read {}: {reason}", path.display())]
    ProjectJson {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

impl AuthError {
    /// How to fix it, as one line.
    pub fn hint(&self) -> String {
        match self {
            AuthError::NoCredentials => format!(
                "for long-running use set {TOKEN_ENV}, {PROJECT_ENV} and {TEAM_ENV}; for local development run `vercel env pull` in a linked project and export {OIDC_TOKEN_ENV}"
            ),
            AuthError::MissingAccessTokenVars { missing, project_json } => {
                let base = format!("export {}", missing.join(" and "));
                match project_json {
                    Some(p) => format!("{base} (defaults for the project and team come from {})", p.display()),
                    None => format!("{base}, or run `vercel link` so that .vercel/project.json supplies the project and team"),
                }
            }
            AuthError::MalformedOidc { .. } | AuthError::OidcExpired { .. } => OIDC_FIX.to_string(),
            AuthError::OidcNoProject => {
                format!("export {PROJECT_ENV}, or run `vercel link` in the project directory")
            }
            AuthError::ProjectJson { path, .. } => {
                format!("fix or remove {}, or run `vercel link` again", path.display())
            }
        }
    }
}

/// What `vercel link` wrote: `.vercel/project.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectLink {
    /// The file.
    pub path: PathBuf,
    /// `projectId`.
    pub project_id: Option<String>,
    /// `orgId` (the team).
    pub org_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProjectJson {
    project_id: Option<String>,
    org_id: Option<String>,
}

/// The nearest `.vercel/project.json` at or above `cwd`.
pub fn find_project_json(cwd: &Path) -> Option<PathBuf> {
    cwd.ancestors()
        .map(|dir| dir.join(".vercel").join("project.json"))
        .find(|p| p.is_file())
}

/// Reads the nearest `.vercel/project.json` at or above `cwd`, if there is one.
pub fn read_project_link(cwd: &Path) -> Result<Option<ProjectLink>, AuthError> {
    let Some(path) = find_project_json(cwd) else {
        return Ok(None);
    };
    let err = |reason: String| AuthError::ProjectJson {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
    let parsed: ProjectJson = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    let nonempty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    Ok(Some(ProjectLink {
        project_id: nonempty(parsed.project_id),
        org_id: nonempty(parsed.org_id),
        path,
    }))
}

/// The claims taskbox reads from an OIDC token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcClaims {
    /// `owner_id`: the team.
    pub owner_id: String,
    /// `project_id`.
    pub project_id: Option<String>,
    /// `exp` in ms since the epoch (`None` if the token has no `exp`).
    pub expires_at_ms: Option<Millis>,
}

#[derive(Deserialize)]
struct RawClaims {
    owner_id: Option<String>,
    project_id: Option<String>,
    exp: Option<f64>,
}

/// Decodes a JWT's payload without verifying it. Errors never quote the token.
pub fn decode_oidc_claims(token: &str) -> Result<OidcClaims, AuthError> {
    let bad = |reason: &str| AuthError::MalformedOidc {
        reason: reason.to_string(),
    };
    let parts: Vec<&str> = token.trim().split('.').collect();
    if parts.len() != 3 {
        return Err(bad("expected a JWT (three dot-separated parts)"));
    }
    // Tokens are base64url without padding, but tolerate padding some tools add.
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts[1].trim_end_matches('='))
        .map_err(|_| bad("the payload is not base64url"))?;
    let raw: RawClaims = serde_json::from_slice(&payload)
        .map_err(|_| bad("the payload is not a JSON object of claims"))?;
    let owner_id = raw
        .owner_id
        .filter(|s| !s.is_empty())
        .ok_or_else(|| bad("the payload has no `owner_id` (team) claim"))?;
    let expires_at_ms = match raw.exp {
        Some(e) if e.is_finite() && e >= 0.0 => Some((e * 1000.0) as Millis),
        Some(_) => return Err(bad("the `exp` claim is not a valid time")),
        None => None,
    };
    Ok(OidcClaims {
        owner_id,
        project_id: raw.project_id.filter(|s| !s.is_empty()),
        expires_at_ms,
    })
}

impl Credentials {
    /// Access-token credentials given directly (for embedding programs).
    pub fn access_token(
        token: impl Into<String>,
        team_id: impl Into<String>,
        project_id: impl Into<String>,
    ) -> Credentials {
        Credentials {
            mode: AuthMode::AccessToken,
            token: Secret::new(token),
            team_id: team_id.into(),
            project_id: project_id.into(),
            expires_at_ms: None,
        }
    }

    /// Resolves credentials from `env` and the nearest `.vercel/project.json` above `cwd`.
    /// The access token wins when both modes are configured (see the module docs). An expired
    /// OIDC token is refused here, before anything is sent.
    pub fn resolve(
        env: &dyn Fn(&str) -> Option<String>,
        cwd: &Path,
        now_ms: Millis,
    ) -> Result<Credentials, AuthError> {
        let token = env_value(env, TOKEN_ENV);
        let oidc = env_value(env, OIDC_TOKEN_ENV);
        let project_env = env_value(env, PROJECT_ENV);
        let team_env = env_value(env, TEAM_ENV);

        if let Some(token) = token {
            // project.json is only read when a variable is missing, so a broken file does not
            // stand in the way of a complete environment.
            let link = if project_env.is_none() || team_env.is_none() {
                read_project_link(cwd)?
            } else {
                None
            };
            let project = project_env.or_else(|| link.as_ref().and_then(|l| l.project_id.clone()));
            let team = team_env.or_else(|| link.as_ref().and_then(|l| l.org_id.clone()));
            return match (project, team) {
                (Some(project_id), Some(team_id)) => Ok(Credentials {
                    mode: AuthMode::AccessToken,
                    token: Secret::new(token.trim()),
                    team_id,
                    project_id,
                    expires_at_ms: None,
                }),
                (project, team) => Err(AuthError::MissingAccessTokenVars {
                    missing: [(PROJECT_ENV, project.is_none()), (TEAM_ENV, team.is_none())]
                        .into_iter()
                        .filter_map(|(n, m)| m.then_some(n))
                        .collect(),
                    project_json: link.map(|l| l.path),
                }),
            };
        }

        if let Some(oidc) = oidc {
            let claims = decode_oidc_claims(&oidc)?;
            if let Some(exp) = claims.expires_at_ms {
                if exp <= now_ms {
                    return Err(AuthError::OidcExpired { expired_at_ms: exp });
                }
            }
            let project_id = match claims.project_id.or(project_env) {
                Some(p) => p,
                None => read_project_link(cwd)?
                    .and_then(|l| l.project_id)
                    .ok_or(AuthError::OidcNoProject)?,
            };
            return Ok(Credentials {
                mode: AuthMode::Oidc,
                token: Secret::new(oidc.trim()),
                team_id: claims.owner_id,
                project_id,
                expires_at_ms: claims.expires_at_ms,
            });
        }

        if project_env.is_some() || team_env.is_some() {
            // Half an access-token setup: say what is missing rather than "no credentials".
            let mut missing = vec![TOKEN_ENV];
            if project_env.is_none() {
                missing.push(PROJECT_ENV);
            }
            if team_env.is_none() {
                missing.push(TEAM_ENV);
            }
            return Err(AuthError::MissingAccessTokenVars {
                missing,
                project_json: find_project_json(cwd),
            });
        }
        Err(AuthError::NoCredentials)
    }

    /// The active mode.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// The team every request is scoped to (`?teamId=`).
    pub fn team_id(&self) -> &str {
        &self.team_id
    }

    /// The project sandboxes are created in.
    pub fn project_id(&self) -> &str {
        &self.project_id
    }

    /// When an OIDC token expires.
    pub fn expires_at_ms(&self) -> Option<Millis> {
        self.expires_at_ms
    }

    /// The bearer token.
    pub(crate) fn token(&self) -> &Secret {
        &self.token
    }
}

/// What `taskbox doctor` says about auth: the mode that would be active, which variables are
/// set (names only), where project and team come from, and when an OIDC token expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthReport {
    /// The mode in effect, if credentials resolve.
    pub mode: Option<AuthMode>,
    /// Each variable of [`AUTH_VARS`] and whether it is set (never its value).
    pub variables: Vec<(&'static str, bool)>,
    /// The `.vercel/project.json` found, if any.
    pub project_json: Option<PathBuf>,
    /// The team and project in effect (ids, not secrets).
    pub team_id: Option<String>,
    /// See `team_id`.
    pub project_id: Option<String>,
    /// The OIDC token's expiry, when it could be read.
    pub oidc_expires_at_ms: Option<Millis>,
    /// Why credentials do not resolve.
    pub problem: Option<AuthError>,
}

impl AuthReport {
    /// Gathers the report; reads the same inputs as [`Credentials::resolve`].
    pub fn gather(env: &dyn Fn(&str) -> Option<String>, cwd: &Path, now_ms: Millis) -> AuthReport {
        let variables = AUTH_VARS
            .iter()
            .map(|&n| (n, env_value(env, n).is_some()))
            .collect();
        let oidc_expires_at_ms = env_value(env, OIDC_TOKEN_ENV)
            .and_then(|t| decode_oidc_claims(&t).ok())
            .and_then(|c| c.expires_at_ms);
        let resolved = Credentials::resolve(env, cwd, now_ms);
        let (mode, team_id, project_id, problem) = match resolved {
            Ok(c) => (
                Some(c.mode),
                Some(c.team_id.clone()),
                Some(c.project_id.clone()),
                None,
            ),
            Err(e) => (None, None, None, Some(e)),
        };
        AuthReport {
            mode,
            variables,
            project_json: find_project_json(cwd),
            team_id,
            project_id,
            oidc_expires_at_ms,
            problem,
        }
    }

    /// One line: the mode (or the problem), the variables present and missing, the expiry.
    pub fn summary(&self) -> String {
        let present: Vec<&str> = self
            .variables
            .iter()
            .filter_map(|(n, p)| p.then_some(*n))
            .collect();
        let absent: Vec<&str> = self
            .variables
            .iter()
            .filter_map(|(n, p)| (!p).then_some(*n))
            .collect();
        let mut s = match (&self.mode, &self.problem) {
            (Some(mode), _) => format!(
                "{mode} (team {}, project {})",
                self.team_id.as_deref().unwrap_or("?"),
                self.project_id.as_deref().unwrap_or("?")
            ),
            (None, Some(problem)) => problem.to_string(),
            (None, None) => "not resolved".to_string(),
        };
        let list = |v: &[&str]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        s.push_str(&format!(
            "; set: {}; unset: {}",
            list(&present),
            list(&absent)
        ));
        if let Some(p) = &self.project_json {
            s.push_str(&format!("; linked: {}", p.display()));
        }
        if let Some(exp) = self.oidc_expires_at_ms {
            s.push_str(&format!("; OIDC token expires {}", format_ms(exp)));
        }
        s
    }
}
