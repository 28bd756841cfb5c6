//! A throwaway PostgreSQL for the tests that need one.
//!
//! With `TASKBOX_TEST_POSTGRES_URL` set (an admin URL of a server someone else runs, e.g.
//! `.ci/run`'s), tests create their databases there. Otherwise the first test that asks starts
//! one cluster for this test process: `initdb` in a temporary directory, `postgres` on a free
//! loopback port (as `nobody` when the tests run as root: PostgreSQL refuses root), trust
//! authentication for the user `taskbox`, `fsync` off (the tests check semantics, not the
//! disk; the benchmark runs on a durable cluster). A watcher process started with it stops the
//! cluster and removes its directory when this test process ends — normally, by a panic, or
//! killed — so nothing is left running. Each test gets a database of its own.
//!
//! When PostgreSQL is not installed the test says it is skipped and why, except under
//! `CI=true`, where it fails (`.ci/run` installs it).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// An admin URL of the server the tests use (`Err`: why there is none).
fn server() -> &'static Result<Server, String> {
    static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();
    SERVER.get_or_init(|| match std::env::var("TASKBOX_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Ok(Server {
            admin_url: url.trim().to_string(),
            cluster: None,
        }),
        _ => start_cluster(),
    })
}

/// A cluster of its own for a test that stops and starts it (`None`: PostgreSQL is missing
/// outside CI, or `TASKBOX_TEST_POSTGRES_URL` points elsewhere and no cluster can be started).
pub fn private_server() -> Option<Server> {
    match start_cluster() {
        Ok(s) => Some(s),
        Err(why) => {
            crate::support::skip(format!("PostgreSQL is not available: {why}"));
            None
        }
    }
}

/// A running server: its admin URL, and the cluster when this process started it.
pub struct Server {
    admin_url: String,
    cluster: Option<Cluster>,
}

impl Server {
    /// The cluster, when this process started it.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// A fresh database on this server.
    pub fn database(&self) -> Db {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "tb_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        execute(&self.admin_url, &format!("CREATE DATABASE {name}")).expect("create database");
        let url = match self.admin_url.rfind('/') {
            Some(i) => format!("{}/{name}", &self.admin_url[..i]),
            None => panic!("admin URL without a database: {}", self.admin_url),
        };
        Db { url }
    }
}

/// A cluster this process started. Dropping it stops it and removes its directory (the
/// watcher does the same if this process ends first).
pub struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    /// Runs commands as the cluster's owner.
    as_owner: Option<&'static str>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["-m", "immediate", "-w", "stop"]);
        if let Some(dir) = self.data.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Cluster {
    /// `pg_ctl` as the cluster's owner, with `args`.
    pub fn pg_ctl(&self, args: &[&str]) -> std::process::Output {
        self.owner_cmd("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(args)
            .output()
            .expect("run pg_ctl")
    }

    fn owner_cmd(&self, tool: &str) -> Command {
        owner_cmd(self.as_owner, &self.bin.join(tool))
    }

    /// Stops the server (`fast`: disconnects clients, as a restart does).
    pub fn stop(&self) {
        let out = self.pg_ctl(&["-m", "fast", "-w", "stop"]);
        assert!(out.status.success(), "pg_ctl stop: {out:?}");
    }

    /// Starts it again on the same port.
    pub fn start(&self) {
        let log = self.data.parent().expect("cluster dir").join("server.log");
        let out = self.pg_ctl(&[
            "-w",
            "-l",
            log.to_str().expect("utf-8 path"),
            "-o",
            &server_options(self.port, self.data.parent().expect("dir")),
            "start",
        ]);
        assert!(out.status.success(), "pg_ctl start: {out:?}");
    }
}

fn owner_cmd(as_owner: Option<&str>, tool: &Path) -> Command {
    match as_owner {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--"]).arg(tool);
            c
        }
        None => Command::new(tool),
    }
}

fn server_options(port: u16, dir: &Path) -> String {
    format!(
        "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={} \
         -c fsync=off -c full_page_writes=off -c max_connections=200",
        dir.display()
    )
}

/// The directory of `initdb`, `pg_ctl` and `postgres`.
fn find_bin() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        if out.status.success() {
            candidates.push(PathBuf::from(
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            ));
        }
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
}

fn start_cluster() -> Result<Server, String> {
    let bin = find_bin().ok_or_else(|| {
        "PostgreSQL is not installed (no initdb/pg_ctl found through pg_config, \
         /usr/lib/postgresql/*/bin or PATH; `apt-get install postgresql`)"
            .to_string()
    })?;
    // SAFETY: geteuid reads the process's credentials and has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let as_owner = root.then_some("nobody");
    let dir = tempfile::Builder::new()
        .prefix("taskbox-pg-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?
        .keep();
    if root {
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).expect("no NUL");
        // nobody's ids: 65534 on Debian.
        // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
        let rc = unsafe { libc::chown(c.as_ptr(), 65534, 65534) };
        if rc != 0 {
            return Err(format!("chown {} to nobody failed", dir.display()));
        }
    }
    let data = dir.join("data");
    let out = owner_cmd(as_owner, &bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-U", "taskbox", "--auth=trust", "-E", "UTF8", "--no-sync"])
        .output()
        .map_err(|e| format!("initdb: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // The watcher: outlives this process (its own session), stops the cluster once this
    // process is gone, however it ended, and removes the directory.
    let watcher = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; \
         {owner}{pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {dir}",
        pid = std::process::id(),
        owner = as_owner.map_or(String::new(), |u| format!("runuser -u {u} -- ")),
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        dir = dir.display(),
    );
    Command::new("setsid")
        .args(["sh", "-c", &watcher])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start the cluster's watcher: {e}"))?;
    let mut last = String::new();
    for _ in 0..5 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("free port: {e}"))?
            .port();
        let cluster = Cluster {
            bin: bin.clone(),
            data: data.clone(),
            port,
            as_owner,
        };
        let log = dir.join("server.log");
        let out = cluster.pg_ctl(&[
            "-w",
            "-l",
            log.to_str().expect("utf-8 path"),
            "-o",
            &server_options(port, &dir),
            "start",
        ]);
        if out.status.success() {
            return Ok(Server {
                admin_url: format!("postgres://taskbox@127.0.0.1:{port}/postgres"),
                cluster: Some(cluster),
            });
        }
        last = std::fs::read_to_string(&log).unwrap_or_default();
        // Not started: keep the directory for the next port (the watcher removes it).
        std::mem::forget(cluster);
    }
    Err(format!("postgres did not start: {last}"))
}

/// A database of its own for one test.
pub struct Db {
    pub url: String,
}

/// A fresh database on the test server, or `None` (printing why) when PostgreSQL is missing
/// outside CI. Panics under CI when it is missing.
pub fn database() -> Option<Db> {
    match server() {
        Ok(s) => Some(s.database()),
        Err(why) => {
            crate::support::skip(format!("PostgreSQL is not available: {why}"));
            None
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Runs `sql` (one or more statements) on `url`, outside any store; returns the error text.
pub fn execute(url: &str, sql: &str) -> Result<(), String> {
    let url = url.to_string();
    let sql = sql.to_string();
    // On a thread of its own: the caller may be inside a runtime.
    std::thread::spawn(move || {
        runtime().block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            client.batch_execute(&sql).await.map_err(|e| {
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_string())
            })
        })
    })
    .join()
    .expect("no panic")
}

/// The first column of the first row of `sql` as text (`NULL` as `None`).
pub fn query_text(url: &str, sql: &str) -> Option<String> {
    let url = url.to_string();
    let sql = sql.to_string();
    std::thread::spawn(move || {
        runtime().block_on(async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            let rows = client.simple_query(&sql).await.expect("query");
            rows.into_iter().find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_string)),
                _ => None,
            })?
        })
    })
    .join()
    .expect("no panic")
}
