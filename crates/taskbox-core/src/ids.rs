//! Ids: the task ids taskbox accepts from callers, the sandbox and snapshot ids providers hand
//! back, and the sandbox names made from a task's id ([`sandbox_name`]), which the providers
//! create sandboxes under and the store reads back ([`parse_sandbox_name`]) to refuse a record
//! named for another task.
//!
//! Task ids become directory names (local backend) and sandbox names (Vercel), so only safe names
//! are accepted: 1 to 64 characters of `[A-Za-z0-9_-]`, starting with a letter or digit.
//!
//! [`SandboxId`] and [`SnapshotId`] are issued by a provider and are opaque to taskbox: they are
//! not validated (a provider may change its format; refusing an id it issued would strand the
//! sandbox or the snapshot), only kept apart from each other and from other strings by their type.

use std::borrow::Borrow;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A validated task id. Stored as the bare string (`#[serde(transparent)]` in effect); reading
/// one back validates it again, so a hand-edited row or journal cannot smuggle a path in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
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

impl TryFrom<String> for TaskId {
    type Error = TaskIdError;

    fn try_from(id: String) -> Result<TaskId, TaskIdError> {
        TaskId::new(&id)
    }
}

impl From<TaskId> for String {
    fn from(id: TaskId) -> String {
        id.0
    }
}

// Reading the text out is always fine; only making a `TaskId` goes through validation.
impl std::ops::Deref for TaskId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for TaskId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for TaskId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl AsRef<str> for TaskId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

// `Hash`, `Eq` and `Ord` are derived from the one `String` field, so they agree with `str`'s.
impl Borrow<str> for TaskId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for TaskId {
    type Err = TaskIdError;

    fn from_str(id: &str) -> Result<TaskId, TaskIdError> {
        TaskId::new(id)
    }
}

impl fmt::Display for TaskId {
    /// The id, honouring a width and alignment (`{:<w$}` in a table), as `str` does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

/// Defines a provider-issued id: a `String` newtype that serializes as the bare string and that
/// maps keyed by it can look up with a `&str`.
macro_rules! provider_id {
    ($(#[$attr:meta])* $name:ident) => {
        $(#[$attr])*
        // `Hash`, `Eq` and `Ord` are derived from the one `String` field, so they agree with
        // `str`'s, which `Borrow<str>` requires.
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            /// The id, honouring a width and alignment, as `str` does.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(&self.0)
            }
        }

        // Reading the text out is always fine (paths, JSON, SQL are strings); what the type
        // guards is the other way: a plain string or another kind of id cannot pass for one.
        impl std::ops::Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_string())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }
    };
}

provider_id! {
    /// A provider's handle for one sandbox: what every later call on that sandbox names it by
    /// (a local workspace name, a Vercel sandbox id). Not the sandbox's stable *name*
    /// (`taskbox-<task>-g<generation>-<installation>`), which taskbox derives itself.
    SandboxId
}

provider_id! {
    /// A provider's id for one complete snapshot of a task's filesystem, the handle a restore or
    /// a delete names it by. Not the snapshot's per-task sequence number, which is taskbox's own
    /// idempotency key and exists before the provider has answered.
    SnapshotId
}

/// The sandbox name for a task's `generation`: deterministic, so a create is safe to repeat,
/// and scoped by the installation (the first 8 characters of its id), so two installations
/// sharing a platform account never claim each other's sandboxes for equal task ids:
/// `taskbox-<task>-g<generation>-<installation prefix>`.
pub fn sandbox_name(installation_id: &str, task_id: &str, generation: u64) -> String {
    format!(
        "taskbox-{task_id}-g{generation}-{}",
        installation_prefix(installation_id)
    )
}

/// The part of an installation id that goes into sandbox names.
pub fn installation_prefix(installation_id: &str) -> String {
    installation_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// Splits a name made by [`sandbox_name`] into (installation prefix, task id, generation).
/// `None` for any other shape.
pub fn parse_sandbox_name(name: &str) -> Option<(String, String, u64)> {
    let rest = name.strip_prefix("taskbox-")?;
    let (rest, inst) = rest.rsplit_once('-')?;
    let (task, generation) = rest.rsplit_once("-g")?;
    if inst.is_empty()
        || !inst
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    {
        return None;
    }
    if generation.is_empty()
        || !generation.bytes().all(|b| b.is_ascii_digit())
        || (generation.len() > 1 && generation.starts_with('0'))
    {
        return None;
    }
    let generation: u64 = generation.parse().ok()?;
    TaskId::new(task).ok()?;
    Some((inst.to_string(), task.to_string(), generation))
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use serde::de::value::{Error as DeError, StrDeserializer};
    use serde::de::IntoDeserializer;

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

    #[test]
    fn provider_ids_read_and_print_as_their_text() {
        let sandbox = SandboxId::from("sbx_Ab12".to_string());
        assert_eq!(sandbox.as_str(), "sbx_Ab12");
        assert_eq!(sandbox.to_string(), "sbx_Ab12");
        assert_eq!(AsRef::<str>::as_ref(&sandbox), "sbx_Ab12");
        assert_eq!(String::from(sandbox), "sbx_Ab12");

        let snapshot = SnapshotId::from("sim-snap-000001");
        assert_eq!(snapshot.as_str(), "sim-snap-000001");
        assert_eq!(format!("{snapshot}"), "sim-snap-000001");
    }

    #[test]
    fn provider_ids_are_not_validated() {
        // Opaque on purpose: whatever the provider issued must come back intact.
        for id in ["", "a/b", "..", "é", "x".repeat(200).as_str()] {
            assert_eq!(SandboxId::from(id).as_str(), id);
            assert_eq!(SnapshotId::from(id).as_str(), id);
        }
    }

    #[test]
    fn maps_keyed_by_provider_ids_look_up_with_str() {
        let mut hashed = HashMap::new();
        hashed.insert(SandboxId::from("sbx_1"), 1);
        hashed.insert(SandboxId::from("sbx_2"), 2);
        assert_eq!(hashed.get("sbx_2"), Some(&2));
        assert_eq!(hashed.get("sbx_3"), None);

        let mut ordered = BTreeMap::new();
        ordered.insert(SnapshotId::from("snap-b"), 2);
        ordered.insert(SnapshotId::from("snap-a"), 1);
        assert_eq!(ordered.get("snap-a"), Some(&1));
        // Ordered as their text, so a map keyed by them iterates like one keyed by strings.
        let keys: Vec<&str> = ordered.keys().map(SnapshotId::as_str).collect();
        assert_eq!(keys, ["snap-a", "snap-b"]);
    }

    #[test]
    fn task_ids_store_as_the_bare_string_and_are_validated_when_read() {
        let input: StrDeserializer<'_, DeError> = "demo-1".into_deserializer();
        assert_eq!(
            TaskId::deserialize(input).expect("a valid id"),
            TaskId::new("demo-1").expect("valid")
        );
        let input: StrDeserializer<'_, DeError> = "../etc".into_deserializer();
        let err = TaskId::deserialize(input).expect_err("a path is refused");
        assert!(err.to_string().contains("../etc"), "{err}");
        assert_eq!(String::from(TaskId::new("x").expect("valid")), "x");
    }

    #[test]
    fn provider_ids_deserialize_from_a_bare_string() {
        // `#[serde(transparent)]`: the stored form is the string itself, not a newtype wrapper,
        // so journals and rows written with plain `String` ids read back unchanged.
        let input: StrDeserializer<'_, DeError> = "sbx_9".into_deserializer();
        assert_eq!(
            SandboxId::deserialize(input).expect("a bare string"),
            SandboxId::from("sbx_9")
        );
        let input: StrDeserializer<'_, DeError> = "snap_9".into_deserializer();
        assert_eq!(
            SnapshotId::deserialize(input).expect("a bare string"),
            SnapshotId::from("snap_9")
        );
    }
}
