//! Running a command: `bash -c` in its own process group in the sandbox's workspace, watched
//! for its timeout, the sandbox's deadline, a stop and a cancel, with the working directory it
//! ended in recorded for the next command. Its output is forwarded as it is read, and its stdin
//! fed from the caller's, when the exec has a live side ([`ExecIo`]).

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::error::LocalError;
use super::inflight::InFlight;
use super::isolation;
use super::kill::{
    exited_unreaped, group_has_live_members, kill_group, signal_group, signal_shell, GroupGuard,
};
use super::names::SandboxName;
use super::output::{Captured, Pump};
use super::script::{bash_command, host_environment, wrap_command, Report};
use super::spawn::{self, Spec, Started};
use super::workspace::{relative_cwd, resolve_cwd};
use super::{LocalProvider, Slot};
use crate::provider::live::cancel_requested;
use crate::provider::{ExecIo, ExecOutput, ExecRequest, OutputStream};

/// How often a running command checks the sandbox deadline. The deadline lives on the injected
/// clock (which may be virtual), so it is polled rather than turned into a timer. A cancelled
/// command's group is polled as often for its end.
const DEADLINE_POLL: Duration = Duration::from_millis(50);

/// How long a cancelled command (every process of its group, not only its shell) has to exit on
/// the caller's signal before its group is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// How long, at most, a cancelled command's result waits for its group's processes to die of
/// the grace's SIGKILL (so that none still runs when the result returns).
const KILLED_WAIT: Duration = Duration::from_secs(2);

/// When a cancelled command's shell still runs this long after the signal, it gets the signal
/// once more, alone. bash blocks SIGINT and SIGTERM while it forks a process and, when one lands
/// then, only notes it and acts on it once the child it then waits for exits: a cancel arriving
/// as the shell starts a command would end the command only at the grace's SIGKILL (exit 137,
/// and a caller waiting 3 s). A second signal of the same kind makes bash end at once (its EXIT
/// trap run, dying of the signal) — a second Ctrl-C, sent to the shell only, so that the
/// command's own processes, which have handled the first, do not see it twice.
const CANCEL_NUDGE: Duration = Duration::from_millis(100);

impl LocalProvider {
    pub(super) async fn exec_command(
        &self,
        sandbox_id: &str,
        req: &ExecRequest,
        io: ExecIo,
    ) -> Result<ExecOutput, LocalError> {
        let name = SandboxName::parse(sandbox_id)?;
        if req.command.contains('\0') {
            return Err(LocalError::BadCommand {
                sandbox: name.name.clone(),
            });
        }
        let slot = self.slot(&name);
        let (meta, mut stopped, sandbox_dir, workspace, run_dir, init, network_note, warn, _mark) = {
            let _guard = slot.lock.lock().await;
            // Gone (or past its deadline) before the command starts: it provably never ran.
            // Located under the lock: a create of a newer generation may park this sandbox.
            let (dir, meta) = self.live_located(&name, &slot).await.map_err(|e| match e {
                LocalError::SandboxGone { .. } => LocalError::NotStarted(Box::new(e)),
                e => e,
            })?;
            let (workspace, run_dir) = (dir.join("workspace"), dir.join("run"));
            // A command may have deleted the workspace itself; a VM's root would still exist.
            // (Under the lock: after a discard this would leave a nameless sandbox behind.)
            for dir in [&workspace, &run_dir] {
                fs::create_dir_all(dir).map_err(LocalError::io("create directory", dir))?;
            }
            slot.deadline.store(meta.deadline, Ordering::SeqCst);
            // Its namespaces, made by its first command (under the lock: one init per sandbox).
            let (init, network_note) = if self.isolation.namespaces() {
                let (init, note) = self.sandbox_init(&name, &slot, &workspace, &run_dir)?;
                (Some(init), note)
            } else {
                (None, None)
            };
            slot.commands.fetch_add(1, Ordering::SeqCst);
            // Unisolated on purpose (`terminal.local_isolation = none`): said on the sandbox's
            // first command, whichever process runs it (a marker in its `run/`, made once).
            let warn = self.warn_unisolated() && first_unisolated(&run_dir);
            // Its mark while it runs (under the lock: after the check for a dead server's). An
            // isolated command needs none: its sandbox ends with this process (see `inflight`).
            let mark = match init {
                Some(_) => None,
                None => Some(InFlight::mark(&run_dir, &self.unique())?),
            };
            // Subscribed under the lock: a discard after this point is seen by this command.
            (
                meta,
                slot.stopped.subscribe(),
                dir,
                workspace,
                run_dir,
                init,
                network_note,
                warn,
                mark,
            )
        };
        // Cancelled before it started (while its sandbox was made ready): it never runs.
        if let Some(signal) = io.cancelled() {
            return Ok(ExecOutput {
                exit_code: signal.exit_code(),
                ..ExecOutput::default()
            });
        }
        // Said before the command's own output, on the sandbox's first command: that it runs
        // unisolated on purpose, or what its network fell back to.
        let first_note =
            network_note.or_else(|| warn.then(|| isolation::UNISOLATED_NOTE.to_string()));
        if let (Some(note), Some(live)) = (&first_note, &io.output) {
            // A reader that went away misses it; the capture keeps it.
            let _ = live
                .send(crate::provider::OutputChunk {
                    stream: OutputStream::Stderr,
                    data: note.as_bytes().to_vec(),
                })
                .await;
        }
        let cwd = resolve_cwd(&workspace, &meta.cwd);
        let cwd_file = run_dir.join(format!("cwd.{}", self.unique()));

        // The pipe the command's exit trap reports its working directory through (opened by
        // path, `/proc/<pid>/fd/<n>`: no descriptor of the command's is taken for it, and
        // nothing it starts inherits one). Without `/proc` the trap writes `cwd_file` instead.
        let (report, report_writer) = ReportPipe::open(&name)?;
        // Only an isolated command gets the write end (the server's `/proc/<pid>/fd/<n>` is
        // not visible inside its sandbox).
        let report_writer = init.is_some().then_some(report_writer);
        // The sandbox's cgroup, which no process leaves, so a stop kills everything the sandbox
        // ever started (see `cgroup`): the shell is born in it where Linux can (`spawn`),
        // otherwise its script joins it before anything else. An isolated sandbox needs none:
        // its PID namespace ends with it.
        let cgroup = match init {
            Some(_) => None,
            None => super::cgroup::prepare(&sandbox_dir, &name.name),
        };
        let env = [
            ("TASKBOX_TASK_ID", OsStr::new(meta.task_id.as_str())),
            ("TASKBOX_SANDBOX", OsStr::new(name.name.as_str())),
            ("TASKBOX_WORKSPACE", workspace.as_os_str()),
        ];
        // The command's whole environment: its clean base, then the variables passed on
        // purpose (never a `TASKBOX_*`: `CommandEnv` refuses them). Nothing of the server's.
        let base = match init {
            Some(_) => isolation::environment(&env),
            None => host_environment(&env),
        };
        let full: Vec<(&str, &OsStr)> = base
            .iter()
            .map(|(k, v)| (*k, v.as_os_str()))
            .filter(|(k, _)| !io.env.names().any(|n| n == *k))
            .chain(io.env.iter().map(|(k, v)| (k, OsStr::new(v))))
            .collect();
        let started = tokio::time::Instant::now();
        // Where the command's reported directory is relative to.
        let cwd_root = match init {
            Some(_) => Path::new(isolation::WORKSPACE),
            None => workspace.as_path(),
        };
        let cloned = match &cgroup {
            _ if init.is_some() => None,
            Some(join) => {
                let script = wrap_command(
                    &req.command,
                    Report::Path(&report.path),
                    &cwd_file,
                    &cwd,
                    None,
                );
                let spec = Spec {
                    program: "bash",
                    args: &[OsStr::new("-c"), &script],
                    cwd: &cwd,
                    env: &full,
                    stdin_piped: io.stdin.is_some(),
                };
                spawn::clone_into_cgroup(join.dir(), &spec).map_err(|source| LocalError::Spawn {
                    sandbox: name.name.clone(),
                    source,
                })?
            }
            None => None,
        };
        // What counts the processes the sandbox's memory limit kills, and the count before.
        let oom = init
            .as_ref()
            .and_then(|i| i.cgroups())
            .map(|c| c.oom_counter())
            .map(|counter| (counter.count(), counter));
        let child = match (cloned, init) {
            (Some(child), _) => child,
            (None, Some(init)) => {
                let inside = Path::new(isolation::WORKSPACE)
                    .join(cwd.strip_prefix(&workspace).unwrap_or(Path::new("")));
                let enter =
                    isolation::Enter::new(init, &inside, report_writer).map_err(|source| {
                        LocalError::Spawn {
                            sandbox: name.name.clone(),
                            source,
                        }
                    })?;
                let script = wrap_command(
                    &req.command,
                    Report::Fd(enter.report_fd()),
                    &cwd_file,
                    &inside,
                    None,
                );
                let spec = Spec {
                    program: "bash",
                    args: &[OsStr::new("-c"), &script],
                    cwd: &inside,
                    env: &full,
                    stdin_piped: io.stdin.is_some(),
                };
                // The server's own child, born in the sandbox (see `isolation::enter`).
                enter.spawn(&spec).map_err(|source| LocalError::Spawn {
                    sandbox: name.name.clone(),
                    source,
                })?
            }
            (None, None) => {
                let script = wrap_command(
                    &req.command,
                    Report::Path(&report.path),
                    &cwd_file,
                    &cwd,
                    cgroup.as_ref(),
                );
                // No `pre_exec` hook: the standard library then spawns with `posix_spawn` (a
                // `vfork`), not by forking this whole process.
                let mut command = bash_command(script, io.stdin.is_some(), &full);
                command.current_dir(&cwd);
                match command.spawn() {
                    Ok(child) => Started::spawned(child),
                    // Discarded since the check above: its directory went away under the spawn.
                    Err(_) if stopped.has_changed().unwrap_or(true) => {
                        return Err(LocalError::gone(
                            &name,
                            "it was stopped as the command started",
                        ))
                    }
                    Err(source) => {
                        return Err(LocalError::Spawn {
                            sandbox: name.name.clone(),
                            source,
                        })
                    }
                }
            }
        };
        let mut proc = child.proc;
        let pgid = proc.id().expect("a child that was just started has a pid");
        let mut group = GroupGuard { pgid: Some(pgid) };
        let stdout = Pump::start(child.stdout, OutputStream::Stdout, io.output.clone());
        // Kept for a note after the command's own output (the memory limit's, a full disk's).
        let live_note = io.output.clone();
        let stderr = Pump::start(child.stderr, OutputStream::Stderr, io.output);
        let feeder = feed_stdin(child.stdin, io.stdin);
        let mut cancel = io.cancel;

        let command_timeout = tokio::time::sleep(Duration::from_millis(req.timeout_ms));
        tokio::pin!(command_timeout);
        // Armed by a cancel: the group is killed if the signal did not end it by then.
        let escalate = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(escalate);
        // Armed by a cancel too: the shell's second signal (see `CANCEL_NUDGE`).
        let nudge = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(nudge);
        let mut nudge_armed = false;
        let mut cancelled = None;
        // Once a cancel signalled the group, the shell is no longer reaped as soon as it exits
        // (see the tick): the command has ended only when its whole group has.
        let mut signalled = false;
        // When the grace's SIGKILL went to the group: its processes are then waited for (they
        // die as soon as they are scheduled), at most `KILLED_WAIT`, unless one is stuck in an
        // uninterruptible sleep.
        let mut killed: Option<tokio::time::Instant> = None;
        let mut tick = tokio::time::interval(DEADLINE_POLL);
        let mut exited = None;
        let outcome = loop {
            tokio::select! {
                status = proc.wait(), if !signalled => {
                    exited = Some(status);
                    break Outcome::Exited;
                }
                () = &mut command_timeout => break Outcome::TimedOut,
                _ = stopped.changed() => break Outcome::Stopped,
                _ = tick.tick() => {
                    if self.clock.now_ms() >= slot.deadline.load(Ordering::SeqCst) {
                        break Outcome::Expired;
                    }
                    // A signalled shell may exit while a process it started missed the signal
                    // (one sent as bash forks it, before it execs, is lost) and would run on:
                    // the shell stays unreaped, so its group id stays ours, until nothing else
                    // of its group runs, or the grace ran out and the group was killed (and died).
                    if signalled {
                        match exited_unreaped(pgid) {
                            Ok(true)
                                if !group_has_live_members(pgid)
                                    || killed.is_some_and(|at| at.elapsed() >= KILLED_WAIT) =>
                            {
                                break Outcome::Exited;
                            }
                            Ok(_) => {}
                            // Not waitable (reaped already?): the wait below says how it ended.
                            Err(_) => break Outcome::Exited,
                        }
                    }
                }
                signal = cancel_requested(&mut cancel), if cancelled.is_none() => {
                    // Not reaped (the wait above has not returned): the group id is still ours.
                    signal_group(pgid, signal.number());
                    cancelled = Some(signal);
                    signalled = true;
                    escalate.as_mut().reset(tokio::time::Instant::now() + CANCEL_GRACE);
                    nudge.as_mut().reset(tokio::time::Instant::now() + CANCEL_NUDGE);
                    nudge_armed = true;
                }
                () = &mut nudge, if nudge_armed => {
                    nudge_armed = false;
                    // Not reaped (after a cancel only the tick ends the wait, before reaping):
                    // the pid is still the shell's.
                    if let (Some(signal), Ok(false)) = (cancelled, exited_unreaped(pgid)) {
                        tracing::debug!(sandbox = %name.name, "a cancelled command's shell still runs; signalled again");
                        signal_shell(pgid, signal.number());
                    }
                }
                () = &mut escalate, if cancelled.is_some() => {
                    tracing::debug!(sandbox = %name.name, "a cancelled command outlived its grace; killed");
                    // Not reaped: after a cancel only the tick ends the wait, before reaping.
                    kill_group(pgid);
                    killed = Some(tokio::time::Instant::now());
                    cancelled = None;
                    cancel = None;
                }
            }
        };
        if let Some(feeder) = feeder {
            feeder.abort();
        }
        if outcome != Outcome::Exited && proc.id().is_some() {
            // Not reaped yet, so the group id cannot have been reused: safe to kill.
            kill_group(pgid);
        }
        let status = match exited {
            Some(status) => status,
            None => proc.wait().await,
        };
        group.pgid = None; // reaped: the id may be reused from now on
        let stdout = stdout.finish().await;
        let stderr = stderr.finish().await;
        let duration_ms = started.elapsed().as_millis() as u64;
        // The trap wrote before the shell exited, so what it reported is in the pipe by now.
        let reported_cwd = match report.take() {
            Some(reported) => Some(reported),
            // Reported through the file (no `/proc`), or a failed cgroup join (before the trap).
            None => {
                let reported = fs::read(&cwd_file).ok();
                if reported.is_some() {
                    let _ = fs::remove_file(&cwd_file);
                }
                reported
            }
        };

        let result = match outcome {
            Outcome::Expired => {
                // Nothing runs past the deadline, but the files stay for a late checkpoint.
                let _guard = slot.lock.lock().await;
                if let Some(current) = self.read_meta(&name)? {
                    if current.instance == meta.instance {
                        self.stop_processes(&name, &slot).await?;
                    }
                }
                Err(LocalError::gone(
                    &name,
                    "it passed its deadline while the command was running (the command was \
                     killed; the files are kept until the sandbox is snapshotted or stopped)",
                ))
            }
            Outcome::Stopped => Err(LocalError::gone(
                &name,
                "it was stopped while the command was running (the command was killed)",
            )),
            Outcome::TimedOut => Ok(output(124, true, stdout, stderr, duration_ms)),
            Outcome::Exited => {
                // Killed by a stop that raced with its exit: the sandbox is gone all the same.
                if stopped.has_changed().unwrap_or(true) {
                    return Err(LocalError::gone(
                        &name,
                        "it was stopped while the command was running (the command was killed)",
                    ));
                }
                let status = status.map_err(LocalError::io("wait for the command in", &cwd))?;
                if let Some(source) = cgroup.and_then(|c| c.failed(reported_cwd.as_deref())) {
                    return Err(LocalError::Spawn {
                        sandbox: name.name.clone(),
                        source,
                    });
                }
                // Ended where it started (most commands never `cd`): nothing to record, and
                // the sandbox's meta is not read again.
                let moved = reported_cwd
                    .filter(|r| !r.is_empty())
                    .map(|r| relative_cwd(cwd_root, &r))
                    .filter(|rel| *rel != meta.cwd);
                if let Some(rel) = moved {
                    if let Err(e) = self.record_cwd(&name, &slot, &meta.instance, rel).await {
                        tracing::warn!(sandbox = %name.name, error = %e,
                            "could not record the command's working directory");
                    }
                }
                let mut out = output(exit_code(status), false, stdout, stderr, duration_ms);
                // Killed by the memory limit (a process of the sandbox was, while it ran): said
                // in its stderr; the sandbox lives on.
                let mut note = None;
                if let Some((before, counter)) = oom {
                    if counter.count() > before {
                        note = Some(counter.note());
                        out.memory_killed = true;
                    }
                }
                // Failed with the disk full: say which disk and how much is free.
                if note.is_none() && out.exit_code != 0 {
                    note = disk_full_note(&self.root);
                }
                if let Some(note) = note {
                    if let Some(bytes) = out.stderr_bytes.as_mut() {
                        bytes.extend_from_slice(note.as_bytes());
                    }
                    out.stderr.push_str(&note);
                    if let Some(live) = live_note {
                        let chunk = crate::provider::OutputChunk {
                            stream: OutputStream::Stderr,
                            data: note.into_bytes(),
                        };
                        // A reader that went away misses it; the capture keeps it.
                        let _ = live.send(chunk).await;
                    }
                }
                Ok(out)
            }
        };
        result.map(|out| match &first_note {
            Some(note) => out.with_stderr_prefix(note),
            None => out,
        })
    }

    /// The init holding the sandbox's namespaces: the running one, or a new one (its first
    /// command in this process, or one after a stop), with the note its command must print
    /// when its network fell back to loopback only. The caller holds the slot's lock. A running
    /// one is taken as it is; only a new one (its clone, its namespaces' files, its cgroups)
    /// tells tokio that this thread blocks: `block_in_place` hands the worker to another
    /// thread, a wake-up per command otherwise.
    pub(super) fn sandbox_init(
        &self,
        name: &SandboxName,
        slot: &Slot,
        workspace: &Path,
        run_dir: &Path,
    ) -> Result<(std::sync::Arc<isolation::Init>, Option<String>), LocalError> {
        if let Some(init) = slot.running_init() {
            return Ok((init, None));
        }
        super::run_blocking_ref(|| {
            let mut held = super::lock(&slot.init);
            if let Some(init) = held.as_ref().filter(|i| i.alive()) {
                return Ok((init.clone(), None));
            }
            let isolate = |source| LocalError::Isolation {
                sandbox: name.name.clone(),
                source,
            };
            // Its limits, in cgroups of this init's own (a previous init's, ended, may still be
            // being removed). Where no hierarchy allows them, doctor shows the ✗ and why.
            let cgroups = match isolation::limits_support() {
                Ok(_) => {
                    let dir = workspace.parent().unwrap_or(workspace);
                    let cg = format!(
                        "{}{}-{}",
                        isolation::LIMITS_PREFIX,
                        super::cgroup::name(dir, &name.name),
                        self.unique()
                    );
                    Some(
                        isolation::Cgroups::make(&cg, self.isolation.limits)
                            .map_err(|e| isolate(isolation::InitError::Prepare(e)))?,
                    )
                }
                Err(why) => {
                    tracing::warn!(sandbox = %name.name, reason = %why,
                        "the sandbox runs without cpu, memory and process limits");
                    None
                }
            };
            let alias = self.isolation.workspace_alias.as_deref();
            let (mut init, note) =
                match isolation::start(workspace, run_dir, &self.isolation.network, alias) {
                    Ok(started) => started,
                    Err(e) => {
                        if let Some(cg) = cgroups {
                            cg.remove();
                        }
                        return Err(isolate(e));
                    }
                };
            if let Some(cg) = cgroups {
                init.set_cgroups(cg);
            }
            isolation::start_spawner(&mut init);
            tracing::debug!(sandbox = %name.name, init = init.pid(), "made the sandbox's namespaces");
            let init = std::sync::Arc::new(init);
            *held = Some(init.clone());
            Ok((init, note))
        })
    }

    /// Stores `rel` as the next command's starting directory, unless the sandbox was replaced
    /// meanwhile.
    async fn record_cwd(
        &self,
        name: &SandboxName,
        slot: &Slot,
        instance: &str,
        rel: String,
    ) -> Result<(), LocalError> {
        let _guard = slot.lock.lock().await;
        let Some(mut meta) = self.read_meta(name)? else {
            return Ok(());
        };
        if meta.instance != instance || meta.cwd == rel {
            return Ok(());
        }
        meta.cwd = rel;
        self.write_meta(&self.sandbox_dir(name), &meta)
    }
}

/// The read end of the pipe a command's exit trap writes its working directory to, and the
/// path the trap opens it by (`/proc/<this process>/fd/<n>`: opening a pipe's end there for
/// writing gives a new write end of the same pipe). Only the read end is kept, so once the
/// shell has exited the pipe holds what its trap wrote, and the read cannot block.
struct ReportPipe {
    reader: fs::File,
    path: std::path::PathBuf,
}

impl ReportPipe {
    /// The pipe, and its write end (which an isolated command gets at `Enter::report_fd`;
    /// dropped otherwise).
    fn open(name: &SandboxName) -> Result<(ReportPipe, std::os::fd::OwnedFd), LocalError> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let mut fds = [0 as libc::c_int; 2];
        // Non-blocking: a process the command left behind could have opened the pipe too and
        // hold it open; what is in the pipe is read, nothing is waited for. Close-on-exec: no
        // child inherits either end.
        // SAFETY: `fds` is a valid array of two descriptors for `pipe2` to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(LocalError::Spawn {
                sandbox: name.name.clone(),
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `pipe2` succeeded, so both are open descriptors that nothing else owns.
        let (reader, writer) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let path = std::path::PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            reader.as_raw_fd()
        ));
        Ok((
            ReportPipe {
                reader: fs::File::from(reader),
                path,
            },
            writer,
        ))
    }

    /// What the trap wrote (`None`: nothing — no `/proc`, or the shell ended without its
    /// trap). The last line counts: the trap writes just before the shell exits.
    fn take(mut self) -> Option<Vec<u8>> {
        use std::io::Read;
        let mut all = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => all.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break, // `WouldBlock`: all that was written is read
            }
        }
        if all.is_empty() {
            return None;
        }
        let body = all.strip_suffix(b"\n").unwrap_or(&all);
        let last = body.rsplit(|&b| b == b'\n').next().unwrap_or(body);
        Some(last.to_vec())
    }
}

/// Writes the caller's stdin into the command's, on its own task; the end of the caller's is
/// the end of the command's (the pipe is closed). A command that stops reading ends the feed.
fn feed_stdin(
    pipe: Option<Box<dyn AsyncWrite + Unpin + Send>>,
    source: Option<tokio::sync::mpsc::Receiver<Vec<u8>>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let (mut pipe, mut source) = (pipe?, source?);
    Some(tokio::spawn(async move {
        while let Some(data) = source.recv().await {
            if pipe.write_all(&data).await.is_err() {
                return;
            }
        }
        let _ = pipe.shutdown().await;
    }))
}

/// Below this much free space, a command that failed is told the disk is full.
const DISK_FULL_BELOW: u64 = 1 << 20;

/// The note for a command that failed while the disk holding the workspaces (the local
/// backend's `root`, in the data dir) is full, or `None` when it is not.
fn disk_full_note(root: &Path) -> Option<String> {
    let crate::store::reserve::Space { available, total } =
        crate::store::reserve::space(root).ok()?;
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    (available < DISK_FULL_BELOW).then(|| {
        format!(
            "\nnote: the disk holding the workspace is full ({:.1} MB free of {:.1} MB, the \
             filesystem of {}); \
             the command may have failed for want of space. Delete files the task does not \
             need and run it again: the files its snapshots hold are safe\n",
            mb(available),
            mb(total),
            root.display()
        )
    })
}

fn output(
    exit_code: i32,
    timed_out: bool,
    stdout: Captured,
    stderr: Captured,
    duration_ms: u64,
) -> ExecOutput {
    ExecOutput {
        exit_code,
        timed_out,
        stdout: stdout.text,
        stderr: stderr.text,
        duration_ms,
        stdout_bytes: stdout.bytes,
        stderr_bytes: stderr.bytes,
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        memory_killed: false,
    }
}

/// Whether this is the first command of an unisolated sandbox whose run directory is
/// `run_dir`: the one that makes its marker (a marker that cannot be made says so too).
fn first_unisolated(run_dir: &Path) -> bool {
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(run_dir.join("unisolated-warned"))
    {
        Ok(_) => true,
        Err(e) => e.kind() != std::io::ErrorKind::AlreadyExists,
    }
}

impl ExecOutput {
    /// The same output, `note` before its stderr (text and bytes alike).
    fn with_stderr_prefix(mut self, note: &str) -> ExecOutput {
        if let Some(bytes) = self.stderr_bytes.as_mut() {
            bytes.splice(0..0, note.bytes());
        }
        self.stderr.insert_str(0, note);
        self
    }
}

/// How a command's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Exited,
    TimedOut,
    Stopped,
    Expired,
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|sig| 128 + sig))
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    use std::process::Stdio;

    use super::*;

    /// Runs `wrap_command`'s script in `dir` with `report` as the report path.
    fn run_wrapped(dir: &Path, report: &Path, cwd_file: &Path, command: &str) -> i32 {
        let script = wrap_command(command, Report::Path(report), cwd_file, dir, None);
        #[allow(clippy::disallowed_methods, clippy::disallowed_types)]
        let status = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("bash runs");
        exit_code(status)
    }

    #[test]
    fn the_trap_reports_through_the_pipe_and_falls_back_to_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().canonicalize().unwrap();
        fs::create_dir(ws.join("sub")).unwrap();
        let cwd_file = ws.join("cwd.report");
        let name = SandboxName::parse("taskbox-t-g1-insta").unwrap();

        // Through the pipe, even when the command took over low descriptors; nothing in the file.
        let pipe = ReportPipe::open(&name).unwrap().0;
        let code = run_wrapped(
            &ws,
            &pipe.path,
            &cwd_file,
            "exec 3>f3 4>f4 9>f9; cd sub; exit 4",
        );
        assert_eq!(code, 4);
        assert_eq!(pipe.take().unwrap(), ws.join("sub").as_os_str().as_bytes());
        assert!(!cwd_file.exists());
        for f in ["f3", "f4", "f9"] {
            assert_eq!(
                fs::read(ws.join(f)).unwrap(),
                b"",
                "{f} is the command's own"
            );
        }

        // Ended where it began: nothing reported, nothing in the file (the caller keeps the
        // directory it had).
        let pipe = ReportPipe::open(&name).unwrap().0;
        assert_eq!(
            run_wrapped(&ws, &pipe.path, &cwd_file, "cd sub; cd ..; exit 3"),
            3
        );
        assert_eq!(pipe.take(), None);
        assert!(!cwd_file.exists());

        // Through a descriptor the shell inherited (an isolated command's).
        let (pipe, writer) = ReportPipe::open(&name).unwrap();
        let script = wrap_command("cd sub", Report::Fd(1000), &cwd_file, &ws, None);
        let writer = writer.as_raw_fd();
        let mut command = std::process::Command::new("bash");
        command.arg("-c").arg(script).current_dir(&ws);
        // SAFETY: only `dup2` between the fork and the exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                if libc::dup2(writer, 1000) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        #[allow(clippy::disallowed_methods)]
        let status = command.status().expect("bash runs");
        assert!(status.success());
        assert_eq!(pipe.take().unwrap(), ws.join("sub").as_os_str().as_bytes());
        assert!(!cwd_file.exists());

        // No pipe to open (no `/proc`): the file instead.
        let pipe = ReportPipe::open(&name).unwrap().0;
        let code = run_wrapped(&ws, &ws.join("no/such/proc"), &cwd_file, "cd sub");
        assert_eq!(code, 0);
        assert_eq!(pipe.take(), None);
        assert_eq!(
            fs::read(&cwd_file).unwrap(),
            format!("{}\n", ws.join("sub").display()).into_bytes()
        );
    }
}
