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
    let create = by_name("vercel create");
    assert!(create.ok && !create.warning);
    assert_eq!(
        create.detail,
        "POST /v3/sandboxes with image vercel/sandbox/universal (from terminal.vercel_image)"
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
        "snapshot filesystem only; live processes do not survive sandbox recreation; sandboxes are created persistent, so a platform stop snapshots them too"
    );
}

#[test]
fn doctor_shows_a_set_runtime_with_its_endpoint_and_a_deprecation_warning() {
    let t = TerminalConfig {
        vercel_runtime: Some("python3.13".into()),
        ..TerminalConfig::default()
    };
    let checks = doctor::static_checks(&t, &env_of(&[]), empty_dir().path(), NOW);
    let create = checks.iter().find(|c| c.name == "vercel create").unwrap();
    assert!(create.ok && create.warning, "{create:?}");
    assert_eq!(
        create.detail,
        "POST /v2/sandboxes with runtime python3.13 (from terminal.vercel_runtime)"
    );
    let hint = create.hint.as_deref().unwrap();
    assert!(
        hint.contains("deprecated")
            && hint.contains("taskbox config set terminal.vercel_runtime none"),
        "{hint}"
    );
    // From the environment, the hint says to unset the variable.
    let checks = doctor::static_checks(
        &TerminalConfig::default(),
        &env_of(&[("TERMINAL_VERCEL_RUNTIME", "node22")]),
        empty_dir().path(),
        NOW,
    );
    let create = checks.iter().find(|c| c.name == "vercel create").unwrap();
    assert!(create.warning);
    assert!(
        create
            .hint
            .as_deref()
            .unwrap()
            .contains("unset TERMINAL_VERCEL_RUNTIME"),
        "{:?}",
        create.hint
    );
}
