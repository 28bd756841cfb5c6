//! The `fake-vercel` recipe of `docs/backends.md` ("An offline Vercel") works as written on a
//! fresh config (issue 32 item 20): its lines are read from the document and run one by one,
//! with the default `terminal.server` and only the fake's port changed (the document's 8790 may
//! be taken; the fake listens on a free one and the lines get its address).

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use crate::server::ServerHome;
use crate::support::{ok, stdout};

/// The recipe's port, replaced by the fake's.
const DOC_ADDR: &str = "127.0.0.1:8790";

/// The lines of the first `sh` block after the recipe's heading, comments cut.
fn recipe_lines() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/backends.md"))
        .expect("docs/backends.md");
    let after = doc
        .split_once("## An offline Vercel: `taskbox fake-vercel`")
        .expect("the recipe's heading")
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("```"))
        .expect("the recipe's sh block")
        .0;
    block
        .lines()
        .map(|l| l.split(" #").next().unwrap_or(l).trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// A recipe line: its leading `NAME=value` words, the `taskbox` arguments, and a trailing `&`.
fn parse(line: &str) -> (Vec<(String, String)>, Vec<String>, bool) {
    let (line, background) = match line.strip_suffix('&') {
        Some(l) => (l.trim(), true),
        None => (line, false),
    };
    let mut words = line.split_whitespace().peekable();
    let mut env = Vec::new();
    while let Some((k, v)) = words.peek().and_then(|w| w.split_once('=')) {
        env.push((k.to_string(), v.to_string()));
        words.next();
    }
    assert_eq!(
        words.next(),
        Some("taskbox"),
        "a recipe line runs taskbox: {line}"
    );
    (env, words.map(str::to_string).collect(), background)
}

#[test]
fn the_fake_vercel_recipe_works_as_written() {
    let lines = recipe_lines();
    assert!(lines.len() >= 3, "{lines:?}");
    let h = ServerHome::new();
    let mut fake = None;
    let mut addr = DOC_ADDR.to_string();
    let mut ran = None;
    for line in &lines {
        let (env, args, background) = parse(line);
        let args: Vec<String> = args.iter().map(|a| a.replace(DOC_ADDR, &addr)).collect();
        // The CLI as a fresh user has it: no TASKBOX_SERVER (the default, auto).
        let mut cmd = h.home.cmd();
        cmd.env_remove("TASKBOX_SERVER").envs(env).args(&args);
        if background {
            assert_eq!(
                args[0], "fake-vercel",
                "only the fake runs in the background"
            );
            let port_free: Vec<String> = args
                .iter()
                .map(|a| a.replace(&addr, "127.0.0.1:0"))
                .collect();
            let mut child = h
                .home
                .cmd()
                .args(&port_free)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn fake-vercel");
            let mut url = String::new();
            BufReader::new(child.stdout.take().expect("stdout"))
                .read_line(&mut url)
                .expect("the fake prints its URL");
            // As the recipe's comment says: it prints http://ADDR/api.
            let url = url.trim();
            addr = url
                .strip_prefix("http://")
                .and_then(|u| u.strip_suffix("/api"))
                .unwrap_or_else(|| panic!("the fake printed {url}"))
                .to_string();
            fake = Some(KillOnDrop(child));
            continue;
        }
        let out = ok(&cmd.output().expect("taskbox"));
        if args[0] == "run" {
            ran = Some(out);
        }
    }
    assert!(fake.is_some(), "the recipe starts the fake");
    assert_eq!(ran.as_deref(), Some("hi\n"), "the recipe's command ran");
    // On the fake, not in a local sandbox: the fake counted the sandbox's creation.
    let stats = get(&addr, "/_admin/stats");
    assert!(stats.contains(r#""create_sandbox""#), "{stats}");
    assert!(stats.contains(r#""run_command""#), "{stats}");
    let show = stdout(&h.home.run(&["show", "demo", "--json"]));
    assert!(show.contains("vercel"), "the task is the fake's: {show}");
}

/// One plain HTTP/1.1 GET; the whole answer.
fn get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the fake");
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    text
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
