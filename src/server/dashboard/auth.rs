//! The guard of a dashboard on TCP (`serve --listen`, and `taskbox dashboard`'s loopback port):
//! the bearer token, or a session cookie a login form hands out for it.
//!
//! A browser cannot send `Authorization: Bearer`, and the token must never be in a URL (it would
//! end up in the history, in logs and in `Referer`s). So `GET /` without credentials answers the
//! login form; the form posts the token (`POST /dashboard/login`), which is compared in constant
//! time; the right one gets a cookie holding a session key drawn at random when the guard was
//! made (not the token: the token never sits in the browser), `HttpOnly` (no script reads it)
//! and `SameSite=Strict` (no other site's page sends it). A wrong token gets the form again and
//! no data.
//!
//! The cookie is accepted for `GET` and `HEAD` only: every state-changing request of the API is
//! a `POST` and still needs the `Authorization` header, so a page elsewhere that made the
//! browser post to the server would carry no credential the server accepts (CSRF). The API's
//! `GET`s change nothing. The session key lives as long as the process: a restart logs every
//! browser out.

use std::io::Read;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::super::http::{bearer_token, constant_time_eq, unauthorized};

/// The login form's target.
pub const LOGIN: &str = "/dashboard/login";
/// Forgets the session cookie.
pub const LOGOUT: &str = "/dashboard/logout";
/// The session cookie's name.
pub const COOKIE: &str = "taskbox_session";

/// The most bytes of a login form read (a token is far shorter).
const FORM_MAX: usize = 8 * 1024;

/// The page a browser without credentials gets.
const LOGIN_HTML: &str = include_str!("assets/login.html");

/// The token, and the session key the login form trades it for.
pub struct Guard {
    token: String,
    session: String,
}

impl Guard {
    /// A guard of `token`, with a fresh random session key.
    pub fn new(token: &str) -> std::io::Result<Guard> {
        Ok(Guard {
            token: token.trim().to_string(),
            session: random_hex(32)?,
        })
    }

    fn has_token(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.token.as_bytes())
    }

    fn has_session(&self, req: &Request) -> bool {
        req.headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .any(|(name, value)| {
                name == COOKIE && constant_time_eq(value.as_bytes(), self.session.as_bytes())
            })
    }
}

/// `n` random bytes from the kernel, as hex (a session key no one can guess).
pub fn random_hex(n: usize) -> std::io::Result<String> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The middleware: the bearer token for any request; the session cookie for `GET`/`HEAD`; the
/// login form for a page; the API's JSON 401 for the rest.
pub async fn guard(State(g): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    if read && path.starts_with(super::ASSETS) {
        return next.run(req).await;
    }
    if path == LOGIN {
        return match *req.method() {
            Method::POST => login(&g, req).await,
            _ => login_page(StatusCode::OK, ""),
        };
    }
    if path == LOGOUT && req.method() == Method::POST {
        return see_home(Some(format!(
            "{COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict"
        )));
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    if bearer.is_some_and(|t| g.has_token(t)) || (read && g.has_session(&req)) {
        return next.run(req).await;
    }
    if read && path == "/" {
        return login_page(StatusCode::UNAUTHORIZED, "");
    }
    tracing::warn!(path = %path, "refused a TCP request without the right bearer token or session");
    unauthorized()
}

/// `POST /dashboard/login` with `token=…`: the cookie and the way home, or the form again.
async fn login(g: &Guard, req: Request) -> Response {
    let form = match axum::body::to_bytes(req.into_body(), FORM_MAX).await {
        Ok(b) => b,
        Err(_) => return login_page(StatusCode::BAD_REQUEST, "The form could not be read."),
    };
    let token = form_field(&form, "token").unwrap_or_default();
    if !g.has_token(token.trim()) {
        tracing::warn!("refused a dashboard login with a wrong token");
        return login_page(
            StatusCode::UNAUTHORIZED,
            "That is not the server's token. Nothing was shown.",
        );
    }
    see_home(Some(format!(
        "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict",
        g.session
    )))
}

/// 303 to `/`, setting `cookie` if given.
fn see_home(cookie: Option<String>) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SEE_OTHER;
    let h = resp.headers_mut();
    h.insert(header::LOCATION, HeaderValue::from_static("/"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        h.insert(header::SET_COOKIE, c);
    }
    resp
}

/// The login form, with `message` (plain text) above it.
fn login_page(status: StatusCode, message: &str) -> Response {
    let message = crate::replay::timeline::escape(message);
    let html = LOGIN_HTML.replace("{{message}}", &message);
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        html,
    )
        .into_response()
}

/// The value of `name` in an `application/x-www-form-urlencoded` body.
fn form_field(form: &[u8], name: &str) -> Option<String> {
    form.split(|b| *b == b'&').find_map(|pair| {
        let mut kv = pair.splitn(2, |b| *b == b'=');
        let key = percent_decode(kv.next()?)?;
        (key == name).then(|| percent_decode(kv.next().unwrap_or_default()))?
    })
}

/// Decodes `+` and `%XX` (the form encoding); `None` when the bytes are not UTF-8.
fn percent_decode(bytes: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::{form_field, percent_decode};

    #[test]
    fn a_form_field_is_decoded() {
        assert_eq!(
            form_field(b"a=1&token=ab%2Bc+d%25&z=", "token").as_deref(),
            Some("ab+c d%")
        );
        assert_eq!(form_field(b"token=", "token").as_deref(), Some(""));
        assert_eq!(form_field(b"tok=x", "token"), None);
        assert_eq!(percent_decode(b"100%").as_deref(), Some("100%"));
        assert_eq!(percent_decode(b"%zz").as_deref(), Some("%zz"));
        assert_eq!(percent_decode(b"%ff"), None);
    }
}
