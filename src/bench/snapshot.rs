//! Local snapshots (content-addressed: [`cas`](crate::snapshot_store::cas)):
//! [`LocalProvider::snapshot`] and a restore (`create_sandbox` from the snapshot) of a
//! generated, realistic workspace, against `tar | zstd -1 -T1` and `zstd -d | tar -x` of the
//! same tree; the next snapshot after a small change and after an append to a large file against
//! the first one; the storage of ten snapshots with 1 % of the files changed between each
//! against one full archive.
//!
//! Every round starts from an empty content store, so its first snapshot stores everything.
//! The baseline gets the same durability as the subject: its archive is fsynced (`sync FILE`),
//! as the provider makes its own contents and manifest durable. The subject's snapshot also
//! stops the sandbox (its processes are killed, its workspace renamed away and removed in the
//! background), which the bare `tar` does not do.
//!
//! Both sides read a tree that is in the page cache (it was just written or restored). Rounds
//! alternate which side goes first where the order can be swapped. Every timed step starts on a
//! settled disk: the stopped sandboxes' files removed and every dirty page written back
//! (`sync`), so that no step is billed the writeback of the step before.
//!
//! The rows above measure an unisolated sandbox (`terminal.local_isolation = none`, set here
//! whatever the default). `snapshot.create_isolated` takes the first snapshot of the same tree
//! in an isolated sandbox (`namespaces`) after a command ran in it, so that the snapshot also
//! ends its init and namespaces, each round before or after the unisolated one in turn.
//! `snapshot.restore_isolated` restores the round's snapshot, each time with its first command
//! (`true`; an isolated sandbox starts its init and namespaces then), by an isolated and by an
//! unisolated provider on the same store, two each in turns (ABBA, the order flipped each
//! round): a restore is disk-bound, and this VM's disk drifted from 3 s to 9 s for the same
//! restore within one run, so only restores made side by side compare.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use super::stats::Paired;
use super::workspace::LARGE_FILE;
use super::workspace::{generate_workspace, TreeSpec, TreeStats};
use super::{BenchError, Ctx, Measurement, Quantity, Target};
use crate::clock::SystemClock;
use crate::config::{Config, LocalIsolation};
use crate::ids::{SandboxId, SnapshotId, TaskId};
use crate::provider::local::{isolation, LocalProvider};
use crate::provider::{ExecRequest, ProviderError, SandboxProvider, SandboxSpec};

const BENCH: &str = "snapshot";

const TASK: &str = "bench-snapshot";

/// An isolated sandbox's snapshot and restore, at most this times an unisolated one's (issue 31).
const TARGET_ISOLATED_RATIO: f64 = 1.05;

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

/// Writes every dirty page back to disk (`sync(2)`) before a timed step, so that the step is
/// not billed the writeback of what the step before wrote (a workspace generated or unpacked,
/// a restore's files): the restore rows are disk-bound, and an unpack or a restore just before
/// leaves hundreds of megabytes to write back.
fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Waits until `provider`'s stopped sandboxes' files, renamed into `trash/`, are removed (in
/// the background), then [`sync`]s: neither that removal nor the writeback left by the step
/// before slows the next timed step down (a resume comes long after a suspend).
fn settle(provider: &LocalProvider) -> Result<(), BenchError> {
    let trash = provider.root().join("trash");
    let waited = Instant::now();
    while std::fs::read_dir(&trash)
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
    {
        if waited.elapsed() > std::time::Duration::from_secs(300) {
            return Err(BenchError::failed(
                BENCH,
                "a stopped sandbox's files were not removed within 300 s",
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    sync();
    Ok(())
}

/// Runs a baseline shell pipeline (after a [`sync`]); its time in seconds.
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
    sync();
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

const PACK: &str = r#"tar -cf - . | zstd -q -1 -T1 -f -o "$ARCHIVE"; sync "$ARCHIVE""#;
const UNPACK: &str = r#"mkdir "$DEST"; zstd -q -d -c "$ARCHIVE" | tar -xf - -C "$DEST""#;

struct Results {
    /// The first snapshot (empty store) against `tar | zstd -1 -T1`.
    first: Paired,
    restore: Paired,
    /// The snapshot after changing one small file, against the first one of its round.
    small: Paired,
    /// The snapshot after appending 1 MB to the large file, against the first one.
    append: Paired,
    /// Bytes of the store and manifests after ten snapshots, 1 % changed between each.
    storage_bytes: f64,
    /// Bytes of one `tar | zstd -1` archive of the tree.
    archive_bytes: f64,
    /// The first snapshot in an isolated sandbox, against the unisolated one of its round.
    iso_first: Paired,
    /// Its restore into an isolated sandbox, against the unisolated restore of its round.
    iso_restore: Paired,
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

/// Bytes of every file below `dir`.
fn du(dir: &Path) -> Result<u64, BenchError> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d)
            .map_err(BenchError::io(BENCH, format!("list {}", d.display())))?;
        for e in entries {
            let e = e.map_err(BenchError::io(BENCH, format!("list {}", d.display())))?;
            let meta = e
                .metadata()
                .map_err(BenchError::io(BENCH, "inspect a stored file"))?;
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

/// Rewrites one small file (the project's `package.json`).
fn change_small(ws: &Path) -> Result<(), BenchError> {
    let path = ws.join("package.json");
    std::fs::write(
        &path,
        "{\n  \"name\": \"agent-project\",\n  \"version\": \"1.0.1\"\n}\n",
    )
    .map_err(BenchError::io(BENCH, format!("write {}", path.display())))
}

/// Appends 1 MB to the large file.
fn append_large(ws: &Path) -> Result<(), BenchError> {
    use std::io::Write;
    let path = ws.join(LARGE_FILE);
    let mut chunk = Vec::with_capacity(1 << 20);
    let mut x = 0x1234_5678_9abc_def1u64;
    while chunk.len() < 1 << 20 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        chunk.extend_from_slice(format!("{x:016x} appended row\n").as_bytes());
    }
    chunk.truncate(1 << 20);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(&chunk))
        .map_err(BenchError::io(
            BENCH,
            format!("append to {}", path.display()),
        ))
}

/// Rewrites every hundredth regular file below `ws` (in name order), 1 % of the files.
fn change_one_percent(ws: &Path, round: usize) -> Result<usize, BenchError> {
    let mut files = Vec::new();
    let mut stack = vec![ws.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d)
            .map_err(BenchError::io(BENCH, format!("list {}", d.display())))?;
        for e in entries {
            let e = e.map_err(BenchError::io(BENCH, "list the workspace"))?;
            let ft = e
                .file_type()
                .map_err(BenchError::io(BENCH, "inspect the workspace"))?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                files.push(e.path());
            }
        }
    }
    files.sort();
    let mut changed = 0;
    for path in files.iter().skip(round % 100).step_by(100) {
        if path.ends_with(LARGE_FILE) {
            continue;
        }
        let mut data = std::fs::read(path)
            .map_err(BenchError::io(BENCH, format!("read {}", path.display())))?;
        data.extend_from_slice(format!("\n// edit {round}\n").as_bytes());
        std::fs::write(path, data)
            .map_err(BenchError::io(BENCH, format!("write {}", path.display())))?;
        changed += 1;
    }
    Ok(changed)
}

struct Bench<'a> {
    provider: LocalProvider,
    generation: u64,
    seq: u64,
    sandbox: crate::ids::SandboxId,
    _dir: &'a Path,
}

impl Bench<'_> {
    fn workspace(&self) -> Result<PathBuf, BenchError> {
        self.provider.workspace_path(&self.sandbox).ok_or_else(|| {
            BenchError::failed(
                BENCH,
                format!("sandbox {} has no workspace on disk", self.sandbox),
            )
        })
    }

    /// Takes the next snapshot on a settled disk; its id and seconds. Then settles again: the
    /// snapshot stopped the sandbox, whose files are removed in the background, and the baseline
    /// pipeline timed next only syncs.
    async fn snapshot(&mut self) -> Result<(SnapshotId, f64), BenchError> {
        self.seq += 1;
        settle(&self.provider)?;
        let t = Instant::now();
        let info = self
            .provider
            .snapshot(&task(), &self.sandbox, self.seq)
            .await
            .map_err(provider_err("take the snapshot"))?;
        let took = t.elapsed().as_secs_f64();
        settle(&self.provider)?;
        Ok((info.id, took))
    }

    /// Restores `snap` into the next sandbox; seconds.
    async fn restore(&mut self, snap: &SnapshotId) -> Result<f64, BenchError> {
        self.generation += 1;
        settle(&self.provider)?;
        let t = Instant::now();
        let sb = self
            .provider
            .create_sandbox(&spec(self.generation, Some(snap.clone())))
            .await
            .map_err(provider_err("restore the snapshot"))?;
        let took = t.elapsed().as_secs_f64();
        self.sandbox = sb.id;
        Ok(took)
    }
}

/// The isolation settings of `mode`, the rest as the default config (and the registry) makes them.
fn settings(mode: LocalIsolation) -> isolation::Settings {
    isolation::Settings {
        mode,
        ..isolation::Settings::of(&Config::default().terminal)
    }
}

async fn open<'a>(
    dir: &'a Path,
    tree: &TreeSpec,
    mode: LocalIsolation,
) -> Result<(Bench<'a>, TreeStats), BenchError> {
    let provider = LocalProvider::new(dir.join("local"), "bench".into(), Arc::new(SystemClock))
        .map_err(|e| BenchError::failed(BENCH, format!("open the local provider: {e}")))?
        .with_isolation(settings(mode));
    let sb = provider
        .create_sandbox(&spec(1, None))
        .await
        .map_err(provider_err("create the sandbox"))?;
    let bench = Bench {
        provider,
        generation: 1,
        seq: 0,
        sandbox: sb.id,
        _dir: dir,
    };
    let ws = bench.workspace()?;
    let stats = generate_workspace(&ws, tree, SEED).map_err(BenchError::io(
        BENCH,
        format!("generate a workspace in {}", ws.display()),
    ))?;
    Ok((bench, stats))
}

fn measure(dir: &Path, tree: &TreeSpec, rounds: usize) -> Result<Results, BenchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(BenchError::io(BENCH, "start a tokio runtime"))?;
    let archive: PathBuf = dir.join("baseline.tar.zst");
    let dest: PathBuf = dir.join("baseline-restored");
    rt.block_on(async {
        let mut r = Results {
            first: Paired::default(),
            restore: Paired::default(),
            small: Paired::default(),
            append: Paired::default(),
            storage_bytes: 0.0,
            archive_bytes: 0.0,
            iso_first: Paired::default(),
            iso_restore: Paired::default(),
            tree: TreeStats::default(),
        };
        let pack = |ws: &Path| shell(PACK, ws, &[("ARCHIVE", archive.as_path())]);
        let unpack = || -> Result<f64, BenchError> {
            remove(&dest)?;
            shell(UNPACK, dir, &[("ARCHIVE", &archive), ("DEST", &dest)])
        };
        for round in 0..rounds {
            // A fresh store each round: its first snapshot stores every content.
            let round_dir = dir.join(format!("round{round}"));
            remove(&round_dir)?;
            std::fs::create_dir_all(&round_dir)
                .map_err(BenchError::io(BENCH, "create the round's directory"))?;
            // The isolated sandbox's first snapshot, before the unisolated one in odd rounds,
            // after it in even ones.
            let iso_dir = dir.join(format!("round{round}-isolated"));
            let mut iso = None;
            if round % 2 == 1 {
                iso = Some(isolated_snapshot(&iso_dir, tree).await?);
            }
            let (mut b, stats) = open(&round_dir, tree, LocalIsolation::None).await?;
            r.tree = stats;
            let (b_first, s_first, s_restore, b_restore, snap);
            if round % 2 == 0 {
                b_first = pack(&b.workspace()?)?;
                let (id, took) = b.snapshot().await?;
                s_first = took;
                s_restore = b.restore(&id).await?;
                b_restore = unpack()?;
                snap = id;
            } else {
                let (id, took) = b.snapshot().await?;
                s_first = took;
                b_restore = unpack()?; // the previous round's archive holds the same tree
                s_restore = b.restore(&id).await?;
                b_first = pack(&b.workspace()?)?;
                snap = id;
            }
            if iso.is_none() {
                iso = Some(isolated_snapshot(&iso_dir, tree).await?);
            }
            r.iso_first
                .subject
                .push(iso.expect("the isolated snapshot was taken"));
            r.iso_first.baseline.push(s_first);
            let (iso_restore, plain_restore) = paired_restores(&round_dir, &snap, round).await?;
            r.iso_restore.subject.push(iso_restore);
            r.iso_restore.baseline.push(plain_restore);
            r.archive_bytes = std::fs::metadata(&archive)
                .map_err(BenchError::io(
                    BENCH,
                    format!("inspect {}", archive.display()),
                ))?
                .len() as f64;
            r.first.subject.push(s_first);
            r.first.baseline.push(b_first);
            r.restore.subject.push(s_restore);
            r.restore.baseline.push(b_restore);
            remove(&dest)?;

            change_small(&b.workspace()?)?;
            let (id, s_small) = b.snapshot().await?;
            r.small.subject.push(s_small);
            r.small.baseline.push(s_first);
            b.restore(&id).await?;
            append_large(&b.workspace()?)?;
            let (_, s_append) = b.snapshot().await?;
            r.append.subject.push(s_append);
            r.append.baseline.push(s_first);
            drop(b);
            remove(&round_dir)?;
        }

        // Storage: ten snapshots of one workspace, 1 % of its files changed between each.
        let storage_dir = dir.join("storage");
        remove(&storage_dir)?;
        std::fs::create_dir_all(&storage_dir)
            .map_err(BenchError::io(BENCH, "create the storage directory"))?;
        let (mut b, _) = open(&storage_dir, tree, LocalIsolation::None).await?;
        for i in 0..10 {
            if i > 0 {
                change_one_percent(&b.workspace()?, i)?;
            }
            let (id, _) = b.snapshot().await?;
            b.restore(&id).await?;
        }
        let local = storage_dir.join("local");
        r.storage_bytes = (du(&local.join("cas"))? + du(&local.join("snapshots"))?) as f64;
        b.provider
            .stop_sandbox(&b.sandbox)
            .await
            .map_err(provider_err("stop the sandbox"))?;
        drop(b);
        remove(&storage_dir)?;
        Ok(r)
    })
}

/// The first snapshot of the tree in an isolated sandbox (in `dir`, removed after), taken
/// after a command ran in it (so that its init and namespaces are up, and the snapshot ends
/// them): its seconds.
async fn isolated_snapshot(dir: &Path, tree: &TreeSpec) -> Result<f64, BenchError> {
    remove(dir)?;
    std::fs::create_dir_all(dir).map_err(BenchError::io(
        BENCH,
        "create the isolated round's directory",
    ))?;
    let (mut b, _) = open(dir, tree, LocalIsolation::Namespaces).await?;
    first_command(&b.provider, &b.sandbox).await?;
    let (_, snapshot) = b.snapshot().await?;
    drop(b);
    remove(dir)?;
    Ok(snapshot)
}

/// The task the paired restores restore into (a snapshot of [`TASK`] restores into another
/// task as a fork's does).
fn pair_task() -> TaskId {
    TaskId::new("bench-snapshot-restore").expect("the bench's task id is valid")
}

/// `true` in `sandbox`, which must succeed.
async fn first_command(provider: &LocalProvider, sandbox: &SandboxId) -> Result<(), BenchError> {
    let out = provider
        .exec(
            sandbox,
            &ExecRequest {
                command: "true".into(),
                timeout_ms: 60_000,
            },
        )
        .await
        .map_err(provider_err("run a sandbox's first command"))?;
    if out.exit_code != 0 {
        return Err(BenchError::failed(
            BENCH,
            format!(
                "`true` exited {} in a sandbox: {}",
                out.exit_code, out.stderr
            ),
        ));
    }
    Ok(())
}

/// The restore comparison of one round: `snap` restored, each time with its first command
/// (`true`: an isolated sandbox starts its init and namespaces then), by an isolated and an
/// unisolated provider on the same store, in turns — ABBA, the order flipped each round — so
/// that the disk's drift over the round (its writeback, the host's other guests) falls on both
/// sides alike. Their mean seconds: (isolated, unisolated).
async fn paired_restores(
    dir: &Path,
    snap: &SnapshotId,
    round: usize,
) -> Result<(f64, f64), BenchError> {
    let provider = |mode| {
        LocalProvider::new(dir.join("local"), "bench".into(), Arc::new(SystemClock))
            .map(|p| p.with_isolation(settings(mode)))
            .map_err(|e| BenchError::failed(BENCH, format!("open the local provider: {e}")))
    };
    let sides = [
        provider(LocalIsolation::None)?,
        provider(LocalIsolation::Namespaces)?,
    ];
    let order = if round.is_multiple_of(2) {
        [1, 0, 0, 1]
    } else {
        [0, 1, 1, 0]
    };
    let mut took = [0.0_f64; 2];
    for (generation, side) in (1_u64..).zip(order) {
        let p = &sides[side];
        settle(p)?;
        let spec = SandboxSpec::new(
            "bench",
            &pair_task(),
            generation,
            Some(snap.clone()),
            3_600_000,
        );
        let t = Instant::now();
        let sb = p
            .create_sandbox(&spec)
            .await
            .map_err(provider_err("restore the snapshot"))?;
        first_command(p, &sb.id).await?;
        took[side] += t.elapsed().as_secs_f64() / 2.0;
        p.stop_sandbox(&sb.id)
            .await
            .map_err(provider_err("stop a restored sandbox"))?;
    }
    Ok((took[1], took[0]))
}

pub(super) fn run(ctx: &mut Ctx<'_>) -> Result<Vec<Measurement>, BenchError> {
    for tool in ["tar", "zstd"] {
        require(tool)?;
    }
    let (tree, rounds) = ctx.opts.mode.pick(
        (TreeSpec::quick(), 2),
        (TreeSpec::standard(), 3),
        (TreeSpec::full(), 3),
    );
    ctx.say(&format!(
        "snapshot: a workspace of {} files, {rounds} rounds",
        tree.file_count()
    ));
    let dir = ctx.subdir("snapshot")?;
    let r = measure(&dir, &tree, rounds)?;
    let mb = |b: f64| b / 1e6;
    let tree_note = format!(
        "workspace: {} files in {} directories, {} MB (source tree, node_modules-like tree, a \
         Python virtualenv, logs, binary blobs, one {} MB file)",
        super::fmt_num(r.tree.files as f64),
        super::fmt_num(r.tree.dirs as f64),
        super::fmt_num(mb(r.tree.bytes as f64)),
        super::fmt_num(mb(tree.large_bytes as f64)),
    );
    Ok(vec![
        Measurement::new(
            "snapshot.create",
            "LocalProvider::snapshot into an empty content store: hash, compress (zstd -1, 2 threads), durable, stop the sandbox",
            Quantity::new(r.first.subject_median(), "s"),
            format!("`{PACK}`"),
            Quantity::new(r.first.baseline_median(), "s"),
            None,
            Target::RatioAtMost { ratio: 1.0 },
            rounds,
            vec![tree_note.clone()],
        ),
        Measurement::new(
            "snapshot.second_small",
            "the next snapshot after changing one small file (the index spares the unchanged files)",
            Quantity::new(r.small.subject_median(), "s"),
            "the first snapshot of the same round",
            Quantity::new(r.small.baseline_median(), "s"),
            None,
            Target::RatioAtMost { ratio: 0.05 },
            rounds,
            vec![],
        ),
        Measurement::new(
            "snapshot.second_append",
            "the next snapshot after appending 1 MB to the large file (its unchanged chunks are not stored again)",
            Quantity::new(r.append.subject_median(), "s"),
            "the first snapshot of the same round",
            Quantity::new(r.append.baseline_median(), "s"),
            None,
            Target::RatioAtMost { ratio: 0.1 },
            rounds,
            vec![],
        ),
        Measurement::new(
            "snapshot.restore",
            "LocalProvider::create_sandbox from the snapshot (verified, 2 threads)",
            Quantity::new(r.restore.subject_median(), "s"),
            format!("`{UNPACK}`"),
            Quantity::new(r.restore.baseline_median(), "s"),
            None,
            Target::RatioAtMost { ratio: 1.0 },
            rounds,
            vec![tree_note],
        ),
        Measurement::new(
            "snapshot.storage",
            "content store + manifests after 10 snapshots, 1 % of the files changed between each",
            Quantity::new(mb(r.storage_bytes), "MB"),
            "one `tar | zstd -1` archive of the tree (10 full archives: 10× this)",
            Quantity::new(mb(r.archive_bytes), "MB"),
            None,
            Target::RatioAtMost { ratio: 1.2 },
            1,
            vec![],
        ),
        Measurement::new(
            "snapshot.create_isolated",
            "the first snapshot of the same tree in an isolated sandbox (terminal.local_isolation = namespaces: its init and namespaces end with it)",
            Quantity::new(r.iso_first.subject_median(), "s"),
            "the unisolated `snapshot.create` of the same round",
            Quantity::new(r.iso_first.baseline_median(), "s"),
            None,
            Target::RatioAtMost {
                ratio: TARGET_ISOLATED_RATIO,
            },
            rounds,
            vec![],
        ),
        Measurement::new(
            "snapshot.restore_isolated",
            "the round's snapshot restored into an isolated sandbox with its first command (`true`, which starts its init and namespaces), two per round in turns with the baseline (ABBA)",
            Quantity::new(r.iso_restore.subject_median(), "s"),
            "the same restore and first command by an unisolated provider on the same store",
            Quantity::new(r.iso_restore.baseline_median(), "s"),
            None,
            Target::RatioAtMost {
                ratio: TARGET_ISOLATED_RATIO,
            },
            rounds,
            vec![],
        ),
    ])
}
