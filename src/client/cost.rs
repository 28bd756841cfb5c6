//! `taskbox cost` over `--server`: `GET /v1/cost` (server/cost.rs), whose answer is the object
//! `cost --json` prints.

use hyper::Method;

use super::{Client, ClientError};
use crate::ids::TaskId;

impl Client {
    /// What `task` (every task when `None`) used since `since` (`7d`; all time when `None`),
    /// as `taskbox cost --json` prints it, priced with the server's `cost.*` keys.
    pub async fn cost(
        &self,
        task: Option<&TaskId>,
        since: Option<&str>,
    ) -> Result<serde_json::Value, ClientError> {
        let mut query = Vec::new();
        if let Some(t) = task {
            query.push(format!("task={}", encode(t.as_str())));
        }
        if let Some(s) = since {
            query.push(format!("since={}", encode(s)));
        }
        let path = match query.is_empty() {
            true => "/cost".to_string(),
            false => format!("/cost?{}", query.join("&")),
        };
        self.call(Method::GET, &path, None::<&()>).await
    }
}

/// `text` percent-encoded for a query value (everything but ASCII letters, digits, `-`, `_`,
/// `.` and `~`).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_query_value_is_percent_encoded() {
        assert_eq!(super::encode("7d"), "7d");
        assert_eq!(super::encode(" 1 h&x=é"), "%201%20h%26x%3D%C3%A9");
    }
}
