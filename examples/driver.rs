//! A library driver: several tasks driven concurrently by one orchestrator, with their state
//! changes printed as they are committed.
//!
//! ```sh
//! cargo run --example driver            # data in a temporary directory
//! cargo run --example driver -- DIR     # data in DIR (kept)
//! ```

// An example is a program of its own: printing what it drives is its point.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Duration;

use taskbox::config::Config;
use taskbox::engine::Orchestrator;
use taskbox::TaskId;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let temp = tempfile::tempdir()?;
    let data_dir = std::env::args()
        .nth(1)
        .map(Into::into)
        .unwrap_or_else(|| temp.path().to_path_buf());
    let orch = Orchestrator::builder(data_dir, Config::default())
        .open()
        .await?;

    let mut changes = orch.watch();
    let watcher = tokio::spawn(async move {
        while let Ok(c) = changes.recv().await {
            println!("  [{}] {} -> {} ({})", c.task_id, c.from, c.to, c.event);
        }
    });

    let mut jobs = Vec::new();
    for i in 0..4 {
        let orch = orch.clone();
        jobs.push(tokio::spawn(async move {
            let task = TaskId::new(&format!("agent-{i}"))?;
            let out = orch
                .run(
                    &task,
                    &format!("echo 'work of agent {i}' > notes.txt; cat notes.txt"),
                    None,
                )
                .await?;
            print!("{task}: {}", out.stdout);
            orch.suspend(&task).await?;
            let again = orch
                .run(&task, "cat notes.txt", Some(Duration::from_secs(30)))
                .await?;
            print!("{task} after suspend and restore: {}", again.stdout);
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for job in jobs {
        job.await?.map_err(|e| e.to_string())?;
    }

    for task in orch.tasks().await? {
        println!("{:<10} {}", task.id, task.state);
    }
    orch.shutdown().await;
    watcher.abort();
    Ok(())
}
