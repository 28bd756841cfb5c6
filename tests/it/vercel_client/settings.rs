//! Settings: the Vercel shape of `terminal.*` (vCPUs, memory, disk), the runtime and the API
//! URL, and where each value came from.

use taskbox::config::TerminalConfig;
use taskbox::provider::vercel::settings::{
    Origin, Runtime, SandboxBase, VercelConfigError, VercelSettings,
};

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
    assert_eq!(
        ok.base,
        SandboxBase::Image("vercel/sandbox/universal".into())
    );
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
    t.vercel_runtime = Some("node22".into());
    let s = VercelSettings::from_config(&t, &env_of(&[])).unwrap();
    assert_eq!(
        (s.base, s.base_origin),
        (SandboxBase::Runtime(Runtime::Node22), Origin::Config)
    );

    let env = env_of(&[("TERMINAL_VERCEL_RUNTIME", "python3.13")]);
    let s = VercelSettings::from_config(&t, &env).unwrap();
    assert_eq!(
        (s.base, s.base_origin),
        (SandboxBase::Runtime(Runtime::Python313), Origin::Env)
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

    t.vercel_runtime = Some("ruby".into());
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

#[test]
fn the_image_is_the_default_and_a_set_runtime_wins_over_it() {
    // Nothing set: the managed universal image, through v3.
    let mut t = vercel_config(1, 2048);
    let s = VercelSettings::from_config(&t, &env_of(&[])).unwrap();
    assert_eq!(
        (s.base.clone(), s.base_origin),
        (
            SandboxBase::Image("vercel/sandbox/universal".into()),
            Origin::Config
        )
    );
    assert_eq!(s.base.create_path(), "POST /v3/sandboxes");

    // The image's variable overrides the file.
    t.vercel_image = "vercel/sandbox/node:24".into();
    let env = env_of(&[("TERMINAL_VERCEL_IMAGE", "vercel/sandbox/python:3.14")]);
    let s = VercelSettings::from_config(&t, &env).unwrap();
    assert_eq!(
        (s.base, s.base_origin),
        (
            SandboxBase::Image("vercel/sandbox/python:3.14".into()),
            Origin::Env
        )
    );

    // A runtime in the file wins over an image from the environment (Hermes's rule: a set
    // runtime still wins), and goes through v2.
    t.vercel_runtime = Some("node22".into());
    let s = VercelSettings::from_config(&t, &env).unwrap();
    assert_eq!(s.base, SandboxBase::Runtime(Runtime::Node22));
    assert_eq!(s.base.create_path(), "POST /v2/sandboxes");

    // A blank or spaced image names its source.
    t.vercel_runtime = None;
    let env = env_of(&[("TERMINAL_VERCEL_IMAGE", "two words")]);
    let err = VercelSettings::from_config(&t, &env).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("TERMINAL_VERCEL_IMAGE is `two words`, which is not an image name"),
        "{err}"
    );
    assert!(err.hint().contains("unset it"), "{}", err.hint());
}

#[test]
fn the_config_file_sets_and_unsets_the_runtime_and_keeps_old_files_readable() {
    let mut cfg = taskbox::config::Config::default();
    assert_eq!(cfg.get("terminal.vercel_runtime").unwrap(), "none");
    assert_eq!(
        cfg.get("terminal.vercel_image").unwrap(),
        "vercel/sandbox/universal"
    );
    cfg.set("terminal.vercel_runtime", "node24").unwrap();
    assert_eq!(cfg.terminal.vercel_runtime.as_deref(), Some("node24"));
    cfg.set("terminal.vercel_runtime", "none").unwrap();
    assert_eq!(cfg.terminal.vercel_runtime, None);
    let err = cfg.set("terminal.vercel_image", " ").unwrap_err();
    assert!(err.to_string().contains("terminal.vercel_image"), "{err}");

    // A file written before images (`vercel_runtime = "node24"`, the old default) still reads,
    // and its runtime still wins.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, "[terminal]\nvercel_runtime = \"node24\"\n").unwrap();
    let old = taskbox::config::Config::load(&path).unwrap();
    assert_eq!(old.terminal.vercel_runtime.as_deref(), Some("node24"));
    let mut t = old.terminal.clone();
    t.container_memory = 2048;
    let s = VercelSettings::from_config(&t, &env_of(&[])).unwrap();
    assert_eq!(s.base, SandboxBase::Runtime(Runtime::Node24));
    // The default config no longer writes a runtime.
    taskbox::config::Config::default().save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("vercel_runtime"), "{text}");
}
