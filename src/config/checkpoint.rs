//! `terminal.checkpoint`: when a live sandbox is checkpointed without being asked — `off`,
//! `every_command`, or a number of seconds — and its reading from text and from the file.

use serde::{Deserialize, Serialize};

use crate::core::AutoCheckpoint;

/// The most seconds `terminal.checkpoint` may say (a day).
pub const MAX_CHECKPOINT_SECONDS: u64 = 86_400;

/// `terminal.checkpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "Raw", into = "String")]
pub enum CheckpointSetting {
    /// Only `taskbox checkpoint` and rewinds checkpoint.
    #[default]
    Off,
    /// After every command (one that changed no file costs no snapshot).
    EveryCommand,
    /// After a command ending at least this many seconds after the latest snapshot.
    Seconds(u64),
}

/// What the file may hold: the text form, or a bare number of seconds.
#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Seconds(u64),
    Text(String),
}

impl TryFrom<Raw> for CheckpointSetting {
    type Error = String;
    fn try_from(raw: Raw) -> Result<CheckpointSetting, String> {
        match raw {
            Raw::Seconds(n) => parse(&n.to_string()),
            Raw::Text(t) => parse(&t),
        }
    }
}

impl From<CheckpointSetting> for String {
    fn from(c: CheckpointSetting) -> String {
        c.render()
    }
}

impl CheckpointSetting {
    /// The value as `config get` prints it (and `terminal.checkpoint`'s parser reads it back).
    pub fn render(self) -> String {
        match self {
            CheckpointSetting::Off => "off".into(),
            CheckpointSetting::EveryCommand => "every_command".into(),
            CheckpointSetting::Seconds(n) => n.to_string(),
        }
    }

    /// What the core's settings say for it.
    pub fn to_core(self) -> AutoCheckpoint {
        match self {
            CheckpointSetting::Off => AutoCheckpoint::Off,
            CheckpointSetting::EveryCommand => AutoCheckpoint::EveryCommand,
            CheckpointSetting::Seconds(n) => AutoCheckpoint::Interval {
                ms: n.saturating_mul(1000),
            },
        }
    }
}

/// Reads `off`, `every_command` or a number of seconds (1 to a day).
pub fn parse(value: &str) -> Result<CheckpointSetting, String> {
    let expected =
        || format!("off | every_command | a number of seconds from 1 to {MAX_CHECKPOINT_SECONDS}");
    match value.trim() {
        "off" | "false" | "none" => Ok(CheckpointSetting::Off),
        "every_command" => Ok(CheckpointSetting::EveryCommand),
        n => match n.parse::<u64>() {
            Ok(n) if (1..=MAX_CHECKPOINT_SECONDS).contains(&n) => Ok(CheckpointSetting::Seconds(n)),
            _ => Err(expected()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_read_back_as_rendered_and_anything_else_is_refused_with_the_forms() {
        for (text, want) in [
            ("off", CheckpointSetting::Off),
            (" every_command ", CheckpointSetting::EveryCommand),
            ("30", CheckpointSetting::Seconds(30)),
        ] {
            let got = parse(text).expect(text);
            assert_eq!(got, want);
            assert_eq!(parse(&got.render()), Ok(got));
        }
        for bad in ["", "0", "every", "-3", "86401", "1.5"] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains("every_command"), "{bad}: {err}");
        }
        assert_eq!(
            CheckpointSetting::Seconds(2).to_core(),
            AutoCheckpoint::Interval { ms: 2000 }
        );
    }
}
