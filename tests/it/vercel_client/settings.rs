//! Settings: the Vercel shape of `terminal.*` (vCPUs, memory, disk), the runtime and the API
//! URL, and where each value came from.

use taskbox::config::TerminalConfig;
use taskbox::provider::vercel::settings::{Origin, Runtime, VercelConfigError, VercelSettings};

use super::{env_of, vercel_config};

#[test]
fn hermes_default_memory_is_refused_naming_both_values_and_the_valid_pair() {
    // Hermes's generic default: 1 vCPU, 5120 MB.
    let err = VercelSettings::from_config(&TerminalConfig::default(), &env_of(&[]))
        .expect_err("5120 MB with 1 vCPU is not a Vercel shape");
    assert_eq!(
        err,
        VercelConfigError::MemoryMismatch {
            cpu: 1,
            memory: 5120,
            expected: 2048
        }
    );
    assert_eq!(
        err.to_string(),
        "terminal.container_memory is 5120 but Vercel Sandbox allocates 2048 MB per vCPU: with terminal.container_cpu = 1 it must be 2048"
    );
    assert_eq!(
        err.hint(),
        "set terminal.container_memory to 2048 (2048 MB per vCPU), or pick another valid pair such as cpu 2 / memory 4096"
    );
}

#[test]
fn two_vcpus_need_4096_mb() {
    let err = VercelSettings::from_config(&vercel_config(2, 5120), &env_of(&[]))
        .expect_err("5120 MB with 2 vCPUs");
    assert_eq!(
        err.to_string(),
        "terminal.container_memory is 5120 but Vercel Sandbox allocates 2048 MB per vCPU: with terminal.container_cpu = 2 it must be 4096"
    );
    assert_eq!(
        err.hint(),
        "set terminal.container_memory to 4096 (2048 MB per vCPU), or pick another valid pair such as cpu 1 / memory 2048"
    );
    let ok = VercelSettings::from_config(&vercel_config(2, 4096), &env_of(&[])).expect("valid");
    assert_eq!((ok.vcpus, ok.memory_mb), (2, 4096));
    assert_eq!(ok.runtime, Runtime::Node24);
    assert_eq!(ok.api_url, "https://vercel.com/api");
}

#[test]
fn odd_or_too_many_vcpus_are_refused_with_a_valid_pair() {
    let err = VercelSettings::from_config(&vercel_config(3, 6144), &env_of(&[])).unwrap_err();
    assert!(
        err.to_string().contains("terminal.container_cpu is 3"),
        "{err}"
    );
    assert_eq!(
        err.hint(),
        "set terminal.container_cpu to 4 and terminal.container_memory to 8192 (2048 MB per vCPU)"
    );
    let err = VercelSettings::from_config(&vercel_config(16, 32768), &env_of(&[])).unwrap_err();
    assert!(
        err.hint().contains("terminal.container_cpu to 8"),
        "{}",
        err.hint()
    );
}

#[test]
fn a_disk_size_is_refused_with_the_command_that_unsets_it() {
    let mut t = vercel_config(1, 2048);
    t.container_disk = Some(51200);
    let err = VercelSettings::from_config(&t, &env_of(&[])).unwrap_err();
    assert_eq!(err, VercelConfigError::DiskUnsupported { disk: 51200 });
    assert!(
        err.to_string()
            .contains("custom disk sizes are not supported on Vercel Sandbox"),
        "{err}"
    );
    assert_eq!(
        err.hint(),
        "unset it: taskbox config set terminal.container_disk none"
    );
}

#[test]
fn the_runtime_env_var_overrides_the_config_and_bad_values_name_their_source() {
    let mut t = vercel_config(1, 2048);
    t.vercel_runtime = "node22".into();
    let s = VercelSettings::from_config(&t, &env_of(&[])).unwrap();
    assert_eq!(
        (s.runtime, s.runtime_origin),
        (Runtime::Node22, Origin::Config)
    );

    let env = env_of(&[("TERMINAL_VERCEL_RUNTIME", "python3.13")]);
    let s = VercelSettings::from_config(&t, &env).unwrap();
    assert_eq!(
        (s.runtime, s.runtime_origin),
        (Runtime::Python313, Origin::Env)
    );

    let env = env_of(&[("TERMINAL_VERCEL_RUNTIME", "node18")]);
    let err = VercelSettings::from_config(&t, &env).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("TERMINAL_VERCEL_RUNTIME is `node18`"),
        "{err}"
    );
    assert!(
        err.hint().contains("node24, node22, python3.13"),
        "{}",
        err.hint()
    );

    t.vercel_runtime = "ruby".into();
    let err = VercelSettings::from_config(&t, &env_of(&[])).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("terminal.vercel_runtime is `ruby`"),
        "{err}"
    );
}

#[test]
fn the_api_url_env_var_wins_and_must_be_http() {
    let t = vercel_config(1, 2048);
    let env = env_of(&[("TASKBOX_VERCEL_API_URL", "http://127.0.0.1:9/api/")]);
    let s = VercelSettings::from_config(&t, &env).unwrap();
    assert_eq!(s.api_url, "http://127.0.0.1:9/api");
    assert_eq!(s.api_url_origin, Origin::Env);
    let env = env_of(&[("TASKBOX_VERCEL_API_URL", "ftp://x")]);
    let err = VercelSettings::from_config(&t, &env).unwrap_err();
    assert!(err.to_string().contains("TASKBOX_VERCEL_API_URL"), "{err}");
}
