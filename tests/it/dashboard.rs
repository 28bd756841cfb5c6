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
use crate::support::{install_lock, isolation_modes, ok, run_bounded, skip, target_dir, Group};

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
    serve_tcp_with(home, &[])
}

/// [`serve_tcp`] with more arguments for `taskbox serve`.
fn serve_tcp_with(home: &ServerHome, more: &[&str]) -> (Group, String) {
    let token_file = home.home.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let log = std::fs::File::create(home.home.path().join("serve.stderr")).expect("log");
    let child = home
        .home
        .cmd()
        .args(["serve", "--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token_file)
        .args(more)
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

/// The port of `http://127.0.0.1:PORT/`.
fn url_port(url: &str) -> u16 {
    url.trim_end_matches('/')
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {url}"))
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
/// In both local isolation modes (the commands use relative paths).
#[test]
fn the_tasks_table_follows_the_cli_live() {
    for mode in isolation_modes("the_tasks_table_follows_the_cli_live") {
        let home = ServerHome::new();
        ok(&home
            .home
            .run(&["config", "set", "terminal.local_isolation", mode]));
        ok(&home
            .home
            .run(&["run", "--task", "live", "--", "echo hi > f"]));
        let (mut proc, url, token) = dashboard(&home);
        let label = format!("dashboard-{mode}");
        let shown = browse(&home, "live", &label, &url, &token, "live");
        // Ctrl-C ends `taskbox dashboard`, and its token file goes with it.
        let token_file = home
            .data()
            .join(format!("dashboard-{}.token", url_port(&url)));
        assert!(token_file.is_file(), "{}", token_file.display());
        // SAFETY: signalling the child this test spawned (still running: not yet waited for).
        unsafe { libc::kill(proc.0.id() as i32, libc::SIGINT) };
        let status = proc.0.wait().expect("wait");
        assert!(status.success(), "taskbox dashboard after Ctrl-C: {status}");
        assert!(!token_file.exists(), "the token file is removed on exit");
        if !shown {
            return;
        }
    }
}

/// A task's page draws its timeline (the SVG's state bands), its snapshots with what made them,
/// its journal in pages; the fork tree and the server page draw.
#[test]
fn a_task_page_shows_its_timeline() {
    let home = ServerHome::new();
    let (serve, url) = serve_tcp(&home);
    ok(&home
        .home
        .run(&["run", "--task", "page", "--", "echo hi > f"]));
    // More than a page of journal entries (25): the older ones are a click away.
    for n in 0..12 {
        ok(&home
            .home
            .run(&["run", "--task", "page", "--", &format!("echo {n} >> f")]));
    }
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

/// An HTTP/1.1 GET of `path` on the server's Unix socket: the status line and the body.
fn unix_get(data: &Path, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(data.join("taskbox.sock")).expect("socket");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: taskbox\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// The dashboard's HTTP surface without a browser (so it runs wherever the server does): the
/// guard (the login form, the cookie for reads only, the public assets), the all-tasks event
/// stream, the snapshots with what made them, the timeline and the costs, secrets redacted;
/// and on the Unix socket the page needs no login.
#[test]
fn the_dashboard_routes_answer_behind_the_guard() {
    const SECRET: &str = "sup3rsecretvalue7788";
    let home = ServerHome::new();
    let (serve, url) = serve_tcp(&home);
    ok(&home.home.run(&[
        "run",
        "--task",
        "guarded",
        "--",
        &format!("API_TOKEN={SECRET} true"),
    ]));
    ok(&home.home.run(&["suspend", "guarded"]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    rt.block_on(async {
        let get = |path: &str, cookie: Option<&str>| {
            let mut r = http.get(format!("{url}{}", path.trim_start_matches('/')));
            if let Some(c) = cookie {
                r = r.header("Cookie", c);
            }
            r.send()
        };
        // No credentials: the form for the page, the JSON 401 for the API, the assets public.
        let r = get("/", None).await.expect("GET /");
        assert_eq!(r.status(), 401);
        let page = r.text().await.expect("body");
        assert!(
            page.contains("name=\"token\"") && !page.contains("guarded"),
            "{page}"
        );
        let r = get("/v1/tasks", None).await.expect("GET /v1/tasks");
        assert_eq!(r.status(), 401);
        assert_eq!(
            r.json::<serde_json::Value>().await.expect("json")["code"],
            "unauthorized"
        );
        let r = get("/dashboard/costs", None).await.expect("costs");
        assert_eq!(r.status(), 401);
        let r = get("/dashboard/assets/app.js", None).await.expect("app.js");
        assert_eq!(r.status(), 200);

        // A wrong token: the form again, no cookie.
        let login = |token: &str| {
            http.post(format!("{url}dashboard/login"))
                .header("Content-Type", "application/x-www-form-urlencoded")
                .body(format!("token={token}"))
                .send()
        };
        let r = login("wrong-token-000000000").await.expect("login");
        assert_eq!(r.status(), 401);
        assert!(r.headers().get("set-cookie").is_none());
        assert!(r
            .text()
            .await
            .expect("body")
            .contains("That is not the server"));

        // The right one: a session cookie that is not the token, for reads only.
        let r = login(TOKEN).await.expect("login");
        assert_eq!(r.status(), 303);
        let set = r.headers()["set-cookie"]
            .to_str()
            .expect("ascii")
            .to_string();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict") && !set.contains(TOKEN),
            "{set}"
        );
        let cookie = set.split(';').next().expect("name=value").to_string();
        let r = get("/v1/tasks", Some(&cookie)).await.expect("tasks");
        assert_eq!(r.status(), 200);
        assert!(r.text().await.expect("body").contains("guarded"));
        let r = http
            .post(format!("{url}v1/tasks/guarded/resume"))
            .header("Cookie", &cookie)
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status(), 401, "a POST with only the cookie is refused");

        // What the task page reads: the snapshot made by the suspend, the timeline, the costs —
        // none with the secret.
        let r = get("/dashboard/tasks/guarded/snapshots", Some(&cookie))
            .await
            .expect("snaps");
        let snaps: serde_json::Value = r.json().await.expect("json");
        assert_eq!(snaps[0]["made_by"], "suspend", "{snaps}");
        let r = get("/dashboard/tasks/guarded/timeline.svg", Some(&cookie))
            .await
            .expect("svg");
        assert_eq!(r.headers()["content-type"], "image/svg+xml");
        let svg = r.text().await.expect("body");
        assert!(svg.starts_with("<svg") && svg.contains("guarded"), "{svg}");
        let r = get("/dashboard/costs", Some(&cookie)).await.expect("costs");
        let costs = r.text().await.expect("body");
        assert!(costs.contains("\"backend\":\"local\""), "{costs}");
        for text in [snaps.to_string(), svg, costs] {
            assert!(
                !text.contains(SECRET),
                "a secret in the dashboard's data: {text}"
            );
        }
        let r = get("/dashboard/tasks/nope/snapshots", Some(&cookie))
            .await
            .expect("404");
        assert_eq!(r.status(), 404);

        // The event stream: `hello`, then another task's transitions as the CLI makes them.
        let mut events = get("/dashboard/events", Some(&cookie))
            .await
            .expect("events");
        assert_eq!(events.status(), 200);
        let first = events.chunk().await.expect("chunk").expect("a line");
        assert_eq!(&first[..], b"{\"type\":\"hello\"}\n");
        let cli = home
            .home
            .cmd()
            .args(["run", "--task", "other", "--", "true"])
            .output();
        let mut seen = String::new();
        while !seen.contains("\"task\":\"other\"") {
            let chunk = tokio::time::timeout(Duration::from_secs(60), events.chunk())
                .await
                .expect("a transition within 60 s")
                .expect("chunk")
                .expect("the stream goes on");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(seen.contains("\"type\":\"transition\""), "{seen}");
        ok(&cli.expect("taskbox run"));

        // Logging out forgets the cookie.
        let r = http
            .post(format!("{url}dashboard/logout"))
            .send()
            .await
            .expect("logout");
        assert_eq!(r.status(), 303);
        assert!(r.headers()["set-cookie"]
            .to_str()
            .expect("ascii")
            .contains("Max-Age=0"));
    });
    // The Unix socket is its owner's: the page, no login.
    let (status, body) = unix_get(&home.data(), "/");
    assert!(status.contains("200"), "{status}");
    assert!(body.contains("/dashboard/assets/app.js"), "{body}");
    drop(serve);
}

/// On a fleet's PostgreSQL store the server page lists the leases — the task the CLI ran, held
/// by this server with a fresh lease — and the servers that hold them; on SQLite it says no
/// other server shares the store.
#[test]
fn the_server_page_shows_a_fleets_leases() {
    let Some(db) = crate::pg::database() else {
        return;
    };
    let home = ServerHome::new();
    let (serve, url) = serve_tcp_with(&home, &["--store", &db.url]);
    let pid = home.wait_for_server();
    ok(&home.home.run(&["run", "--task", "leased", "--", "true"]));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let fleet: serde_json::Value = rt.block_on(async {
        reqwest::Client::new()
            .get(format!("{url}dashboard/fleet"))
            .bearer_auth(TOKEN)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("GET /dashboard/fleet")
            .json()
            .await
            .expect("json")
    });
    assert_eq!(fleet["store"], "postgres", "{fleet}");
    let lease = fleet["leases"]
        .as_array()
        .expect("leases")
        .iter()
        .find(|l| l["task_id"] == "leased")
        .unwrap_or_else(|| panic!("no lease of the task: {fleet}"));
    let owner = lease["owner"].as_str().expect("owner");
    assert!(owner.contains(&format!("pid {pid} ")), "{owner}");
    assert!(lease["remaining_ms"].as_i64().expect("ms") > 0, "{lease}");
    assert!(lease["token"].as_i64().expect("token") > 0, "{lease}");
    browse(&home, "fleet", "serve", &url, TOKEN, "leased");
    drop(serve);
}
