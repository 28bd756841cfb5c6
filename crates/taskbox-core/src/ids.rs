//! Task ids. They become directory names (local backend) and sandbox names (Vercel), so only
//! safe names are accepted: 1 to 64 characters of `[A-Za-z0-9_-]`, starting with a letter or digit.

use std::fmt;

/// A validated task id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(String);

/// Why a task id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid task id `{id}`: {reason}")]
pub struct TaskIdError {
    /// The id given (escaped for printing).
    pub id: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// The longest task id accepted.
pub const MAX_TASK_ID_LEN: usize = 64;

impl TaskId {
    /// Validates `id`.
    pub fn new(id: &str) -> Result<TaskId, TaskIdError> {
        let err = |reason| TaskIdError {
            id: id.escape_debug().to_string(),
            reason,
        };
        if id.is_empty() {
            return Err(err("it is empty"));
        }
        if id.len() > MAX_TASK_ID_LEN {
            return Err(err("it is longer than 64 characters"));
        }
        if !id.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(err("it must start with a letter or digit"));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(err("use only letters, digits, `-` and `_`"));
        }
        Ok(TaskId(id.to_string()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_safe_names_and_rejects_paths() {
        assert!(TaskId::new("demo").is_ok());
        assert!(TaskId::new("a-B_9").is_ok());
        for bad in [
            "", "..", "../x", "a/b", "/abs", ".hidden", "a b", "a\0b", "é", "-x", "a.b",
        ] {
            assert!(TaskId::new(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(TaskId::new(&"x".repeat(65)).is_err());
    }
}
