//! `taskbox serve` and the CLI as its client, end to end: real sockets, real processes (the
//! built binary), each test in its own `TASKBOX_HOME`, every server killed at the end.

mod api_cases;
mod busy;
mod fleet;
mod gc;
mod hostile;
mod lifecycle;
mod metrics;
mod recovery;
mod reload;
mod remote;
mod security;
mod slow;
mod vercel;
mod watch;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{stdout, wait_for, Home};

/// A home whose CLI calls go through the auto-started server, and which kills whatever server
/// serves it when dropped.
pub struct ServerHome {
    pub home: Home,
}

impl ServerHome {
    pub fn new() -> ServerHome {
        let mut home = Home::new();
        home.set_env("TASKBOX_SERVER", "auto");
        ServerHome { home }
    }

    pub fn data(&self) -> PathBuf {
        self.home.path().join("data")
    }

    /// `taskbox status --json`, when a server answers.
    pub fn status(&self) -> Option<Value> {
        let o = self.home.run(&["status", "--json"]);
        if !o.status.success() {
            return None;
        }
        serde_json::from_str(&stdout(&o)).ok()
    }

    /// The pid of the server answering now.
    pub fn server_pid(&self) -> Option<i32> {
        self.status()?["pid"].as_i64().map(|p| p as i32)
    }

    /// Waits (bounded) until a server answers; its pid.
    pub fn wait_for_server(&self) -> i32 {
        wait_for(Duration::from_secs(30), || self.server_pid()).expect("a server answers")
    }

    /// `taskbox serve ARGS` in the foreground, its stderr in `<home>/serve.stderr`.
    /// `taskbox serve --listen 127.0.0.1:0` with `token` in a 0600 token file (and `more`
    /// arguments), once it answers: the child and its TCP address.
    pub fn serve_tcp(&self, token: &str, more: &[&str]) -> (Child, String) {
        let token_file = self.home.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).expect("token");
        std::fs::set_permissions(
            &token_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod");
        let mut args = vec![
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            token_file.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(more);
        let serve = self.spawn_serve(&args);
        self.wait_for_server();
        let addr = self.status().expect("status")["tcp"]
            .as_str()
            .expect("the server's TCP address")
            .to_string();
        (serve, addr)
    }

    pub fn spawn_serve(&self, args: &[&str]) -> Child {
        let log = std::fs::File::create(self.home.path().join("serve.stderr")).expect("log");
        self.home
            .cmd()
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn serve")
    }

    pub fn serve_stderr(&self) -> String {
        std::fs::read_to_string(self.home.path().join("serve.stderr")).unwrap_or_default()
    }
}

impl Drop for ServerHome {
    fn drop(&mut self) {
        kill_server_of(&self.data());
    }
}

/// SIGKILLs the process holding the data dir's serve lock (it wrote its pid there), if it is a
/// taskbox server still.
pub fn kill_server_of(data: &Path) {
    let Some(pid) = std::fs::read_to_string(data.join("serve.lock"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if String::from_utf8_lossy(&cmdline).contains("serve") {
        sigkill(pid);
    }
}

pub fn sigkill(pid: i32) {
    // SAFETY: signalling a process this test started (directly or through the CLI).
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // It is not our child when the CLI started it: wait for it to be gone (its descriptors,
    // the serve lock's among them, are closed by then). A killed process caught in a disk sync
    // exits only when the sync returns, which on a loaded disk (a CI machine writing back a
    // fresh build) can take more than 10 s: wait long, and say so if it never goes.
    //
    // Every thread of it, not only its main one: the main thread of a killed process can be a
    // zombie while another still finishes a disk sync, and until that one exits the process's
    // descriptors stay open — its socket still listening (a client's connection is queued,
    // then reset when the socket closes) and its serve lock still held.
    wait_for(Duration::from_secs(120), || {
        let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Some(()); // gone
        };
        threads
            .flatten()
            .all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // Gone meanwhile, or a zombie awaiting its parent.
                stat.is_empty() || stat.contains(") Z")
            })
            .then_some(())
    })
    .unwrap_or_else(|| panic!("process {pid} is still alive 120 s after its SIGKILL"));
}
