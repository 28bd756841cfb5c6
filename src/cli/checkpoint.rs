//! `taskbox checkpoint` and `taskbox rewind`: a snapshot of a live sandbox that keeps it
//! running, and a task's files put back as one of its snapshots held them.

use super::*;
use taskbox::core::CheckpointOutcome;

#[derive(Args, Debug)]
pub(super) struct CheckpointArgs {
    /// The task.
    task: String,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

impl CheckpointArgs {
    pub(super) fn json(&self) -> bool {
        self.json
    }
}

#[derive(Args, Debug)]
pub(super) struct RewindArgs {
    /// The task.
    task: String,
    /// The snapshot to rewind to: `TASK.sN` (as `taskbox show` numbers them), `sN`, or a
    /// provider snapshot id.
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "back")]
    to: Option<String>,
    /// Rewind N snapshots back from the one holding the current files.
    #[arg(long, value_name = "N")]
    back: Option<u64>,
    /// Print JSON on stdout.
    #[arg(long)]
    json: bool,
}

impl RewindArgs {
    pub(super) fn json(&self) -> bool {
        self.json
    }
}

pub(super) async fn checkpoint(args: CheckpointArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let task = task_id(&args.task)?;
    let res = match route(paths)? {
        Route::InProcess => {
            let orch = open(paths).await?;
            let res = orch.checkpoint(&task).await;
            orch.shutdown().await;
            res.map_err(Failure::from_engine)?
        }
        #[cfg(feature = "server")]
        Route::Server(client, mode) => {
            server::call(&client, mode, |c| {
                let task = task.clone();
                async move { c.checkpoint(&task).await }
            })
            .await?
        }
    };
    if args.json {
        print_json(&serde_json::json!({
            "task": task.as_str(),
            "snapshot_id": res.snapshot_id,
            "seq": res.seq,
            "outcome": res.outcome,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let named = match (&res.snapshot_id, res.seq) {
        (Some(id), Some(seq)) => format!("{task}.s{seq} ({id})"),
        (Some(id), None) => id.to_string(),
        _ => String::new(),
    };
    match res.outcome {
        CheckpointOutcome::Taken => {
            eprintln!("checkpointed {task}: files kept in {named}; its processes run on")
        }
        CheckpointOutcome::Unchanged => eprintln!(
            "checkpointed {task}: nothing changed since {named}, which holds the files; no new \
             snapshot"
        ),
        CheckpointOutcome::Stopped => eprintln!(
            "checkpointed {task}: files kept in {named}; this backend's snapshot stopped the \
             sandbox (live processes ended), and the next command restores it"
        ),
        CheckpointOutcome::NoSandbox if named.is_empty() => {
            eprintln!("{task} has no live sandbox and no snapshot: nothing to checkpoint")
        }
        CheckpointOutcome::NoSandbox => {
            eprintln!("{task} has no live sandbox: nothing to checkpoint; its files are in {named}")
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn rewind(args: RewindArgs, paths: &Paths) -> Result<ExitCode, Failure> {
    let task = task_id(&args.task)?;
    let to = taskbox::engine::rewind_to(&task, args.to.as_deref(), args.back).map_err(|why| {
        Failure::new(why)
            .code("bad_request")
            .hint(format!("`taskbox show {task}` lists the task's snapshots"))
    })?;
    let res = match route(paths)? {
        Route::InProcess => {
            let orch = open(paths).await?;
            let res = orch.rewind(&task, to).await;
            orch.shutdown().await;
            res.map_err(Failure::from_engine)?
        }
        #[cfg(feature = "server")]
        Route::Server(client, mode) => {
            server::call(&client, mode, |c| {
                let (task, to, back) = (task.clone(), args.to.clone(), args.back);
                async move { c.rewind(&task, to.as_deref(), back).await }
            })
            .await?
        }
    };
    if args.json {
        print_json(&serde_json::json!({
            "task": task.as_str(),
            "to": res.to,
            "to_seq": res.to_seq,
            "saved": res.saved,
            "saved_seq": res.saved_seq,
            "sandbox_id": res.sandbox_id,
            "notices": res.notices,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let saved = match (&res.saved, res.saved_seq) {
        (Some(id), Some(seq)) => format!(
            "; the files before are kept in {task}.s{seq} ({id}): `taskbox rewind {task} --to \
             {task}.s{seq}` undoes this"
        ),
        _ => String::new(),
    };
    eprintln!(
        "rewound {task} to {task}.s{} ({}) in a new sandbox {} (live processes ended){saved}",
        res.to_seq, res.to, res.sandbox_id
    );
    Ok(ExitCode::SUCCESS)
}
