//! Running a command in a simulated sandbox: the `program` steps applied to its files, `sleep`s
//! spent on virtual time, cut short by the command's timeout or by the sandbox going away.

use std::pin::pin;

use tokio::sync::Notify;

use super::program::{self, Flow, Shell, Step};
use super::{SimProvider, OP_EXEC};
use crate::core::Millis;
use crate::provider::{bound_output, ExecOutput, ExecRequest, ProviderError, MAX_OUTPUT_CHARS};

/// Takes a command off its sandbox's running list when the command ends, or when the caller
/// drops the call's future part-way (the engine cancelling it).
pub(super) struct RunningGuard<'a> {
    provider: &'a SimProvider,
    sandbox_id: &'a str,
    command_no: u64,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        if let Some(sb) = self.provider.world().sandboxes.get_mut(self.sandbox_id) {
            sb.running.remove(&self.command_no);
        }
    }
}

impl SimProvider {
    pub(super) async fn exec(
        &self,
        sandbox_id: &str,
        req: &ExecRequest,
    ) -> Result<ExecOutput, ProviderError> {
        let steps = program::parse(&req.command);
        // Every random value is drawn here, at the call's start, so the stream follows the order
        // calls arrive in. `cut`: where the deadline falls inside the command, if it is cut short.
        let (plan, cut) = {
            let mut w = self.world();
            let plan = w.plan(OP_EXEC);
            let cut_short = w.chance(|f| f.expire_mid_command);
            let needed = program::total_sleep_ms(&steps).min(req.timeout_ms);
            let cut = cut_short.then(|| w.rng.between(0, needed));
            (plan, cut)
        };
        // A timed-out exec never reached the sandbox: commands are not idempotent, and a
        // command that ran unseen would make "files survive" impossible to check.
        Self::answered(&plan).await?;
        let start = self.now();
        let timeout_end = start.saturating_add(req.timeout_ms);
        let (changed, command_no) = {
            let mut w = self.world();
            let w = &mut *w;
            let command_no = w.next_command;
            let sb = w
                .live_or_gone(OP_EXEC, sandbox_id, start)
                // Found stopped before the command started: it provably never ran.
                .map_err(ProviderError::before_start)?;
            let pulled = match cut {
                Some(cut) if start.saturating_add(cut) < sb.deadline => {
                    sb.deadline = start.saturating_add(cut);
                    true
                }
                _ => false,
            };
            if pulled {
                w.stats.fault("expire_mid_command");
            }
            let sb = w
                .live_or_gone(OP_EXEC, sandbox_id, start)
                // Found stopped before the command started: it provably never ran.
                .map_err(ProviderError::before_start)?;
            sb.running.insert(command_no, req.command.clone());
            let changed = sb.changed.clone();
            w.next_command += 1;
            w.stats.commands_run += 1;
            (changed, command_no)
        };
        let _running = RunningGuard {
            provider: self,
            sandbox_id,
            command_no,
        };
        let (shell, timed_out) = self
            .run_steps(sandbox_id, &steps, start, timeout_end, &changed)
            .await?;
        let end = self.now();
        Ok(ExecOutput {
            exit_code: if timed_out { 124 } else { shell.status },
            timed_out,
            stdout: bound_output(&shell.stdout, MAX_OUTPUT_CHARS),
            stderr: bound_output(&shell.stderr, MAX_OUTPUT_CHARS),
            duration_ms: end.saturating_sub(start),
            stdout_truncated: shell.stdout.chars().count() > MAX_OUTPUT_CHARS,
            stderr_truncated: shell.stderr.chars().count() > MAX_OUTPUT_CHARS,
            ..ExecOutput::default()
        })
    }

    /// Runs the steps: instantaneous ones under the lock, `sleep`s on virtual time, stopping at
    /// the command timeout (`Ok` with `timed_out`) or when the sandbox goes (`Err`).
    async fn run_steps(
        &self,
        sandbox_id: &str,
        steps: &[Step],
        start: Millis,
        timeout_end: Millis,
        changed: &Notify,
    ) -> Result<(Shell, bool), ProviderError> {
        let mut shell = Shell::default();
        let mut next = 0;
        // Virtual time this command has provably reached: a sleep to `limit` ends at `limit`
        // even if the clock reads a rounding step behind.
        let mut reached = start;
        loop {
            // Run every step up to the next sleep (or the end) at one instant.
            let sleep_until = {
                let now = self.now().max(reached);
                let mut w = self.world();
                let sb = w.live_or_gone(OP_EXEC, sandbox_id, now)?;
                loop {
                    let Some(step) = steps.get(next) else {
                        return Ok((shell, false));
                    };
                    if let Step::Sleep { ms } = step {
                        shell.status = 0;
                        break now.saturating_add(*ms);
                    }
                    next += 1;
                    if shell.apply(step, &mut sb.files) == Flow::Exit {
                        return Ok((shell, false));
                    }
                }
            };
            // Sleep, waking early if the sandbox stops or its deadline moves.
            loop {
                let mut notified = pin!(changed.notified());
                let (now, limit) = {
                    let now = self.now().max(reached);
                    let mut w = self.world();
                    let sb = w.live_or_gone(OP_EXEC, sandbox_id, now)?;
                    // Registered while the world is locked, so no change can slip in between
                    // this check and the wait.
                    notified.as_mut().enable();
                    if now >= sleep_until {
                        break;
                    }
                    if now >= timeout_end {
                        return Ok((shell, true));
                    }
                    (now, sleep_until.min(timeout_end).min(sb.deadline))
                };
                tokio::select! {
                    // In order, not at random: tokio picks among ready branches with a
                    // per-runtime random seed, which a simulation must not depend on.
                    biased;
                    () = Self::pause(limit - now) => reached = limit,
                    () = notified => {}
                }
            }
            next += 1;
        }
    }
}
