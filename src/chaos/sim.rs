//! One seed of deterministic simulation: the engine on the simulated platform, on a paused
//! (virtual) clock, under the seed's faults and crashes; then the checks, and the seed's digest.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

use super::check::{PlatformSandbox, PlatformSnapshot};
use super::driver::{self, Driver};
#[cfg(feature = "postgres")]
use super::fleet;
use super::workload;
use super::{
    http, witness, ChaosError, ChaosOptions, SeedReport, MAX_LIFETIME_MS, RAM_DISK, SETTLE,
    START_MS, WORKLOAD_BOUND, WORKLOAD_SALT,
};
use crate::clock::{Clock, TokioClock};
use crate::config::Config;
use crate::core::Millis;
use crate::provider::sim::{SimFaults, SimProvider};
use crate::provider::SandboxProvider;

/// Runs one seed on its own current-thread runtime with paused (virtual) time.
///
/// Must not be called from inside a tokio runtime; [`run`](super::run) calls it on threads of its own.
pub fn run_seed(seed: u64, opts: &ChaosOptions) -> Result<SeedReport, ChaosError> {
    static NEXT_DIR: AtomicU64 = AtomicU64::new(0);
    let home = opts.work_dir.join(format!(
        "taskbox-chaos-seed{seed}-{}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, Ordering::Relaxed)
    ));
    let dir_err = |source| ChaosError::DataDir {
        seed,
        path: home.clone(),
        source,
    };
    if home.exists() {
        std::fs::remove_dir_all(&home).map_err(dir_err)?;
    }
    std::fs::create_dir_all(&home).map_err(dir_err)?;
    let result = if let Some(fleet) = &opts.fleet {
        #[cfg(feature = "postgres")]
        {
            fleet::run_seed(seed, opts, fleet, &home)
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = fleet;
            Err(ChaosError::Fleet {
                seed,
                message: "this taskbox was built without the `postgres` feature".into(),
            })
        }
    } else if opts.http {
        http::run_seed(seed, opts, &home)
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(|source| ChaosError::Runtime { seed, source })
            .and_then(|rt| rt.block_on(seed_run(seed, opts, &home.join("data"))))
    };
    let mut report = match result {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&home);
            return Err(e);
        }
    };
    if report.violations.is_empty() && !opts.keep_all {
        std::fs::remove_dir_all(&home).map_err(dir_err)?;
    } else if !opts.keep_all && home.starts_with(RAM_DISK) {
        // A violating seed's data is kept for diagnosis, but not on the RAM disk, where every
        // kept seed would hold memory until the next reboot: it moves to the system temp dir.
        let kept = std::env::temp_dir().join(home.file_name().unwrap_or(home.as_os_str()));
        let moved = copy_tree(&home, &kept).and_then(|()| std::fs::remove_dir_all(&home));
        if let Err(source) = moved {
            let _ = std::fs::remove_dir_all(&kept);
            let _ = std::fs::remove_dir_all(&home);
            return Err(ChaosError::DataDir {
                seed,
                path: kept,
                source,
            });
        }
        if let Some(j) = &report.journal_file {
            report.journal_file = j.strip_prefix(&home).ok().map(|rest| kept.join(rest));
        }
        report.home = Some(kept);
    } else {
        report.home = Some(home);
    }
    Ok(report)
}

/// Copies the directory tree `from` to `to`, creating `to`: directories and regular files,
/// symlinks as symlinks; anything else (a socket a server left behind) is skipped. An entry
/// that vanishes between the listing and its copy is skipped too — the tree is a seed's
/// leftovers, and a file deleted as the seed's last processes wound down (a SQLite `-wal`
/// or `-shm` file, a workspace the fake platform discarded) was not part of what it left;
/// that race is what made this move fail with `NotFound`. Any other error names the path.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    let named = |path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    };
    let gone =
        |r: &std::io::Result<()>| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    std::fs::create_dir_all(to).map_err(named(to))?;
    let entries = match std::fs::read_dir(from) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        other => other.map_err(named(from))?,
    };
    for entry in entries {
        let entry = entry.map_err(named(from))?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = match entry.file_type() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            other => other.map_err(named(&source))?,
        };
        let copied = if kind.is_dir() {
            copy_tree(&source, &target)
        } else if kind.is_symlink() {
            std::fs::read_link(&source)
                .and_then(|link| std::os::unix::fs::symlink(link, &target))
                .map_err(named(&source))
        } else if kind.is_file() {
            std::fs::copy(&source, &target)
                .map(drop)
                .map_err(named(&source))
        } else {
            Ok(())
        };
        if !gone(&copied) {
            copied?;
        }
    }
    Ok(())
}

/// How late past a sandbox's idle deadline (`lifetime_seconds` below after its last activity)
/// the reap may come on the virtual clock: the timer fires when due, so this only covers the
/// time the event loop takes to get to it.
const IDLE_SLACK_MS: Millis = 10_000;

/// The engine configuration of a chaos run: short lifetimes, so that idle reaps, checkpoints
/// and expiries happen within a few minutes of virtual time.
fn config() -> Config {
    let mut c = Config::default();
    c.terminal.lifetime_seconds = 120;
    c.terminal.sandbox_timeout_seconds = 300;
    c.terminal.max_sandbox_lifetime_seconds = MAX_LIFETIME_MS / 1000;
    c.terminal.checkpoint_margin_seconds = 30;
    c.terminal.timeout = 60;
    c.terminal.keep_snapshots = 2;
    c
}

/// The command that shows every file the simulated workload writes (run before and after each
/// rewind).
const PROBE: &str = "cat f0; cat f1; cat f2; cat log";

/// What [`PROBE`] prints in a sandbox holding `files`: `(stdout, stderr)`.
fn probe_view(files: &std::collections::BTreeMap<String, String>) -> (String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    for name in ["f0", "f1", "f2", "log"] {
        match files.get(name) {
            Some(content) => out.push_str(content),
            None => err.push_str(&format!("cat: {name}: No such file or directory\n")),
        }
    }
    (out, err)
}

async fn seed_run(
    seed: u64,
    opts: &ChaosOptions,
    data_dir: &Path,
) -> Result<SeedReport, ChaosError> {
    let clock = Arc::new(TokioClock::starting_at(START_MS));
    let sim = Arc::new(
        SimProvider::new(seed, opts.faults.sim.clone(), clock.clone())
            .with_max_lifetime_ms(MAX_LIFETIME_MS),
    );
    let clock_dyn: Arc<dyn Clock> = clock.clone();
    let engine_side: Arc<dyn SandboxProvider> = match opts.planted_bug {
        Some(bug) => bug.wrap(sim.clone()),
        None => sim.clone(),
    };
    let witness = Arc::new(witness::Witness::new(
        engine_side,
        Some(sim.clone()),
        clock_dyn.clone(),
    ));
    let (plans, task_ids) = workload::plan(
        seed ^ WORKLOAD_SALT,
        opts.tasks,
        opts.faults.crash,
        workload::Flavor::Sim,
    );
    let d = Driver::open(seed, data_dir, witness.clone(), clock_dyn, config())
        .await
        .map_err(|source| ChaosError::Engine {
            seed,
            source: Box::new(source),
        })?;
    let records = sim.clone();
    d.set_rewind_check(driver::RewindCheck {
        probe: PROBE.into(),
        view: Some(Arc::new(move |id: &str| {
            records
                .snapshots()
                .into_iter()
                .find(|s| s.id == id)
                .map(|s| probe_view(&s.files))
        })),
    });

    // The workload, under faults; then faults off, and every task settles.
    let (tally, mut violations) = driver::run_workload(&d, plans, WORKLOAD_BOUND).await;
    sim.set_faults(SimFaults::none());
    let (settled, crashes, crash_times) = driver::settle(d, &task_ids, SETTLE).await;
    violations.extend(settled);
    let virtual_ms = clock.now_ms() - START_MS;

    // The history, checked against the platform's records.
    let rec = driver::read_store(seed, data_dir)?;
    let installation = rec.installation.clone();
    let sandboxes: Vec<_> = sim
        .all_sandboxes()
        .into_iter()
        .filter(|s| s.installation_id == installation)
        .collect();
    let snapshots: Vec<_> = sim
        .snapshots()
        .into_iter()
        .filter(|s| s.installation_id == installation)
        .collect();
    let platform_sandboxes: Vec<PlatformSandbox> = sandboxes.iter().map(Into::into).collect();
    let platform_snapshots: Vec<PlatformSnapshot> = snapshots.iter().map(Into::into).collect();
    let live = driver::live(&platform_sandboxes);
    let (checked, journal_file) = driver::check_and_export(
        driver::Evidence {
            data_dir,
            task_ids: &task_ids,
            rec: &rec,
            sandboxes: &platform_sandboxes,
            snapshots: &platform_snapshots,
            live: &live,
            deleted_at: &witness.deleted_at(),
            now: clock.now_ms(),
            keep_all: opts.keep_all,
            idle: Some(driver::IdleCheck {
                crashes: &crash_times,
                slack_ms: IDLE_SLACK_MS,
            }),
        },
        &mut violations,
    );

    let stats = sim.stats();
    let mut faults = stats.faults.clone();
    if crashes > 0 {
        faults.insert("crash".into(), crashes);
    }
    // The installation id is random (made with the store) and sandbox names end with `-` and a
    // prefix of it: the digest replaces both by `*` (as a whole JSON string, and after a `-`,
    // which nothing else in a journal puts before 8 hex digits), so equal runs hash equal.
    let prefix = crate::provider::installation_prefix(&installation);
    let mut h = Digest::new(&[
        (format!("\"{installation}\""), "\"*\""),
        (format!("-{prefix}"), "-*"),
    ]);
    for e in &rec.entries {
        h.update_json(e);
    }
    h.update_json(&stats);
    for s in &sandboxes {
        h.update_json(s);
    }
    for s in &snapshots {
        h.update_json(s);
    }
    h.update(&virtual_ms.to_le_bytes());
    h.update(&crashes.to_le_bytes());
    Ok(SeedReport {
        seed,
        tasks: opts.tasks,
        counts: tally.counts(faults, stats.calls.values().sum(), checked.counts),
        snapshots_expired: checked.expired,
        stale_sandboxes: checked.stale,
        violations,
        digest: h.finish(),
        virtual_ms,
        home: None,
        journal_file,
        repro: opts.repro_command(seed),
    })
}

/// Two FNV-1a 64-bit hashes with different offsets, printed as 32 hex digits: a stable
/// fingerprint of a run (not a cryptographic hash; it only has to tell runs apart).
pub(super) struct Digest {
    a: u64,
    b: u64,
    /// Strings that differ between equal runs (the random installation id), and what to hash
    /// instead.
    masked: Vec<(String, &'static str)>,
}

impl Digest {
    pub(super) fn new(masked: &[(String, &'static str)]) -> Digest {
        Digest {
            a: 0xCBF2_9CE4_8422_2325,
            b: 0x6C62_272E_07BB_0142,
            masked: masked.to_vec(),
        }
    }

    pub(super) fn update(&mut self, bytes: &[u8]) {
        const PRIME: u64 = 0x0000_0100_0000_01B3;
        for &b in bytes {
            self.a = (self.a ^ u64::from(b)).wrapping_mul(PRIME);
            self.b = (self.b ^ u64::from(b)).wrapping_mul(PRIME);
        }
        // A separator, so that ["ab", "c"] and ["a", "bc"] differ.
        self.a = (self.a ^ 0xFF).wrapping_mul(PRIME);
        self.b = (self.b ^ 0xFE).wrapping_mul(PRIME);
    }

    fn update_json<T: Serialize>(&mut self, value: &T) {
        // Serializing plain data structs cannot fail; an error would only shorten the digest.
        let mut text = serde_json::to_string(value).unwrap_or_default();
        for m in &self.masked {
            text = text.replace(m.0.as_str(), m.1);
        }
        self.update(text.as_bytes());
    }

    pub(super) fn finish(&self) -> String {
        format!("{:016x}{:016x}", self.a, self.b)
    }
}
