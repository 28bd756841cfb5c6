//! The doctor's static checks: every problem of the configuration and the credentials at once.

use taskbox::config::TerminalConfig;
use taskbox::provider::vercel::doctor;

use super::{empty_dir, env_of, NOW};

#[test]
fn doctor_static_checks_show_every_problem_at_once() {
    // 1 vCPU / 5120 MB (invalid for Vercel) and a disk size.
    let t = TerminalConfig {
        container_disk: Some(10_000),
        ..TerminalConfig::default()
    };
    let checks = doctor::static_checks(&t, &env_of(&[]), empty_dir().path(), NOW);
    let by_name = |n: &str| checks.iter().find(|c| c.name == n).expect(n).clone();
    assert!(by_name("vercel runtime").ok);
    assert_eq!(
        by_name("vercel runtime").detail,
        "node24 (from terminal.vercel_runtime)"
    );
    let res = by_name("vercel resources");
    assert!(!res.ok);
    assert!(res.detail.contains("5120") && res.hint.as_deref().unwrap().contains("2048"));
    let disk = by_name("disk setting");
    assert!(!disk.ok);
    assert_eq!(
        disk.hint.as_deref(),
        Some("unset it: taskbox config set terminal.container_disk none")
    );
    let auth = by_name("vercel auth");
    assert!(!auth.ok);
    assert!(
        auth.detail.contains("no Vercel credentials"),
        "{}",
        auth.detail
    );
    let persistence = by_name("persistence");
    assert_eq!(
        persistence.detail,
        "snapshot filesystem only; live processes do not survive sandbox recreation"
    );
}
