//! Local snapshots: [`LocalProvider::snapshot`] and a restore (`create_sandbox` from the
//! snapshot) of a generated, realistic workspace, against `tar | zstd` and `zstd -d | tar -x` of
//! the same tree.
//!
//! The baseline gets the same durability as the subject: its archive is fsynced (`sync FILE`),
//! as the provider fsyncs its own. The subject's snapshot also stops the sandbox (its process
//! group is killed and its workspace removed, as a microVM's disk goes with it), which the bare
//! `tar` does not do; the notes give that share separately.
//!
//! Both sides read a tree that is in the page cache (it was just written or restored). Rounds
//! alternate which side goes first where the order can be swapped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use super::stats::{median, Paired};
use super::workspace::{generate_workspace, TreeSpec, TreeStats};
use super::{BenchError, Ctx, Measurement, Mode, Quantity, Target};
use crate::clock::SystemClock;
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::local::archive::{self, ArchiveHeader};
use crate::provider::local::LocalProvider;
use crate::provider::{ProviderError, SandboxInfo, SandboxProvider, SandboxSpec, SnapshotInfo};

const BENCH: &str = "snapshot";

const TASK: &str = "bench-snapshot";

/// The workspace generator's seed (fixed, so archive sizes compare across runs).
const SEED: u64 = 2024;

fn task() -> TaskId {
    TaskId::new(TASK).expect("the bench's task id is valid")
}

fn spec(generation: u64, source_snapshot: Option<SnapshotId>) -> SandboxSpec {
    SandboxSpec::new("bench", &task(), generation, source_snapshot, 3_600_000)
}

fn provider_err(action: &str) -> impl FnOnce(ProviderError) -> BenchError + '_ {
    move |e| BenchError::failed(BENCH, format!("{action}: {e}"))
}

/// Runs a baseline shell pipeline; its time in seconds.
fn shell(script: &str, cwd: &Path, env: &[(&str, &Path)]) -> Result<f64, BenchError> {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c")
        .arg(format!("set -euo pipefail; {script}"))
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t = Instant::now();
    let out = cmd
        .output()
        .map_err(BenchError::io(BENCH, "spawn bash for the baseline"))?;
    let took = t.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(BenchError::failed(
            BENCH,
            format!(
                "baseline `{script}` failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(took)
}

fn require(tool: &'static str) -> Result<(), BenchError> {
    match std::process::Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(BenchError::MissingTool { bench: BENCH, tool })
        }
        Err(e) => Err(BenchError::io(BENCH, format!("run {tool}"))(e)),
    }
}

const PACK: &str = r#"tar -cf - . | zstd -q -3 -f -o "$ARCHIVE"; sync "$ARCHIVE""#;
const UNPACK: &str = r#"mkdir "$DEST"; zstd -q -d -c "$ARCHIVE" | tar -xf - -C "$DEST""#;

struct Results {
    snap: Paired,
    /// The archive writer alone against the same baseline samples.
    archive: Paired,
    restore: Paired,
    subject_bytes: Vec<f64>,
    baseline_bytes: Vec<f64>,
    /// Time to remove the workspace (measured on the baseline's restored copy).
    removal: Vec<f64>,
    tree: TreeStats,
}

fn remove(path: &Path) -> Result<f64, BenchError> {
    let t = Instant::now();
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(t.elapsed().as_secs_f64()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0.0),
        Err(e) => Err(BenchError::io(BENCH, format!("remove {}", path.display()))(
            e,
        )),
    }
}

/// The archive alone, as the provider writes it (`archive::pack`, then fsync); seconds.
fn pack_only(ws: &Path, out: &Path) -> Result<f64, BenchError> {
    let header = ArchiveHeader {
        task_id: TASK.into(),
        seq: 0,
        installation_id: "bench".into(),
        created_at: 0,
        source_sandbox: "bench".into(),
        generation: None,
        instance: None,
        nonce: None,
        cwd: None,
    };
    let t = Instant::now();
    let file = std::fs::File::create(out)
        .map_err(BenchError::io(BENCH, format!("create {}", out.display())))?;
    let (file, _) = archive::pack(ws, &header, file)
        .map_err(|e| BenchError::failed(BENCH, format!("pack {}: {e}", ws.display())))?;
    file.sync_all()
        .map_err(BenchError::io(BENCH, format!("fsync {}", out.display())))?;
    Ok(t.elapsed().as_secs_f64())
}

/// Takes a snapshot of `sandbox` through the provider: the seconds it took, and the snapshot.
async fn timed_snapshot(
    provider: &LocalProvider,
    sandbox: &SandboxId,
    seq: u64,
) -> Result<(f64, SnapshotInfo), BenchError> {
    let t = Instant::now();
    let info = provider
        .snapshot(&task(), sandbox, seq)
        .await
        .map_err(provider_err("take the snapshot"))?;
    Ok((t.elapsed().as_secs_f64(), info))
}

/// Restores `snapshot` into the task's sandbox number `generation` through the provider: the
/// seconds it took, and the sandbox.
async fn timed_restore(
    provider: &LocalProvider,
    generation: u64,
    snapshot: &SnapshotId,
) -> Result<(f64, SandboxInfo), BenchError> {
    let t = Instant::now();
    let sb = provider
        .create_sandbox(&spec(generation, Some(snapshot.clone())))
        .await
        .map_err(provider_err("restore the snapshot"))?;
    Ok((t.elapsed().as_secs_f64(), sb))
}

fn measure(dir: &Path, tree: &TreeSpec, rounds: usize) -> Result<Results, BenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io(BENCH, "start a tokio runtime"))?;
    let provider = LocalProvider::new(dir.join("local"), "bench".into(), Arc::new(SystemClock))
        .map_err(|e| BenchError::failed(BENCH, format!("open the local provider: {e}")))?;
    let archive: PathBuf = dir.join("baseline.tar.zst");
    let dest: PathBuf = dir.join("baseline-restored");
    let packed: PathBuf = dir.join("archive-only.tbx");
    rt.block_on(async {
        let mut generation = 1;
        let sb = provider
            .create_sandbox(&spec(generation, None))
            .await
            .map_err(provider_err("create the sandbox"))?;
        let workspace = |id: &str| {
            provider.workspace_path(id).ok_or_else(|| {
                BenchError::failed(BENCH, format!("sandbox {id} has no workspace on disk"))
            })
        };
        let ws = workspace(&sb.id)?;
        let tree_stats = generate_workspace(&ws, tree, SEED).map_err(BenchError::io(
            BENCH,
            format!("generate a workspace in {}", ws.display()),
        ))?;
        let mut r = Results {
            snap: Paired::default(),
            archive: Paired::default(),
            restore: Paired::default(),
            subject_bytes: Vec::new(),
            baseline_bytes: Vec::new(),
            removal: Vec::new(),
            tree: tree_stats,
        };
        let mut sb_id = sb.id;
        let mut previous_snapshot: Option<SnapshotId> = None;
        for round in 0..rounds {
            let ws = workspace(&sb_id)?;
            let pack = |ws: &Path| shell(PACK, ws, &[("ARCHIVE", archive.as_path())]);
            let unpack = || -> Result<f64, BenchError> {
                remove(&dest)?;
                let took = shell(UNPACK, dir, &[("ARCHIVE", &archive), ("DEST", &dest)])?;
                Ok(took)
            };
            let seq = round as u64 + 1;
            let (b_snap, a_pack, s_snap, snap_id, s_restore, b_restore);
            if round % 2 == 0 {
                b_snap = pack(&ws)?;
                a_pack = pack_only(&ws, &packed)?;
                let (took, info) = timed_snapshot(&provider, &sb_id, seq).await?;
                s_snap = took;
                r.subject_bytes.push(info.size_bytes as f64);
                snap_id = info.id;
                generation += 1;
                let (took, sb) = timed_restore(&provider, generation, &snap_id).await?;
                s_restore = took;
                sb_id = sb.id;
                b_restore = unpack()?;
            } else {
                let (took, info) = timed_snapshot(&provider, &sb_id, seq).await?;
                s_snap = took;
                r.subject_bytes.push(info.size_bytes as f64);
                snap_id = info.id;
                // The baseline archive of the previous round holds the same tree.
                b_restore = unpack()?;
                generation += 1;
                let (took, sb) = timed_restore(&provider, generation, &snap_id).await?;
                s_restore = took;
                sb_id = sb.id;
                let ws = workspace(&sb_id)?;
                a_pack = pack_only(&ws, &packed)?;
                b_snap = pack(&ws)?;
            }
            r.archive.subject.push(a_pack);
            r.archive.baseline.push(b_snap);
            r.snap.subject.push(s_snap);
            r.snap.baseline.push(b_snap);
            r.restore.subject.push(s_restore);
            r.restore.baseline.push(b_restore);
            r.baseline_bytes.push(
                std::fs::metadata(&archive)
                    .map_err(BenchError::io(
                        BENCH,
                        format!("inspect {}", archive.display()),
                    ))?
                    .len() as f64,
            );
            r.removal.push(remove(&dest)?);
            if let Some(old) = previous_snapshot.replace(snap_id) {
                provider
                    .delete_snapshot(&old)
                    .await
                    .map_err(provider_err("delete an old snapshot"))?;
            }
        }
        provider
            .stop_sandbox(&sb_id)
            .await
            .map_err(provider_err("stop the sandbox"))?;
        Ok(r)
    })
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    for tool in ["tar", "zstd"] {
        require(tool)?;
    }
    let (tree, rounds) = match ctx.opts.mode {
        Mode::Quick => (TreeSpec::quick(), 2),
        Mode::Standard => (TreeSpec::standard(), 3),
        Mode::Full => (TreeSpec::full(), 5),
    };
    ctx.say(&format!(
        "snapshot: a workspace of {} files, {rounds} rounds",
        tree.source_files + tree.module_files + tree.logs + tree.blobs + 1
    ));
    let dir = ctx.subdir("snapshot")?;
    let r = measure(&dir, &tree, rounds)?;
    let mb = |b: f64| b / 1e6;
    let tree_note = format!(
        "workspace: {} files in {} directories, {} MB (source tree, node_modules-like tree, logs, binary blobs)",
        super::fmt_num(r.tree.files as f64),
        super::fmt_num(r.tree.dirs as f64),
        super::fmt_num(mb(r.tree.bytes as f64))
    );
    Ok(vec![
        at_most_baseline(
            "snapshot.create",
            "LocalProvider::snapshot: archive (zstd -3 tar), fsync, stop the sandbox",
            &r.snap,
            PACK,
            rounds,
            vec![
                tree_note.clone(),
                format!(
                    "the subject includes removing the stopped sandbox's files, which alone takes about {} s (rm of the same tree)",
                    super::fmt_num(median(&r.removal))
                ),
            ],
        ),
        at_most_baseline(
            "snapshot.archive",
            "the snapshot's archive alone: archive::pack (tar walk + zstd -3 on a second thread), fsync",
            &r.archive,
            PACK,
            rounds,
            vec!["the part of snapshot.create that is taskbox's own code".into()],
        ),
        at_most_baseline(
            "snapshot.restore",
            "LocalProvider::create_sandbox from the snapshot (verified extraction)",
            &r.restore,
            UNPACK,
            rounds,
            vec![tree_note],
        ),
        Measurement::new(
            "snapshot.size",
            "snapshot archive size",
            Quantity::new(mb(median(&r.subject_bytes)), "MB"),
            "`tar | zstd -3` archive of the same tree",
            Quantity::new(mb(median(&r.baseline_bytes)), "MB"),
            None,
            Target::Report,
            rounds,
            vec![format!(
                "compression ratio {}× over {} MB of files",
                super::fmt_num(r.tree.bytes as f64 / median(&r.subject_bytes)),
                super::fmt_num(mb(r.tree.bytes as f64))
            )],
        ),
    ])
}

/// A row of seconds whose target is to take no longer than the shell pipeline `baseline`.
fn at_most_baseline(
    name: &str,
    subject_is: &str,
    p: &Paired,
    baseline: &str,
    rounds: usize,
    notes: Vec<String>,
) -> Measurement {
    Measurement::new(
        name,
        subject_is,
        Quantity::new(p.subject_median(), "s"),
        format!("`{baseline}`"),
        Quantity::new(p.baseline_median(), "s"),
        None,
        Target::RatioAtMost { ratio: 1.0 },
        rounds,
        notes,
    )
}
