//! [`CommandEnv`]: the variables a user passes to commands on purpose — `terminal.env` in the
//! config, `taskbox run --env K=V`, the API's and MCP's `env`, Hermes's forwarded variables.
//!
//! Beside them a command gets only its clean base (`PATH`, `HOME`, `LANG`, `TERM`, the
//! `TASKBOX_*` variables that describe its sandbox): nothing of the server's environment. The
//! values are secrets by default: the type's `Debug` shows the names only, they ride on a
//! command's live side (`provider::ExecIo`, never journaled nor serialized by the engine), and
//! `config get` hides them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The prefix of the variables taskbox sets itself (`TASKBOX_WORKSPACE`, `TASKBOX_TASK_ID`,
/// `TASKBOX_SANDBOX`); a user variable may not take one of them over.
pub const RESERVED_PREFIX: &str = "TASKBOX_";

/// The most bytes (names, values and `=`s) a [`CommandEnv`] holds: far below Linux's limit on
/// a process's environment and arguments, and below a single string's (128 KiB).
pub const MAX_ENV_BYTES: usize = 64 * 1024;

/// A variable that cannot be passed to a command, naming it (never its value) and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// Not a shell variable's name.
    #[error(
        "`{name}` is not a variable name: a name is a letter or `_`, then letters, digits or `_`"
    )]
    BadName {
        /// The name given (cut to 64 characters).
        name: String,
    },
    /// A name taskbox sets itself.
    #[error(
        "`{name}` cannot be set: TASKBOX_* variables are taskbox's own (they name the command's \
         task, sandbox and workspace, and stay true only if taskbox alone sets them)"
    )]
    Reserved {
        /// The name given.
        name: String,
    },
    /// A value with a NUL byte, which no process environment can hold.
    #[error("the value of `{name}` contains a NUL byte, which no environment can hold")]
    Nul {
        /// The variable.
        name: String,
    },
    /// `--env K` for a `K` the CLI's own environment does not have.
    #[error("`{name}` is not set in this environment, so `--env {name}` has no value to pass")]
    Unset {
        /// The variable.
        name: String,
    },
    /// More than [`MAX_ENV_BYTES`] in all.
    #[error("the variables passed hold {bytes} bytes, over the {MAX_ENV_BYTES} allowed")]
    TooLarge {
        /// Their size.
        bytes: usize,
    },
}

impl EnvError {
    /// How to fix it.
    pub fn hint(&self) -> String {
        match self {
            EnvError::BadName { .. } => "write each variable as NAME=VALUE, e.g. NODE_ENV=test",
            EnvError::Reserved { .. } => {
                "pick another name; read the task's id and workspace from TASKBOX_TASK_ID and \
                 TASKBOX_WORKSPACE inside the command"
            }
            EnvError::Nul { .. } => "remove the NUL byte from the value",
            EnvError::Unset { .. } => "export it first, or pass it as --env NAME=VALUE",
            EnvError::TooLarge { .. } => "pass large data as a file in the workspace instead",
        }
        .to_string()
    }
}

/// Variables passed to commands on purpose, by name: every name a shell variable's
/// (`[A-Za-z_][A-Za-z0-9_]*`), none `TASKBOX_*`, no value with a NUL, at most
/// [`MAX_ENV_BYTES`] in all — checked wherever one is made, deserialized included.
///
/// Its `Debug` lists the names only: the values are secrets.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    try_from = "BTreeMap<String, String>",
    into = "BTreeMap<String, String>"
)]
pub struct CommandEnv(BTreeMap<String, String>);

impl CommandEnv {
    /// No variables.
    pub fn new() -> CommandEnv {
        CommandEnv::default()
    }

    /// Sets `name` to `value` (replacing an earlier value), or says why it cannot.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), EnvError> {
        check_name(name)?;
        if value.contains('\0') {
            return Err(EnvError::Nul { name: name.into() });
        }
        let old = self.0.insert(name.to_string(), value.to_string());
        let bytes = self.bytes();
        if bytes > MAX_ENV_BYTES {
            match old {
                Some(old) => self.0.insert(name.to_string(), old),
                None => self.0.remove(name),
            };
            return Err(EnvError::TooLarge { bytes });
        }
        Ok(())
    }

    /// Sets one variable written as `docker run --env` takes it: `NAME=VALUE`, or `NAME` alone
    /// for its value in `lookup` (the caller's own environment).
    pub fn assign(
        &mut self,
        arg: &str,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(), EnvError> {
        match arg.split_once('=') {
            Some((name, value)) => self.set(name, value),
            None => {
                check_name(arg)?;
                let value = lookup(arg).ok_or_else(|| EnvError::Unset { name: arg.into() })?;
                self.set(arg, &value)
            }
        }
    }

    /// These variables over `base`: a name in both takes this one's value (a run's `--env`
    /// over `terminal.env`).
    pub fn over(&self, base: &CommandEnv) -> CommandEnv {
        let mut all = base.0.clone();
        all.extend(self.0.iter().map(|(k, v)| (k.clone(), v.clone())));
        CommandEnv(all)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The variables, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The variables as a map (the Vercel API's `env`).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0.clone()
    }

    fn bytes(&self) -> usize {
        self.0.iter().map(|(k, v)| k.len() + v.len() + 2).sum()
    }
}

impl std::fmt::Debug for CommandEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

impl TryFrom<BTreeMap<String, String>> for CommandEnv {
    type Error = EnvError;
    fn try_from(map: BTreeMap<String, String>) -> Result<CommandEnv, EnvError> {
        let mut env = CommandEnv::new();
        for (k, v) in &map {
            env.set(k, v)?;
        }
        Ok(env)
    }
}

impl From<CommandEnv> for BTreeMap<String, String> {
    fn from(env: CommandEnv) -> BTreeMap<String, String> {
        env.0
    }
}

/// Whether `name` may be passed: a shell variable's name, not `TASKBOX_*`.
fn check_name(name: &str) -> Result<(), EnvError> {
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Err(EnvError::BadName {
            name: name.chars().take(64).collect(),
        });
    }
    if name.starts_with(RESERVED_PREFIX) {
        return Err(EnvError::Reserved { name: name.into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_shell_names_and_taskbox_keeps_its_own() {
        let mut env = CommandEnv::new();
        for good in ["A", "_x", "NODE_ENV", "a1_B2", "TASKBOXX"] {
            env.set(good, "v").expect(good);
        }
        for bad in ["", "1A", "A-B", "A B", "A=B", "É", "a.b"] {
            assert!(
                matches!(env.set(bad, "v"), Err(EnvError::BadName { .. })),
                "{bad:?}"
            );
        }
        for own in ["TASKBOX_WORKSPACE", "TASKBOX_TASK_ID", "TASKBOX_ANYTHING"] {
            let err = env.set(own, "v").expect_err(own);
            assert!(matches!(err, EnvError::Reserved { .. }), "{own}");
            assert!(err.to_string().contains("taskbox's own"), "{err}");
        }
        assert!(matches!(
            env.set("K", "a\0b"),
            Err(EnvError::Nul { name }) if name == "K"
        ));
    }

    #[test]
    fn an_assignment_is_docker_s_and_a_bare_name_comes_from_the_caller() {
        let lookup = |k: &str| (k == "HAS").then(|| "from-caller".to_string());
        let mut env = CommandEnv::new();
        env.assign("A=1=2", lookup).expect("split at the first =");
        env.assign("EMPTY=", lookup).expect("an empty value");
        env.assign("HAS", lookup).expect("taken from the caller");
        let got: Vec<(&str, &str)> = env.iter().collect();
        assert_eq!(got, [("A", "1=2"), ("EMPTY", ""), ("HAS", "from-caller")]);
        assert_eq!(
            env.assign("MISSING", lookup),
            Err(EnvError::Unset {
                name: "MISSING".into()
            })
        );
        assert!(matches!(
            env.assign("=secret", lookup),
            Err(EnvError::BadName { name }) if name.is_empty()
        ));
    }

    #[test]
    fn debug_and_errors_never_show_a_value() {
        let mut env = CommandEnv::new();
        env.set("TOKEN", "sk-live-VALUE").expect("valid");
        assert_eq!(format!("{env:?}"), r#"{"TOKEN"}"#);
        let err = env
            .assign("BAD NAME=sk-live-VALUE", |_| None)
            .expect_err("a space");
        assert!(!err.to_string().contains("VALUE"), "{err}");
        let big = "x".repeat(MAX_ENV_BYTES);
        let err = env.set("BIG", &big).expect_err("too large");
        assert!(matches!(err, EnvError::TooLarge { .. }));
        assert_eq!(env.names().collect::<Vec<_>>(), ["TOKEN"], "left unchanged");
    }

    #[test]
    fn a_later_variable_wins_and_deserializing_checks_every_name() {
        let mut base = CommandEnv::new();
        base.set("A", "base").expect("valid");
        base.set("B", "base").expect("valid");
        let mut run = CommandEnv::new();
        run.set("B", "run").expect("valid");
        let over = run.over(&base);
        let all: Vec<(&str, &str)> = over.iter().collect();
        assert_eq!(all, [("A", "base"), ("B", "run")]);
        let ok: CommandEnv = serde_json::from_str(r#"{"K":"v"}"#).expect("valid");
        assert_eq!(
            serde_json::to_string(&ok).expect("serializes"),
            r#"{"K":"v"}"#
        );
        let err = serde_json::from_str::<CommandEnv>(r#"{"TASKBOX_X":"v"}"#).expect_err("own");
        assert!(err.to_string().contains("taskbox's own"), "{err}");
    }
}
