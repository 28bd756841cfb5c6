//! Checkpoints (issue 34), on the local backend in its default isolation (namespaces where
//! this machine allows them; the sandbox's processes are paused by the cgroup freezer: v1's
//! `freezer` on a hybrid machine, `cgroup.freeze` on a pure v2 one), over the generated
//! workspace of the snapshot benchmark:
//!
//! - `checkpoint.pause`: the pause a process of the sandbox sees while a checkpoint of a small
//!   change is taken. A bash loop in the sandbox ticks every 2 ms (`read -t`, no fork) and
//!   records each gap over 2.5 ms between two ticks; the subject is the longest gap in the window
//!   of a checkpoint, the baseline the longest in an equal window without one (what the
//!   machine's scheduling alone costs the loop; the tick, 2 ms, when it saw no longer gap).
//! - `checkpoint.unchanged`: a checkpoint when nothing changed (the tracker, read while the
//!   processes are paused, saw nothing: no snapshot is made), against one after a small change.
//! - `checkpoint.every_command`: a command changing one small file followed by a checkpoint
//!   (what `terminal.checkpoint = every_command` adds per command), against the command alone.
//!   Provider calls: the engine adds the journal's two more transitions (a few ms).
//! - `checkpoint.rewind`: a rewind of the tree at the provider (the checkpoint of the current
//!   files, the stop of the sandbox, the restore of an older snapshot into a new one) against
//!   `zstd -d | tar -x` of an archive of the same tree.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stats::Paired;
use super::workspace::{generate_workspace, TreeSpec};
use super::{BenchError, Ctx, Measurement, Quantity, Target};
use crate::clock::SystemClock;
use crate::config::{Config, LocalIsolation};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::local::{isolation, LocalProvider};
use crate::provider::{ExecRequest, ProviderError, SandboxProvider, SandboxSpec};

const BENCH: &str = "checkpoint";
const TASK: &str = "bench-checkpoint";
const SEED: u64 = 2024;

fn task() -> TaskId {
    TaskId::new(TASK).expect("the bench's task id is valid")
}

fn spec(generation: u64, source: Option<SnapshotId>) -> SandboxSpec {
    SandboxSpec::new("bench", &task(), generation, source, 3_600_000)
}

fn provider_err(action: &str) -> impl FnOnce(ProviderError) -> BenchError + '_ {
    move |e| BenchError::failed(BENCH, format!("{action}: {e}"))
}

/// Microseconds since the epoch, as bash's `EPOCHREALTIME` without its dot.
fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The ticking loop: every gap over 2.5 ms between two ticks (a tick is 2 ms) goes to `.gaps`
/// as `END_US GAP_US`.
const TICKER: &str = r#"mkfifo .tick && exec 3<> .tick && rm .tick && ( p=${EPOCHREALTIME/./}; while :; do read -t 0.002 -u 3; n=${EPOCHREALTIME/./}; g=$((n-p)); if ((g>2500)); then echo "$n $g" >> .gaps; fi; p=$n; done ) > /dev/null 2>&1 &"#;

struct Rig {
    provider: LocalProvider,
    sandbox: SandboxId,
    generation: u64,
    seq: u64,
    latest: Option<SnapshotId>,
}

impl Rig {
    async fn exec(&self, command: &str) -> Result<f64, BenchError> {
        let t = Instant::now();
        let out = self
            .provider
            .exec(
                &self.sandbox,
                &ExecRequest {
                    command: command.to_string(),
                    timeout_ms: 60_000,
                },
            )
            .await
            .map_err(provider_err("run a command"))?;
        if out.exit_code != 0 {
            return Err(BenchError::failed(
                BENCH,
                format!("`{command}` exited {}: {}", out.exit_code, out.stderr),
            ));
        }
        Ok(super::stats::ms(t.elapsed()))
    }

    /// A checkpoint: its milliseconds, and whether it made a snapshot.
    async fn checkpoint(&mut self) -> Result<(f64, bool), BenchError> {
        self.seq += 1;
        let t = Instant::now();
        let got = self
            .provider
            .checkpoint(&task(), &self.sandbox, self.seq, self.latest.as_ref())
            .await
            .map_err(provider_err("take a checkpoint"))?;
        let took = super::stats::ms(t.elapsed());
        match got {
            Some(info) => {
                self.latest = Some(info.id);
                Ok((took, true))
            }
            None => {
                self.seq -= 1;
                Ok((took, false))
            }
        }
    }

    /// The longest gap the ticker recorded that ended within `[from, to]` (µs), in ms; the
    /// tick itself (2 ms) when it recorded none.
    fn longest_gap(&self, from: i64, to: i64) -> Result<f64, BenchError> {
        let ws = self.provider.workspace_path(&self.sandbox).ok_or_else(|| {
            BenchError::failed(BENCH, "the sandbox has no workspace on disk".to_string())
        })?;
        let text = std::fs::read_to_string(ws.join(".gaps")).unwrap_or_default();
        let longest = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter_map(|(end, gap)| Some((end.parse::<i64>().ok()?, gap.parse::<i64>().ok()?)))
            // A gap ending in the window, or spanning its end.
            .filter(|(end, gap)| *end >= from && end - gap <= to)
            .map(|(_, gap)| gap)
            .max()
            .unwrap_or(2000);
        Ok(longest as f64 / 1000.0)
    }
}

struct Results {
    pause: Paired,
    unchanged: Paired,
    every_command: Paired,
    rewind: Paired,
    files: u64,
    mode: &'static str,
    made: usize,
}

async fn measure(dir: &Path, tree: &TreeSpec, samples: usize) -> Result<Results, BenchError> {
    let (mode, mode_name) = match isolation::probe() {
        Ok(()) => (LocalIsolation::Namespaces, "namespaces"),
        Err(_) => (LocalIsolation::None, "none"),
    };
    let provider = LocalProvider::new(dir.join("local"), "bench".into(), Arc::new(SystemClock))
        .map_err(|e| BenchError::failed(BENCH, format!("open the local provider: {e}")))?
        .with_isolation(isolation::Settings {
            mode,
            ..isolation::Settings::of(&Config::default().terminal)
        });
    let sb = provider
        .create_sandbox(&spec(1, None))
        .await
        .map_err(provider_err("create the sandbox"))?;
    let mut rig = Rig {
        provider,
        sandbox: sb.id,
        generation: 1,
        seq: 0,
        latest: None,
    };
    let ws = rig.provider.workspace_path(&rig.sandbox).ok_or_else(|| {
        BenchError::failed(BENCH, "the sandbox has no workspace on disk".to_string())
    })?;
    let stats = generate_workspace(&ws, tree, SEED).map_err(BenchError::io(
        BENCH,
        format!("generate a workspace in {}", ws.display()),
    ))?;
    // The baseline's archive of the same tree.
    let archive = dir.join("tree.tar.zst");
    shell(
        &format!("tar -cf - . | zstd -q -1 -T1 -f -o '{}'", archive.display()),
        &ws,
    )?;
    rig.exec("echo 0 > small").await?;
    let (_, made) = rig.checkpoint().await?;
    if !made {
        return Err(BenchError::failed(
            BENCH,
            "the first checkpoint made no snapshot",
        ));
    }
    let first = rig.latest.clone().expect("a snapshot was made");
    let mut r = Results {
        pause: Paired::default(),
        unchanged: Paired::default(),
        every_command: Paired::default(),
        rewind: Paired::default(),
        files: stats.files,
        mode: mode_name,
        made: 1,
    };
    // Nothing changed: the second checkpoint makes none; the baseline changes one small file.
    for i in 0..samples {
        let (quiet, made) = rig.checkpoint().await?;
        if made {
            return Err(BenchError::failed(
                BENCH,
                "a checkpoint with nothing changed made a snapshot",
            ));
        }
        rig.exec(&format!("echo {i} > small")).await?;
        let (small, made) = rig.checkpoint().await?;
        r.made += usize::from(made);
        r.unchanged.subject.push(quiet);
        r.unchanged.baseline.push(small);
    }
    // Per command: a command changing one small file, then a checkpoint, against the command.
    for i in 0..samples {
        let command = format!("echo c{i} > small");
        let alone = rig.exec(&command).await?;
        let t = Instant::now();
        rig.exec(&format!("echo d{i} > small")).await?;
        let (_, made) = rig.checkpoint().await?;
        r.made += usize::from(made);
        let with = super::stats::ms(t.elapsed());
        r.every_command.subject.push(with);
        r.every_command.baseline.push(alone);
    }
    // The pause the ticker sees.
    rig.exec(TICKER).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..samples {
        let from = now_us();
        rig.exec(&format!("echo p{i} > small")).await?;
        let (took, made) = rig.checkpoint().await?;
        r.made += usize::from(made);
        tokio::time::sleep(Duration::from_millis(30)).await;
        let to = now_us();
        r.pause.subject.push(rig.longest_gap(from, to)?);
        // The same window without a checkpoint.
        let from = now_us();
        rig.exec(&format!("echo q{i} > other")).await?;
        tokio::time::sleep(Duration::from_secs_f64(took / 1000.0 + 0.03)).await;
        let to = now_us();
        r.pause.baseline.push(rig.longest_gap(from, to)?);
    }
    // Rewinds: keep the current files, stop the sandbox, restore the first checkpoint.
    for i in 0..samples.min(5) {
        let t = Instant::now();
        rig.exec(&format!("echo r{i} > small")).await?;
        let (_, made) = rig.checkpoint().await?;
        r.made += usize::from(made);
        rig.provider
            .stop_sandbox(&rig.sandbox)
            .await
            .map_err(provider_err("stop the sandbox"))?;
        rig.generation += 1;
        let sb = rig
            .provider
            .create_sandbox(&spec(rig.generation, Some(first.clone())))
            .await
            .map_err(provider_err("restore the checkpoint"))?;
        rig.sandbox = sb.id;
        let subject = t.elapsed().as_secs_f64();
        let dest = dir.join(format!("untar-{i}"));
        let baseline = shell(
            &format!(
                "mkdir '{d}' && zstd -q -d -c '{a}' | tar -xf - -C '{d}'",
                d = dest.display(),
                a = archive.display()
            ),
            dir,
        )?;
        let _ = std::fs::remove_dir_all(&dest);
        r.rewind.subject.push(subject);
        r.rewind.baseline.push(baseline);
    }
    let _ = rig.provider.stop_sandbox(&rig.sandbox).await;
    Ok(r)
}

/// Runs a baseline shell pipeline in `cwd`; its seconds.
fn shell(script: &str, cwd: &Path) -> Result<f64, BenchError> {
    let t = Instant::now();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail; {script}"))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(BenchError::io(BENCH, "spawn bash for the baseline"))?;
    if !out.status.success() {
        return Err(BenchError::failed(
            BENCH,
            format!(
                "`{script}` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(t.elapsed().as_secs_f64())
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    let (tree, samples) = ctx.opts.mode.pick(
        (TreeSpec::quick(), 5),
        (TreeSpec::standard(), 20),
        (TreeSpec::full(), 30),
    );
    ctx.say(&format!(
        "checkpoint: a workspace of {} files, {samples} samples",
        tree.file_count()
    ));
    let dir = ctx.subdir("checkpoint")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io(BENCH, "start a runtime"))?;
    let r = rt.block_on(measure(&dir, &tree, samples))?;
    let note = format!(
        "local backend, isolation {}; a workspace of {} files; {} checkpoints made",
        r.mode, r.files, r.made
    );
    Ok(vec![
        Measurement::new(
            "checkpoint.pause",
            "the longest pause a process of the sandbox saw (a loop ticking every 2 ms) over a checkpoint of one small change",
            Quantity::new(super::stats::median(&r.pause.subject), "ms"),
            "the longest pause over an equal window with no checkpoint",
            Quantity::new(super::stats::median(&r.pause.baseline), "ms"),
            Some(Quantity::new(r.pause.added_median(), "ms")),
            Target::Below { value: 50.0 },
            r.pause.subject.len(),
            vec![r.pause.spread("ms"), note.clone()],
        ),
        Measurement::paired_ms(
            "checkpoint.unchanged",
            "a checkpoint with nothing changed (no snapshot made)",
            "a checkpoint after changing one small file",
            &r.unchanged,
            Target::Below { value: 2.0 },
            vec![],
        ),
        Measurement::paired_ms(
            "checkpoint.every_command",
            "a command changing one small file, then a checkpoint (terminal.checkpoint = every_command; provider calls)",
            "the command alone",
            &r.every_command,
            Target::AddedAtMost {
                value: 40.0,
                unit: "ms",
            },
            vec![],
        ),
        Measurement::new(
            "checkpoint.rewind",
            "a rewind at the provider: checkpoint the current files, stop the sandbox, restore an older checkpoint into a new one",
            Quantity::new(r.rewind.subject_median(), "s"),
            "`zstd -d | tar -x` of an archive of the same tree",
            Quantity::new(r.rewind.baseline_median(), "s"),
            None,
            Target::RatioAtMost { ratio: 1.0 },
            r.rewind.subject.len(),
            vec![r.rewind.spread("s")],
        ),
    ])
}
