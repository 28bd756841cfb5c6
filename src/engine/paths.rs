//! Where taskbox keeps things on disk: [`Paths`] (the config file and the data dir, from
//! `TASKBOX_HOME` or the XDG dirs) and the store's file in a data dir ([`store_file`]).

use std::path::{Path, PathBuf};

/// The SQLite store's file name in a data dir.
pub const STORE_FILE: &str = "taskbox.db";

/// The SQLite store of a data dir.
pub fn store_file(data_dir: &Path) -> PathBuf {
    data_dir.join(STORE_FILE)
}

/// The environment variable that names the data dir itself (see [`Paths::from_env`]).
pub const DATA_DIR_ENV: &str = "TASKBOX_DATA_DIR";

/// Where taskbox keeps its config and data.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The TOML config file.
    pub config_file: PathBuf,
    /// The data dir (SQLite store, local workspaces, archives, locks).
    pub data_dir: PathBuf,
}

impl Paths {
    /// `TASKBOX_HOME` (config at `$TASKBOX_HOME/config.toml`, data in `$TASKBOX_HOME/data`), or
    /// the XDG dirs (`$XDG_CONFIG_HOME/taskbox/config.toml`, `$XDG_DATA_HOME/taskbox`).
    /// `TASKBOX_DATA_DIR`, when set, names the data dir itself (the config file stays where the
    /// rest says): how a program that keeps its tasks apart (the Hermes plugin's `data_dir`)
    /// points the CLI and the server it starts at one data dir.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Paths {
        let non_empty = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut paths = if let Some(home) = non_empty("TASKBOX_HOME") {
            Paths::under(&home)
        } else {
            let home = non_empty("HOME").unwrap_or_else(|| PathBuf::from("."));
            let config = non_empty("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
            let data = non_empty("XDG_DATA_HOME").unwrap_or_else(|| home.join(".local/share"));
            Paths {
                config_file: config.join("taskbox").join("config.toml"),
                data_dir: data.join("taskbox"),
            }
        };
        if let Some(data_dir) = non_empty(DATA_DIR_ENV) {
            paths.data_dir = data_dir;
        }
        paths
    }

    /// The SQLite store in the data dir.
    pub fn store_file(&self) -> PathBuf {
        store_file(&self.data_dir)
    }

    /// Config and data under one directory.
    pub fn under(home: &Path) -> Paths {
        Paths {
            config_file: home.join("config.toml"),
            data_dir: home.join("data"),
        }
    }
}

/// Makes the data dir readable by its owner alone (0700), and the SQLite store's files 0600,
/// whatever the umask they were made under: they hold every task's files and journal. Best
/// effort: a data dir this user cannot change is left as it is, with a warning.
pub fn make_private(data_dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let store = store_file(data_dir);
    let wal = data_dir.join(format!("{STORE_FILE}-wal"));
    let shm = data_dir.join(format!("{STORE_FILE}-shm"));
    for (path, mode) in [
        (data_dir, 0o700),
        (&store, 0o600),
        (&wal, 0o600),
        (&shm, 0o600),
    ] {
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        if meta.permissions().mode() & 0o777 == mode {
            continue;
        }
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
            tracing::warn!(path = %path.display(), error = %e, "cannot make the data dir private to its owner");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn data_dir_env_names_the_data_dir_and_keeps_the_config_file() {
        let p = Paths::from_env(env(&[("TASKBOX_HOME", "/h"), ("TASKBOX_DATA_DIR", "/d")]));
        assert_eq!(p.config_file, PathBuf::from("/h/config.toml"));
        assert_eq!(p.data_dir, PathBuf::from("/d"));
        let p = Paths::from_env(env(&[("HOME", "/u"), ("TASKBOX_DATA_DIR", "/d")]));
        assert_eq!(
            p.config_file,
            PathBuf::from("/u/.config/taskbox/config.toml")
        );
        assert_eq!(p.data_dir, PathBuf::from("/d"));
        // Blank counts as unset.
        let p = Paths::from_env(env(&[("TASKBOX_HOME", "/h"), ("TASKBOX_DATA_DIR", "")]));
        assert_eq!(p.data_dir, PathBuf::from("/h/data"));
    }
}
