//! The dashboard (`docs/dashboard.md`) in a real browser: headless Chromium (Debian's
//! `/usr/bin/chromium`, or `$CHROMIUM`) driven by Playwright's `playwright-core` through
//! `tests/dashboard/drive.mjs`, against real servers started by the CLI.
//!
//! On a fresh clone `playwright-core` is not installed: the test copies `tests/dashboard` to
//! `<target>/dashboard-browser` and runs `npm ci` there itself, under a file lock (parallel tests
//! install it once). Without Node.js, npm, the registry or Chromium the tests say they are
//! skipped and why — except under `CI=true`, where they fail. Screenshots of every page go to
//! `<target>/dashboard-shots/`.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::server::ServerHome;
use crate::support::{install_lock, ok, run_bounded, skip, target_dir, Group};

/// The server's token in these tests.
const TOKEN: &str = "dash-tok-8c1e5a7f3b9d2e60";

/// The file that says `playwright-core` is installed.
const MARKER: &str = "node_modules/playwright-core/package.json";

/// How long one browser scenario may take (a loaded 2-core machine starts Chromium slowly).
const SCENARIO_LIMIT: Duration = Duration::from_secs(300);

/// The browser, `node` and `playwright-core`, ready: the directory holding the driver script.
/// `Err` says what is missing.
fn browser_ready() -> Result<PathBuf, String> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).is_file() {
        return Err(format!(
            "no Chromium at {chromium} (install Debian's `chromium`, or set CHROMIUM)"
        ));
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard");
    let dir = target_dir().join("dashboard-browser");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let _lock = install_lock(&dir.join(".npm-ci.lock"))?;
    for f in ["package.json", "package-lock.json", "drive.mjs"] {
        std::fs::copy(src.join(f), dir.join(f))
            .map_err(|e| format!("cannot copy tests/dashboard/{f}: {e}"))?;
    }
    if dir.join(MARKER).is_file() {
        return Ok(dir);
    }
    for tool in ["node", "npm"] {
        match Command::new(tool).arg("--version").output() {
            Ok(o) if o.status.success() => {}
            _ => {
                return Err(format!(
                    "`{tool}` is not installed (the test needs Node.js >= 20)"
                ))
            }
        }
    }
    let mut npm = Command::new("npm");
    npm.args([
        "ci",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "--prefix",
    ])
    .arg(&dir)
    // A registry that does not answer must not hang the test run.
    .env("npm_config_fetch_retries", "1")
    .env("npm_config_fetch_timeout", "60000");
    match run_bounded(npm, Duration::from_secs(600), "npm ci")? {
        (true, _) if dir.join(MARKER).is_file() => Ok(dir),
        (_, out) => Err(format!(
            "`npm ci` of playwright-core failed (is the npm registry reachable?): {}",
            out.lines().take(4).collect::<Vec<_>>().join(" | ")
        )),
    }
}

/// Runs scenario `name` of `drive.mjs` against `url` (`label` starts its screenshots' names);
/// panics with its output when it fails. `false`: skipped (no browser; never under CI).
fn browse(home: &ServerHome, name: &str, label: &str, url: &str, token: &str, task: &str) -> bool {
    let dir = match browser_ready() {
        Ok(d) => d,
        Err(why) => {
            skip(why);
            return false;
        }
    };
    let mut node = Command::new("node");
    node.arg(dir.join("drive.mjs"))
        .arg(name)
        .env("DASH_URL", url)
        .env("DASH_TOKEN", token)
        .env("DASH_TASK", task)
        .env("DASH_LABEL", label)
        .env("DASH_SHOTS", target_dir().join("dashboard-shots"))
        .env("TASKBOX_BIN", env!("CARGO_BIN_EXE_taskbox"))
        .env("TASKBOX_HOME", home.home.path())
        .env("TASKBOX_SERVER", "auto");
    let (success, out) = run_bounded(node, SCENARIO_LIMIT, "the browser scenario")
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(
        success && out.contains(&format!("ok {name}")),
        "the dashboard scenario `{name}` failed:\n{out}\nserver log:\n{}",
        home.serve_stderr()
    );
    true
}

/// A server of `home` on `--listen 127.0.0.1:0` with [`TOKEN`]; the server process and its URL.
fn serve_tcp(home: &ServerHome) -> (Group, String) {
    let token_file = home.home.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let log = std::fs::File::create(home.home.path().join("serve.stderr")).expect("log");
    let child = home
        .home
        .cmd()
        .args(["serve", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("spawn serve");
    let serve = Group(child);
    home.wait_for_server();
    let addr = home.status().expect("status")["tcp"]
        .as_str()
        .expect("the server's TCP address")
        .to_string();
    (serve, format!("http://{addr}/"))
}

/// `taskbox dashboard --json` for `home`: the process, its URL and the token from its file.
fn dashboard(home: &ServerHome) -> (Group, String, String) {
    let child = home
        .home
        .cmd()
        .args(["dashboard", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn taskbox dashboard");
    let mut proc = Group(child);
    let out = proc.0.stdout.take().expect("stdout");
    // The object comes once the port is bound; it ends with a line `}` (or the process ends).
    let mut text = String::new();
    let mut lines = BufReader::new(out).lines();
    while let Some(Ok(line)) = lines.next() {
        text.push_str(&line);
        if line == "}" {
            break;
        }
    }
    let v: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("`taskbox dashboard --json` printed {text:?}: {e}"));
    let url = v["url"].as_str().expect("url").to_string();
    let file = PathBuf::from(v["token_file"].as_str().expect("token_file"));
    let mode = std::fs::metadata(&file)
        .expect("token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the token file is for its user only");
    let token = std::fs::read_to_string(&file)
        .expect("token")
        .trim()
        .to_string();
    assert!(!url.contains(&token), "the token is not in the URL: {url}");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    (proc, url, token)
}

/// The tasks table of `taskbox dashboard` shows a task the CLI started, then follows it without
/// a reload: `suspend` turns it `expired` with one snapshot, a new task appears, a `run`
/// restores it.
#[test]
fn the_tasks_table_follows_the_cli_live() {
    let home = ServerHome::new();
    ok(&home
        .home
        .run(&["run", "--task", "live", "--", "echo hi > f"]));
    let (proc, url, token) = dashboard(&home);
    browse(&home, "live", "dashboard", &url, &token, "live");
    drop(proc);
}

/// A task's page draws its timeline (the SVG's state bands), its snapshots with what made them,
/// its journal; the fork tree and the server page draw.
#[test]
fn a_task_page_shows_its_timeline() {
    let home = ServerHome::new();
    let (serve, url) = serve_tcp(&home);
    ok(&home
        .home
        .run(&["run", "--task", "page", "--", "echo hi > f"]));
    ok(&home.home.run(&["suspend", "page"]));
    ok(&home.home.run(&["fork", "page", "page-fork"]));
    browse(&home, "task", "serve", &url, TOKEN, "page");
    drop(serve);
}

/// Without the token, or with a wrong one, the dashboard shows the login form and no data; the
/// cookie it sets is HttpOnly and SameSite=Strict, and a POST with only the cookie is refused.
/// On `serve --listen` and on `taskbox dashboard`'s port alike.
#[test]
fn a_wrong_or_missing_token_shows_the_login_and_no_data() {
    let home = ServerHome::new();
    let (serve, url) = serve_tcp(&home);
    ok(&home.home.run(&["run", "--task", "secretive", "--", "true"]));
    if !browse(&home, "auth", "serve", &url, TOKEN, "secretive") {
        return;
    }
    let (proc, url, token) = dashboard(&home);
    browse(&home, "auth", "dashboard", &url, &token, "secretive");
    drop(proc);
    drop(serve);
}
