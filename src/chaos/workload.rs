//! The workload of one chaos seed: for every task, a list of steps (commands, suspends,
//! resumes, idle waits) and the points at which the engine crashes, all drawn up front from the
//! seed, so the workload does not depend on how the run unfolds.
//!
//! Commands are in the simulated sandbox's tiny language (`write`, `append`, `cat`, `sleep`; see
//! `crate::provider::sim`), so files written before a snapshot can be read after a restore.

use crate::rng::SplitMix64;

/// One thing a task's agent does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Run a shell command in the task's sandbox.
    Run {
        /// The command (simulated-shell syntax).
        command: String,
    },
    /// Suspend the task (snapshot and stop).
    Suspend,
    /// Resume the task (restore now, run nothing).
    Resume,
    /// Do nothing for this long (virtual time): lets idle reaps, checkpoints and expiries happen.
    Wait {
        /// How long.
        ms: u64,
    },
    /// Fork the task into the new task `child` (from its latest snapshot, or its snapshot
    /// `seq`), then run a command in the fork (which restores it).
    Fork {
        /// The new task (unique in the workload).
        child: String,
        /// Which snapshot (`None`: the latest).
        seq: Option<u64>,
    },
    /// Checkpoint the task (on the simulated platform and the fake Vercel a checkpoint stops
    /// the sandbox: it answers `stopped`).
    Checkpoint,
    /// Rewind the task, with a command before (the files before) and after (the files
    /// restored), which the driver checks.
    Rewind {
        /// To which snapshot.
        to: RewindOp,
    },
}

/// Which snapshot a [`Op::Rewind`] goes back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewindOp {
    /// One of the complete snapshots the task retains when the step runs: the `pick`-th (modulo
    /// their number), oldest first, named by `<task>.s<seq>`.
    To {
        /// Which one.
        pick: u64,
    },
    /// `--back n`.
    Back {
        /// How many snapshots back.
        n: u64,
    },
    /// Undo the task's previous rewind: rewind to the snapshot it saved (`--back 1` when there
    /// was none).
    Undo,
}

impl Op {
    /// A short name for counting.
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Run { .. } => "run",
            Op::Suspend => "suspend",
            Op::Resume => "resume",
            Op::Wait { .. } => "wait",
            Op::Fork { .. } => "fork",
            Op::Checkpoint => "checkpoint",
            Op::Rewind { .. } => "rewind",
        }
    }
}

/// One step of a task's workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// What to do.
    pub op: Op,
    /// The engine crashes this long after the step starts (and restarts at once).
    pub crash_after_ms: Option<u64>,
}

/// A task and its steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskPlan {
    /// The task id.
    pub task_id: String,
    /// Its steps, in order.
    pub steps: Vec<Step>,
}

/// Which platform the workload is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// The simulated platform on virtual time: its command language, waits of minutes.
    Sim,
    /// The fake Vercel server on real time: bash commands, waits of at most a few seconds.
    Http,
    /// The simulated platform on real time, shared by a fleet of engines: its command
    /// language, waits of at most a few seconds, no forks.
    Fleet,
}

/// Draws the workload of `tasks` tasks from `seed`; `crash_rate` is the chance, per step, that
/// the engine crashes at a random moment during it. Also returns the tasks' ids, in order.
pub fn plan(
    seed: u64,
    tasks: u32,
    crash_rate: f64,
    flavor: Flavor,
) -> (Vec<TaskPlan>, Vec<String>) {
    let rng = &mut SplitMix64::new(seed);
    // The fewest and most steps a task gets, and how late in a step a crash may come.
    let (steps, crash_within) = match flavor {
        Flavor::Sim => ((6, 16), 20_000),
        Flavor::Http | Flavor::Fleet => ((3, 7), 1_500),
    };
    let plans: Vec<TaskPlan> = (0..tasks)
        .map(|i| {
            let mut r = rng.fork();
            let n = r.between(steps.0, steps.1);
            let task_id = format!("chaos-{i:03}");
            let steps = (0..n)
                .map(|k| {
                    let mut op = match flavor {
                        Flavor::Sim => op(&mut r, &SIM),
                        Flavor::Http => http_op(&mut r),
                        Flavor::Fleet => op(&mut r, &FLEET),
                    };
                    if let Op::Fork { child, .. } = &mut op {
                        *child = format!("{task_id}-f{k}");
                    }
                    let crash_after_ms = r.chance(crash_rate).then(|| r.between(0, crash_within));
                    Step { op, crash_after_ms }
                })
                .collect();
            TaskPlan { task_id, steps }
        })
        .collect();
    let ids = plans.iter().map(|p| p.task_id.clone()).collect();
    (plans, ids)
}

/// Write, append to or read one of the three files both workloads share.
fn file_op(kind: usize, file: &str, value: u64) -> Op {
    let command = match kind {
        0 => format!("write {file} {value}"),
        1 => format!("append {file} +{value}"),
        _ => format!("cat {file}"),
    };
    Op::Run { command }
}

/// How the simulator's command language is scaled: the weights of its kinds (write, append,
/// cat, long command, wait, suspend, resume and, when there are more, fork, checkpoint and
/// rewind), the long
/// command's sleep and the waits' spans with their weights.
struct Scale {
    kinds: &'static [u64],
    sleep: (u64, u64),
    waits: &'static [(u64, (u64, u64))],
}

/// On the virtual clock: sleeps long enough for a sandbox to expire under them or an idle reap
/// to wait for them; waits short, past the idle lifetime (reaped into a snapshot), past the
/// sandbox's platform timeout, and between.
const SIM: Scale = Scale {
    kinds: &[4, 3, 4, 2, 4, 2, 1, 1, 2, 2],
    sleep: (1_000, 90_000),
    waits: &[
        (4, (0, 5_000)),
        (2, (125_000, 180_000)),
        (2, (300_000, 420_000)),
        (1, (20_000, 60_000)),
    ],
};

/// On real time (sleeps and waits of milliseconds to a few seconds, some past the idle lifetime
/// of two seconds), without forks.
const FLEET: Scale = Scale {
    kinds: &[4, 3, 4, 2, 3, 2, 1],
    sleep: (50, 1_500),
    waits: &[(4, (0, 400)), (1, (2_200, 3_000))],
};

fn op(r: &mut SplitMix64, scale: &Scale) -> Op {
    let file = format!("f{}", r.between(0, 2));
    let value = r.between(0, 9999);
    match r.weighted(scale.kinds) {
        kind @ 0..=2 => file_op(kind, &file, value),
        3 => Op::Run {
            command: format!(
                "append log {value}; sleep {}; cat log",
                r.between(scale.sleep.0, scale.sleep.1)
            ),
        },
        4 => {
            let weights: Vec<u64> = scale.waits.iter().map(|(w, _)| *w).collect();
            let (lo, hi) = scale.waits[r.weighted(&weights)].1;
            Op::Wait {
                ms: r.between(lo, hi),
            }
        }
        5 => Op::Suspend,
        6 => Op::Resume,
        7 => fork_op(r),
        8 => Op::Checkpoint,
        _ => rewind_op(r),
    }
}

/// A rewind: mostly to a snapshot the task retains, sometimes `--back 1` or `2`, sometimes an
/// undo of the previous one.
fn rewind_op(r: &mut SplitMix64) -> Op {
    let to = match r.weighted(&[3, 2, 2]) {
        0 => RewindOp::To {
            pick: r.between(0, 7),
        },
        1 => RewindOp::Back { n: r.between(1, 2) },
        _ => RewindOp::Undo,
    };
    Op::Rewind { to }
}

/// A fork, mostly from the latest snapshot; its child is named by [`plan`].
fn fork_op(r: &mut SplitMix64) -> Op {
    Op::Fork {
        child: String::new(),
        seq: r.chance(0.3).then(|| r.between(1, 3)),
    }
}

/// The same mix in bash, on real time: the fake's sandboxes are real processes.
fn http_op(r: &mut SplitMix64) -> Op {
    let file = format!("f{}", r.between(0, 2));
    let value = r.between(0, 9999);
    // Weights: write, append, cat, long command, wait, suspend, resume, fork, checkpoint,
    // rewind. A fork (whose child then restores the parent's snapshot) puts the fork-source and
    // deleted-while-referenced checks to work against the real client and the fake server.
    match r.weighted(&[4, 3, 4, 2, 3, 2, 1, 1, 1, 1]) {
        0 => Op::Run {
            command: format!("echo {value} > {file}"),
        },
        1 => Op::Run {
            command: format!("echo +{value} >> {file}"),
        },
        2 => Op::Run {
            command: format!("cat {file}"),
        },
        3 => Op::Run {
            command: format!("echo {value} >> log; sleep 0.{}; cat log", r.between(1, 9)),
        },
        4 => Op::Wait {
            ms: match r.weighted(&[4, 1]) {
                0 => r.between(0, 400),
                // Past the idle lifetime (reaped into a snapshot).
                _ => r.between(2_200, 3_000),
            },
        },
        5 => Op::Suspend,
        6 => Op::Resume,
        7 => fork_op(r),
        8 => Op::Checkpoint,
        _ => rewind_op(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_workload() {
        let (a, _) = plan(9, 4, 0.1, Flavor::Sim);
        let (b, _) = plan(9, 4, 0.1, Flavor::Sim);
        assert_eq!(a, b);
        assert_ne!(a, plan(10, 4, 0.1, Flavor::Sim).0);
        assert_eq!(a.len(), 4);
        for t in &a {
            assert!((6..=16).contains(&(t.steps.len() as u64)));
        }
        let (none, _) = plan(9, 4, 0.0, Flavor::Sim);
        assert!(none
            .iter()
            .flat_map(|t| &t.steps)
            .all(|s| s.crash_after_ms.is_none()));
    }
}
