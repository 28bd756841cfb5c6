//! A model-based property test of checkpoints and rewinds over the REAL local backend: the CLI
//! through an auto-started server in a fresh `TASKBOX_HOME`, driven by any sequence of writes,
//! removals, `checkpoint`, `rewind --to` / `--back` / undo, `suspend`, `run` and SIGKILLs of
//! the server (the next CLI call starts a new one). The real-backend counterpart of
//! `core_step/checkpoints.rs`.
//!
//! After each action: the workspace (read with `taskbox run -- …`) holds exactly the model's
//! files — the snapshot rewound to, or, after a suspend or a crash, those of the snapshot a
//! restore uses (or the live files the new server kept); each checkpoint's outcome is the one
//! the model predicts; a rewind restores exactly the snapshot the model names and says it kept
//! the files from before in the snapshot the model expects (so rewinding to it undoes it); the
//! engine's refusals (`unknown_snapshot`, `snapshot_unusable`, `rewind_too_far`) are the ones
//! the model predicts; and retention (small `keep_snapshots` / `keep_checkpoints`) never
//! deletes a snapshot the model still needs — the restore point, the one rewound to and the
//! undo, the newest ones its counts keep — nor brings one back.

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::Value;

use crate::server::{kill_server_of, ServerHome};
use crate::support::{ok, stderr, stdout};

const TASK: &str = "prop";
const NAMES: [&str; 3] = ["a", "b", "c"];

type Files = BTreeMap<String, String>;

#[derive(Debug, Clone)]
enum Action {
    Write {
        file: usize,
        text: String,
    },
    /// A write, then a checkpoint (sequences with more snapshots to rewind to and retire).
    WriteCheckpoint {
        file: usize,
        text: String,
    },
    Remove {
        file: usize,
    },
    Checkpoint,
    /// `rewind --to` the model's `n`-th known snapshot (modulo their number), or an unknown
    /// one when it knows none.
    RewindTo(usize),
    RewindBack(u64),
    /// `rewind --to` what the last rewind kept (`saved`), when there was one.
    Undo,
    Suspend,
    Run,
    Crash,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (0..NAMES.len(), "[a-z]{1,6}").prop_map(|(file, text)| Action::Write { file, text }),
        3 => (0..NAMES.len(), "[a-z]{1,6}")
            .prop_map(|(file, text)| Action::WriteCheckpoint { file, text }),
        1 => (0..NAMES.len()).prop_map(|file| Action::Remove { file }),
        2 => Just(Action::Checkpoint),
        2 => (0usize..8).prop_map(Action::RewindTo),
        2 => (1u64..3).prop_map(Action::RewindBack),
        1 => Just(Action::Undo),
        1 => Just(Action::Suspend),
        1 => Just(Action::Run),
        1 => Just(Action::Crash),
    ]
}

/// What a rewind names: `--to TASK.sN` (or a snapshot id), or `--back N`.
#[derive(Debug)]
enum Target {
    To(String),
    Back(u64),
}

/// A snapshot the model has seen: the files it holds and what made it.
#[derive(Debug, Clone)]
struct Snap {
    id: String,
    files: Files,
    kind: String,
    /// Complete when last looked at (retention retires snapshots, never brings one back).
    complete: bool,
}

struct Model {
    h: ServerHome,
    keep: usize,
    keep_checkpoints: usize,
    /// The task's files: the live sandbox's, or those a restore would bring back.
    files: Files,
    /// Whether a sandbox is live.
    live: bool,
    /// Whether the live files changed since the restore point (`None`: unknown — after a
    /// server crash the new server may have kept the live sandbox or restored it).
    mutated: Option<bool>,
    snaps: BTreeMap<u64, Snap>,
    /// The snapshot holding the files (the one a restore uses): the newest taken, or the one
    /// a rewind restored until a newer one is taken.
    restore_point: Option<u64>,
    /// What the last rewind restored and kept, while no newer snapshot was taken.
    rewound: Option<(u64, Option<u64>)>,
    /// What the last successful rewind kept, for `Undo`.
    last_saved: Option<String>,
    step: usize,
    log: Vec<String>,
}

impl Model {
    fn new(isolated: bool, keep: usize, keep_checkpoints: usize) -> Model {
        let h = ServerHome::new();
        let mode = if isolated { "namespaces" } else { "none" };
        for (k, v) in [
            ("terminal.local_isolation", mode.to_string()),
            ("terminal.keep_snapshots", keep.to_string()),
            ("terminal.keep_checkpoints", keep_checkpoints.to_string()),
        ] {
            ok(&h.home.run(&["config", "set", k, &v]));
        }
        // The task exists from its first command: an empty workspace in a live sandbox.
        ok(&h.home.run(&["run", "--task", TASK, "--", "true"]));
        Model {
            h,
            keep,
            keep_checkpoints,
            files: Files::new(),
            live: true,
            mutated: Some(false),
            snaps: BTreeMap::new(),
            restore_point: None,
            rewound: None,
            last_saved: None,
            step: 0,
            log: vec![format!(
                "isolation {mode}, keep {keep}, keep_checkpoints {keep_checkpoints}"
            )],
        }
    }

    fn ctx(&self) -> String {
        format!("after {:?}", self.log)
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        self.h.home.run(args)
    }

    fn json(&self, out: &std::process::Output) -> Result<Value, TestCaseError> {
        serde_json::from_str(&stdout(out)).map_err(|e| {
            TestCaseError::fail(format!(
                "not JSON ({e}): {} / {} {}",
                stdout(out),
                stderr(out),
                self.ctx()
            ))
        })
    }

    /// Runs `script` in the task's sandbox (restoring it if none is live).
    fn shell(&mut self, script: &str) -> Result<String, TestCaseError> {
        let out = self.run(&["run", "--task", TASK, "--", script]);
        prop_assert!(
            out.status.success(),
            "run {script:?} failed: {} {} {}",
            stdout(&out),
            stderr(&out),
            self.ctx()
        );
        if !self.live {
            // A restore: the files are the restore point's, nothing changed since.
            self.live = true;
            self.mutated = Some(false);
        }
        Ok(stdout(&out))
    }

    /// The workspace's files as the sandbox sees them.
    fn read(&mut self) -> Result<Files, TestCaseError> {
        let text =
            self.shell("for f in $(ls -A); do printf '%s=%s\\n' \"$f\" \"$(cat \"$f\")\"; done")?;
        let mut files = Files::new();
        for line in text.lines() {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| TestCaseError::fail(format!("odd line {line:?}: {text}")))?;
            files.insert(k.to_string(), v.to_string());
        }
        Ok(files)
    }

    fn check_files(&mut self) -> Result<(), TestCaseError> {
        let seen = self.read()?;
        prop_assert_eq!(
            &seen,
            &self.files,
            "the workspace is not the model's {}",
            self.ctx()
        );
        Ok(())
    }

    fn rp_files(&self) -> Files {
        self.restore_point
            .and_then(|s| self.snaps.get(&s))
            .map(|s| s.files.clone())
            .unwrap_or_default()
    }

    /// `show --json`: learns the snapshots made since (holding `before`, the files when the
    /// action began: every snapshot an action makes keeps the files it found) and checks
    /// retention. Returns the seqs of the new ones.
    fn learn(&mut self, before: &Files) -> Result<Vec<u64>, TestCaseError> {
        let out = self.run(&["show", TASK, "--json"]);
        prop_assert!(
            out.status.success(),
            "show: {} {}",
            stderr(&out),
            self.ctx()
        );
        let view = self.json(&out)?;
        let mut new = Vec::new();
        for s in view["task"]["snapshots"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let seq = s["seq"].as_u64().expect("seq");
            let complete = s["status"] == "complete";
            match self.snaps.get_mut(&seq) {
                Some(known) => {
                    prop_assert!(
                        known.complete || !complete,
                        "snapshot s{seq} came back from retention {}",
                        self.ctx()
                    );
                    known.complete = complete;
                }
                None => {
                    prop_assert!(
                        complete,
                        "new snapshot s{seq} is not complete: {s} {}",
                        self.ctx()
                    );
                    let id = s["id"]
                        .as_str()
                        .expect("a complete snapshot's id")
                        .to_string();
                    let kind = s["kind"].as_str().unwrap_or("-").to_string();
                    self.snaps.insert(
                        seq,
                        Snap {
                            id,
                            files: before.clone(),
                            kind,
                            complete,
                        },
                    );
                    new.push(seq);
                }
            }
        }
        Ok(new)
    }

    /// Retention kept what the model needs: the restore point, what a rewind restored and
    /// kept, and the newest `keep_checkpoints` checkpoints and `keep_snapshots` others.
    fn check_retention(&self) -> Result<(), TestCaseError> {
        let mut needed: Vec<u64> = self.restore_point.into_iter().collect();
        if let Some((to, saved)) = self.rewound {
            needed.push(to);
            needed.extend(saved);
        }
        let newest = |checkpoints: bool, n: usize| -> Vec<u64> {
            self.snaps
                .iter()
                .rev()
                .filter(|(_, s)| matches!(s.kind.as_str(), "checkpoint" | "rewind") == checkpoints)
                .take(n)
                .map(|(seq, _)| *seq)
                .collect()
        };
        needed.extend(newest(true, self.keep_checkpoints));
        needed.extend(newest(false, self.keep));
        for seq in needed {
            let s = &self.snaps[&seq];
            prop_assert!(
                s.complete,
                "retention deleted s{seq} ({}) the model needs {}",
                s.kind,
                self.ctx()
            );
        }
        Ok(())
    }

    fn name(&self, file: usize) -> &'static str {
        NAMES[file]
    }

    fn act(&mut self, a: &Action) -> Result<(), TestCaseError> {
        self.step += 1;
        self.log.push(format!("{a:?}"));
        let before = self.files.clone();
        match a {
            Action::Write { file, text } => self.write(*file, text)?,
            Action::WriteCheckpoint { file, text } => {
                self.write(*file, text)?;
                let before = self.files.clone();
                self.checkpoint(&before)?;
            }
            Action::Remove { file } => {
                let name = self.name(*file);
                self.shell(&format!("rm -f {name}"))?;
                if self.files.remove(name).is_some() {
                    self.mutated = Some(true);
                }
                self.check_files()?;
            }
            Action::Checkpoint => self.checkpoint(&before)?,
            Action::RewindTo(n) => {
                let to = match self.snaps.len() {
                    0 => format!("{TASK}.s99"),
                    len => {
                        let seq = *self.snaps.keys().nth(n % len).expect("in range");
                        format!("{TASK}.s{seq}")
                    }
                };
                self.rewind(&before, Target::To(to))?;
            }
            Action::RewindBack(n) => self.rewind(&before, Target::Back(*n))?,
            Action::Undo => match self.last_saved.clone() {
                Some(saved) => self.rewind(&before, Target::To(saved))?,
                None => self.checkpoint(&before)?,
            },
            Action::Suspend => {
                let out = self.run(&["suspend", TASK]);
                if self.live {
                    prop_assert!(
                        out.status.success(),
                        "suspend: {} {}",
                        stderr(&out),
                        self.ctx()
                    );
                }
                let new = self.learn(&before)?;
                if self.live {
                    if self.changed() == Some(true) {
                        prop_assert!(
                            !new.is_empty(),
                            "suspend kept no snapshot of changed files {}",
                            self.ctx()
                        );
                    }
                    self.live = false;
                } else {
                    prop_assert!(
                        new.is_empty(),
                        "suspend without a sandbox made {new:?} {}",
                        self.ctx()
                    );
                }
                if let Some(&seq) = new.last() {
                    self.took(seq);
                }
                prop_assert_eq!(
                    self.rp_files(),
                    self.files.clone(),
                    "the restore point is not the files {}",
                    self.ctx()
                );
            }
            Action::Run => self.check_files()?,
            Action::Crash => {
                let pid = self.h.server_pid();
                kill_server_of(&self.h.data());
                if pid.is_some() && self.live {
                    // The new server keeps the live sandbox, or restores the restore point.
                    let seen = self.read()?;
                    let rp = self.rp_files();
                    prop_assert!(
                        seen == self.files || seen == rp,
                        "after a crash the workspace {seen:?} is neither the live files {:?} nor the restore point's {rp:?} {}",
                        self.files,
                        self.ctx()
                    );
                    if seen != self.files {
                        self.mutated = Some(false);
                    } else if seen != rp {
                        self.mutated = Some(true);
                    } else {
                        self.mutated = None;
                    }
                    self.files = seen;
                }
                let new = self.learn(&before)?;
                prop_assert!(
                    new.is_empty(),
                    "a crash made snapshots {new:?} {}",
                    self.ctx()
                );
            }
        }
        self.check_retention()
    }

    fn write(&mut self, file: usize, text: &str) -> Result<(), TestCaseError> {
        // Unique content: every write changes the file.
        let content = format!("{text}{}", self.step);
        let name = self.name(file);
        self.shell(&format!("printf %s {content} > {name}"))?;
        self.files.insert(name.to_string(), content);
        self.mutated = Some(true);
        self.check_files()
    }

    /// Whether the live files differ from the restore point: `Some(true)` certainly (so a
    /// checkpoint must be taken), `Some(false)` certainly not (it must not), `None` either
    /// (changed back to the same content, or unknown after a crash).
    fn changed(&self) -> Option<bool> {
        if self.files != self.rp_files() {
            return Some(true);
        }
        match (self.mutated, self.restore_point) {
            (Some(false), Some(_)) => Some(false),
            _ => None,
        }
    }

    /// A snapshot `seq` was taken of the files: it holds them now.
    fn took(&mut self, seq: u64) {
        self.restore_point = Some(seq);
        self.rewound = None;
        self.mutated = Some(false);
    }

    fn checkpoint(&mut self, before: &Files) -> Result<(), TestCaseError> {
        let out = self.run(&["checkpoint", TASK, "--json"]);
        prop_assert!(
            out.status.success(),
            "checkpoint: {} {} {}",
            stdout(&out),
            stderr(&out),
            self.ctx()
        );
        let v = self.json(&out)?;
        let outcome = v["outcome"].as_str().unwrap_or_default().to_string();
        let new = self.learn(before)?;
        if !self.live {
            prop_assert_eq!(outcome.as_str(), "no_sandbox", "{} {}", v, self.ctx());
            prop_assert!(new.is_empty());
            return Ok(());
        }
        let changed = self.changed();
        match outcome.as_str() {
            "taken" => {
                prop_assert!(
                    changed != Some(false),
                    "a checkpoint of unchanged files was taken: {} {}",
                    v,
                    self.ctx()
                );
                prop_assert_eq!(new.len(), 1, "{} {}", v, self.ctx());
                prop_assert_eq!(v["seq"].as_u64(), Some(new[0]), "{}", v);
                prop_assert_eq!(self.snaps[&new[0]].kind.as_str(), "checkpoint");
                self.took(new[0]);
            }
            "unchanged" => {
                prop_assert!(
                    changed != Some(true),
                    "a checkpoint of changed files was not taken: {} {}",
                    v,
                    self.ctx()
                );
                prop_assert!(new.is_empty(), "{} {}", v, self.ctx());
                let rp = self.restore_point.map(|s| self.snaps[&s].id.clone());
                prop_assert_eq!(
                    v["snapshot_id"].as_str(),
                    rp.as_deref(),
                    "unchanged names another snapshot {}",
                    self.ctx()
                );
                self.mutated = Some(false);
            }
            other => prop_assert!(false, "checkpoint outcome {other}: {v} {}", self.ctx()),
        }
        self.check_files()
    }

    /// `rewind ARGS`: the model predicts the snapshot that keeps the files, then the target
    /// (or the refusal), from the complete snapshots it knows.
    fn rewind(&mut self, before: &Files, target: Target) -> Result<(), TestCaseError> {
        if self.live && self.changed().is_none() && matches!(target, Target::Back(_)) {
            // Whether a checkpoint is kept first moves where `--back` counts from, and the
            // model cannot say (files changed back to what the snapshot holds, or after a
            // crash): a checkpoint first settles it.
            self.log.push("(checkpoint first)".to_string());
            let out = self.run(&["checkpoint", TASK, "--json"]);
            prop_assert!(out.status.success(), "checkpoint: {}", stderr(&out));
            if let Some(&seq) = self.learn(before)?.last() {
                self.took(seq);
            }
            self.mutated = Some(false);
        }
        // 1. The files are kept first: a new checkpoint when the live ones changed.
        let will_save = match self.live {
            true => self.changed(),
            false => Some(false),
        };
        let complete: Vec<u64> = self
            .snaps
            .iter()
            .filter(|(_, s)| s.complete)
            .map(|(q, _)| *q)
            .collect();
        // 2. The target, or why none (`None` in the list: the checkpoint about to be kept).
        let predicted: Result<Option<u64>, &str> = match &target {
            Target::To(name) => {
                let seq = name
                    .strip_prefix(&format!("{TASK}.s"))
                    .and_then(|s| s.parse::<u64>().ok())
                    .or_else(|| {
                        self.snaps
                            .iter()
                            .find(|(_, s)| s.id == *name)
                            .map(|(q, _)| *q)
                    });
                match seq.and_then(|q| self.snaps.get(&q).map(|s| (q, s))) {
                    None => Err("unknown_snapshot"),
                    Some((_, s)) if !s.complete => Err("snapshot_unusable"),
                    Some((q, _)) => Ok(Some(q)),
                }
            }
            Target::Back(n) => {
                let n = usize::try_from(*n).expect("a small n");
                let mut list: Vec<Option<u64>> = complete.iter().copied().map(Some).collect();
                let pos = match will_save {
                    Some(true) => {
                        list.push(None);
                        list.len() - 1
                    }
                    _ => self
                        .restore_point
                        .and_then(|rp| list.iter().position(|s| *s == Some(rp)))
                        .unwrap_or(list.len().saturating_sub(1)),
                };
                match n > pos {
                    true => Err("rewind_too_far"),
                    false => Ok(list[pos - n]),
                }
            }
        };
        let args = match &target {
            Target::To(name) => vec!["--to".to_string(), name.clone()],
            Target::Back(n) => vec!["--back".to_string(), n.to_string()],
        };
        let mut full = vec!["rewind", TASK];
        full.extend(args.iter().map(String::as_str));
        full.push("--json");
        let out = self.run(&full);
        let v = self.json(&out)?;
        let new = self.learn(before)?;
        let saved_seq = match new.as_slice() {
            [] => {
                prop_assert!(
                    will_save != Some(true),
                    "a rewind kept no checkpoint of changed files {v} {}",
                    self.ctx()
                );
                self.restore_point
            }
            [seq] => {
                prop_assert!(
                    will_save != Some(false),
                    "a rewind kept unchanged files again {v} {}",
                    self.ctx()
                );
                prop_assert_eq!(self.snaps[seq].kind.as_str(), "rewind", "{}", v);
                Some(*seq)
            }
            more => {
                return Err(TestCaseError::fail(format!(
                    "a rewind made {more:?} {}",
                    self.ctx()
                )))
            }
        };
        match predicted {
            Err(code) => {
                prop_assert!(
                    !out.status.success(),
                    "rewind {args:?} succeeded, the model expected {code}: {v} {}",
                    self.ctx()
                );
                prop_assert_eq!(v["code"].as_str(), Some(code), "{} {}", v, self.ctx());
                if let Some(seq) = new.first() {
                    self.took(*seq);
                }
                if self.live {
                    self.check_files()?;
                }
            }
            Ok(target) => {
                prop_assert!(
                    out.status.success(),
                    "rewind {args:?} failed: {v} {} {}",
                    stderr(&out),
                    self.ctx()
                );
                let to = target.expect("never the checkpoint just kept");
                prop_assert_eq!(
                    v["to"].as_str(),
                    Some(self.snaps[&to].id.as_str()),
                    "rewound to another snapshot than s{} {}",
                    to,
                    self.ctx()
                );
                prop_assert_eq!(v["to_seq"].as_u64(), Some(to));
                let saved_id = saved_seq.map(|s| self.snaps[&s].id.clone());
                prop_assert_eq!(
                    v["saved"].as_str(),
                    saved_id.as_deref(),
                    "{} {}",
                    v,
                    self.ctx()
                );
                if let Some(seq) = saved_seq {
                    prop_assert_eq!(
                        &self.snaps[&seq].files,
                        before,
                        "the kept snapshot is not the files before {}",
                        self.ctx()
                    );
                }
                self.files = self.snaps[&to].files.clone();
                self.live = true;
                self.mutated = Some(false);
                self.restore_point = Some(to);
                self.rewound = Some((to, saved_seq));
                self.last_saved = saved_id;
                self.check_files()?;
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::support::proptest_cases(20, 20), max_shrink_iters: 20, failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/checkpoint_prop.txt"))), ..ProptestConfig::default() })]

    /// The workspace is always the model's; every rewind restores the snapshot the model names
    /// and is undoable; refusals are the predicted ones; retention keeps what the model needs.
    #[test]
    fn the_real_local_backend_keeps_the_files_the_model_says(
        isolated in any::<bool>(),
        keep in 1usize..3,
        keep_checkpoints in 1usize..3,
        actions in proptest::collection::vec(action(), 4..10),
    ) {
        let isolated = isolated
            && crate::support::isolation_modes("the_real_local_backend_keeps_the_files")
                .contains(&"namespaces");
        let mut m = Model::new(isolated, keep, keep_checkpoints);
        for a in &actions {
            m.act(a)?;
        }
    }
}
