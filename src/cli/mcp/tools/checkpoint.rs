//! The `checkpoint_task` and `rewind_task` tools: a snapshot of a live sandbox that keeps it
//! running, and a task's files put back as one of its snapshots held them (the current files
//! kept first, so the rewind is undone by rewinding to them).

use rmcp::model::{Tool, ToolAnnotations};
use rmcp::schemars::JsonSchema;
use serde::Deserialize;

use taskbox::core::CheckpointOutcome;
use taskbox::engine::{CheckpointResult, RewindResult};
use taskbox::TaskId;

use super::super::super::output::{self, Failure};
use super::super::super::server;
use super::super::Engine;
use super::{success, task_id, tool, Answer, TaskArgs, Taskbox};

/// `rewind_task`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
#[serde(deny_unknown_fields)]
pub(super) struct RewindArgs {
    /// The task's name.
    task: String,
    /// The snapshot to rewind to: `TASK.sN` as show_task numbers them, or a snapshot id. Give
    /// this or `back`.
    #[serde(default)]
    to: Option<String>,
    /// How many snapshots back from the one holding the current files. Give this or `to`.
    #[serde(default)]
    back: Option<u64>,
}

/// The two tools' definitions.
pub(super) fn tools() -> Vec<Tool> {
    vec![
        tool::<TaskArgs>(
            "checkpoint_task",
            "Snapshot the task's files now without stopping its sandbox: running processes are \
             paused for a moment and keep running. Nothing is made when nothing changed. Use it \
             before a risky command; rewind_task goes back to it.",
        )
        .annotate(ToolAnnotations::new().destructive(false).idempotent(true)),
        tool::<RewindArgs>(
            "rewind_task",
            "Put the task's files back as a snapshot held them (to: TASK.sN, or back: N snapshots). \
             The current files are kept in a checkpoint first, so rewinding to it undoes this; \
             running processes end (the sandbox is restored anew).",
        )
        .annotate(ToolAnnotations::new().destructive(true)),
    ]
}

impl Engine {
    async fn checkpoint(&self, task: &TaskId) -> Result<CheckpointResult, Failure> {
        match self {
            Engine::InProcess(orch) => orch.checkpoint(task).await.map_err(Failure::from_engine),
            Engine::Server(client, mode) => {
                server::call(client, *mode, |c| {
                    let task = task.clone();
                    async move { c.checkpoint(&task).await }
                })
                .await
            }
        }
    }

    async fn rewind(
        &self,
        task: &TaskId,
        to: Option<&str>,
        back: Option<u64>,
    ) -> Result<RewindResult, Failure> {
        let target = taskbox::engine::rewind_to(task, to, back)
            .map_err(|why| Failure::new(why).code("bad_request"))?;
        match self {
            Engine::InProcess(orch) => orch
                .rewind(task, target)
                .await
                .map_err(Failure::from_engine),
            Engine::Server(client, mode) => {
                server::call(client, *mode, |c| {
                    let (task, to) = (task.clone(), to.map(str::to_string));
                    async move { c.rewind(&task, to.as_deref(), back).await }
                })
                .await
            }
        }
    }
}

impl Taskbox {
    pub(super) async fn checkpoint_task(&self, a: TaskArgs) -> Answer {
        let task = task_id(&a.task)?;
        let res = self.engine.checkpoint(&task).await?;
        let named = match (&res.snapshot_id, res.seq) {
            (Some(id), Some(seq)) => format!("{task}.s{seq} ({id})"),
            _ => "no snapshot".to_string(),
        };
        let text = match res.outcome {
            CheckpointOutcome::Taken => {
                format!("checkpointed {task}: files kept in {named}; its processes run on")
            }
            CheckpointOutcome::Unchanged => {
                format!("nothing changed in {task} since {named}, which holds its files")
            }
            CheckpointOutcome::Stopped => format!(
                "checkpointed {task} in {named}; this backend's snapshot stopped the sandbox \
                 (processes ended): the next command restores it"
            ),
            CheckpointOutcome::NoSandbox => {
                format!("{task} has no live sandbox: nothing to checkpoint (its files: {named})")
            }
        };
        Ok(success(
            text,
            serde_json::json!({
                "task": task.as_str(), "snapshot_id": res.snapshot_id, "seq": res.seq,
                "outcome": res.outcome,
            }),
        ))
    }

    pub(super) async fn rewind_task(&self, a: RewindArgs) -> Answer {
        let task = task_id(&a.task)?;
        let res = self.engine.rewind(&task, a.to.as_deref(), a.back).await?;
        let mut text = String::new();
        for n in &res.notices {
            text.push_str(&format!("note: {}\n", output::notice_text(n)));
        }
        text.push_str(&format!(
            "rewound {task} to {task}.s{} ({}); running processes ended",
            res.to_seq, res.to
        ));
        if let (Some(id), Some(seq)) = (&res.saved, res.saved_seq) {
            text.push_str(&format!(
                "; the files before are kept in {task}.s{seq} ({id}): rewind to it to undo"
            ));
        }
        Ok(success(
            text,
            serde_json::json!({
                "task": task.as_str(), "to": res.to, "to_seq": res.to_seq, "saved": res.saved,
                "saved_seq": res.saved_seq, "sandbox_id": res.sandbox_id, "notices": res.notices,
            }),
        ))
    }
}
