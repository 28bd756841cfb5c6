//! Where taskbox keeps things on disk: [`Paths`] (the config file and the data dir, from
//! `TASKBOX_HOME` or the XDG dirs) and the store's file in a data dir ([`store_file`]).

use std::path::{Path, PathBuf};

/// The SQLite store's file name in a data dir.
pub const STORE_FILE: &str = "taskbox.db";

/// The SQLite store of a data dir.
pub fn store_file(data_dir: &Path) -> PathBuf {
    data_dir.join(STORE_FILE)
}

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
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Paths {
        let non_empty = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(home) = non_empty("TASKBOX_HOME") {
            return Paths::under(&home);
        }
        let home = non_empty("HOME").unwrap_or_else(|| PathBuf::from("."));
        let config = non_empty("XDG_CONFIG_HOME").unwrap_or_else(|| home.join(".config"));
        let data = non_empty("XDG_DATA_HOME").unwrap_or_else(|| home.join(".local/share"));
        Paths {
            config_file: config.join("taskbox").join("config.toml"),
            data_dir: data.join("taskbox"),
        }
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
