//! Sandboxes and commands: create, reuse, the working directory, exit codes and streams, timeouts
//! that kill the process group, background jobs, bounded output and concurrency.

use std::fs;

use taskbox::ids::SandboxId;
use taskbox::provider::SandboxProvider;

use super::{pid_gone, spec, wait_for, Env, START_MS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_exec_and_reuse() {
    let env = Env::new();
    let id = env.create("t1", 1, None).await;
    assert_eq!(id, "taskbox-t1-g1-insta");
    let workspace = env.provider.workspace_path(&id).expect("workspace exists");

    let out = env
        .run(
            &id,
            "echo hi; echo oops >&2; echo \"$TASKBOX_TASK_ID $TASKBOX_SANDBOX\"; echo data > f",
        )
        .await;
    assert_eq!(out.exit_code, 0);
    assert!(!out.timed_out);
    assert_eq!(out.stdout, "hi\nt1 taskbox-t1-g1-insta\n");
    assert_eq!(out.stderr, "oops\n");
    assert_eq!(fs::read_to_string(workspace.join("f")).unwrap(), "data\n");

    // A second create finds the same sandbox (same deadline, files kept).
    let again = env
        .provider
        .create_sandbox(&spec("t1", 1, None, 600_000))
        .await
        .unwrap();
    assert_eq!(again.deadline, START_MS + 600_000);
    assert_eq!(env.run(&id, "cat f").await.stdout, "data\n");
    assert_eq!(
        env.provider.probe_sandbox(&id).await.unwrap(),
        Some(START_MS + 600_000)
    );
    assert!(env.tmp_entries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn working_directory_is_carried_between_commands() {
    let env = Env::new();
    let id = env.create("cwd", 1, None).await;
    let workspace = env.provider.workspace_path(&id).unwrap();

    env.run(&id, "mkdir -p sub/deeper && cd sub").await;
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.join("sub").display())
    );
    // `exit N` still records the directory, and keeps its code.
    let out = env.run(&id, "cd deeper; exit 5").await;
    assert_eq!(out.exit_code, 5);
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.join("sub/deeper").display())
    );
    // The recorded directory disappears: the next command starts at the workspace root.
    env.run(&id, "rm -rf ../deeper").await;
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.display())
    );
    // Leaving the workspace is not carried over either.
    env.run(&id, "cd /").await;
    assert_eq!(
        env.run(&id, "pwd").await.stdout,
        format!("{}\n", workspace.display())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_streams_are_preserved_exactly() {
    let env = Env::new();
    let id = env.create("codes", 1, None).await;
    for (command, code, stdout) in [
        ("echo out; exit 3", 3, "out\n"),
        ("false", 1, ""),
        ("(exit 42)", 42, ""),
        ("true", 0, ""),
        ("kill -9 $$", 137, ""),
        ("printf 'no newline'", 0, "no newline"),
    ] {
        let out = env.run(&id, command).await;
        assert_eq!(out.exit_code, code, "`{command}`");
        assert_eq!(out.stdout, stdout, "`{command}`");
        assert_eq!(out.stderr, "", "`{command}`");
    }
    // The bookkeeping after the command survives errexit, noclobber and shadowing functions.
    for command in [
        "set -e; mkdir -p gone && cd gone && rmdir ../gone; exit 3",
        "set -C; pwd() { echo fake; }; exit 3",
        "exit() { echo no; }; builtin exit 3",
    ] {
        let out = env.run(&id, command).await;
        assert_eq!((out.exit_code, out.stderr.as_str()), (3, ""), "`{command}`");
    }
    // A syntax error is bash's, with bash's code and message.
    let out = env.run(&id, "if then").await;
    assert_eq!(out.exit_code, 2);
    assert!(out.stderr.contains("syntax error"), "{}", out.stderr);
    // Invalid UTF-8 is converted lossily.
    let out = env.run(&id, "printf 'a\\377b'").await;
    assert_eq!(out.stdout, "a\u{fffd}b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_process_group() {
    let env = Env::new();
    let id = env.create("slow", 1, None).await;
    let out = env
        .try_run(&id, "sleep 100 & echo $!; sleep 30", 1_500)
        .await
        .unwrap();
    assert_eq!(out.exit_code, 124);
    assert!(out.timed_out);
    assert!(out.duration_ms < 5_000, "took {} ms", out.duration_ms);
    let pid: u32 = out.stdout.trim().parse().expect("background pid printed");
    wait_for("the background sleep to die", || pid_gone(pid)).await;
    // The sandbox itself survives a command timeout.
    assert_eq!(env.run(&id, "echo alive").await.stdout, "alive\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_command_may_leave_a_background_job_until_the_sandbox_stops() {
    let env = Env::new();
    let id = env.create("bg", 1, None).await;
    // The job keeps stdout open; the command still returns promptly.
    let out = env.run(&id, "sleep 100 & echo $!").await;
    assert!(out.duration_ms < 5_000);
    let pid: u32 = out.stdout.trim().parse().unwrap();
    assert!(
        !pid_gone(pid),
        "the background job outlives its command, as on a VM"
    );
    env.provider.stop_sandbox(&id).await.unwrap();
    wait_for("the stop to kill the background job", || pid_gone(pid)).await;
    assert!(env.provider.workspace_path(&id).is_none());
    // Stopping again succeeds.
    env.provider.stop_sandbox(&id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_writing_after_its_command_returned_keeps_running() {
    let env = Env::new();
    let id = env.create("server", 1, None).await;
    // The job writes to the command's stdout after the command has returned; closing the pipe
    // would kill it with SIGPIPE before it writes the marker.
    let out = env
        .run(
            &id,
            "(sleep 0.6; echo late; echo late >&2; sleep 0.2; touch marker) & echo started",
        )
        .await;
    assert_eq!(out.stdout, "started\n");
    let marker = env.provider.workspace_path(&id).unwrap().join("marker");
    wait_for("the background job to finish its work", || marker.exists()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_output_keeps_head_and_tail_and_says_what_was_cut() {
    let env = Env::new();
    let id = env.create("loud", 1, None).await;
    let out = env.run(&id, "yes | head -c 5000000; echo done >&2").await;
    assert_eq!(out.exit_code, 0);
    assert!(out.stdout.starts_with("y\ny\ny\n"));
    assert!(out.stdout.ends_with("y\ny\n"));
    assert!(
        out.stdout
            .contains("\n[taskbox: output truncated, 4950000 of 5000000 characters omitted]\n"),
        "{}",
        &out.stdout[19_990..20_100]
    );
    assert!(out.stdout.len() < 50_100, "{} bytes", out.stdout.len());
    assert_eq!(out.stderr, "done\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_in_different_sandboxes_run_concurrently() {
    let env = Env::new();
    let a = env.create("conc-a", 1, None).await;
    let b = env.create("conc-b", 1, None).await;
    let flag = env.outside().join("flag");
    let waiter = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; echo seen",
        flag.display()
    );
    let toucher = format!("touch '{}'", flag.display());
    // If B waited for A to finish, A would wait for the flag until its timeout.
    let (out_a, out_b) = tokio::join!(env.try_run(&a, &waiter, 5_000), async {
        env.run(&b, &toucher).await
    });
    let out_a = out_a.unwrap();
    assert_eq!((out_a.exit_code, out_a.stdout.as_str()), (0, "seen\n"));
    assert_eq!(out_b.exit_code, 0);
}

/// A live reader that takes nothing cannot hold a command past its timeout: the command's
/// writes wait (as on a full pipe), its timeout kills it, and once the stuck reader has taken
/// nothing for a while the result comes back with the whole capture.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_live_reader_does_not_hold_the_result() {
    let env = Env::new();
    let id = env.create("stuck", 1, None).await;
    let (tx, _never_read) = tokio::sync::mpsc::channel(1);
    let io = taskbox::provider::ExecIo {
        output: Some(tx),
        ..Default::default()
    };
    let req = taskbox::provider::ExecRequest {
        command: "head -c 10000000 /dev/zero; echo done".to_string(),
        timeout_ms: 1_000,
    };
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        env.provider.exec_live(&id, &req, io),
    )
    .await
    .expect("the result came back")
    .expect("exec");
    assert!(out.timed_out, "{out:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    // The sandbox serves the next command.
    assert_eq!(env.run(&id, "echo next").await.stdout, "next\n");
}

/// Runs `command` in sandbox `id`, cancelling it (SIGTERM) as soon as its first output arrives:
/// its result, that first output, and when (from the start) the cancel was sent.
async fn cancel_at_first_output(
    env: &Env,
    id: &SandboxId,
    command: &str,
) -> (taskbox::provider::ExecOutput, String, std::time::Duration) {
    use taskbox::provider::{CancelSignal, Canceller, ExecIo, ExecRequest};
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let (canceller, cancel) = Canceller::new();
    let io = ExecIo {
        output: Some(tx),
        cancel: Some(cancel),
        ..Default::default()
    };
    let req = ExecRequest {
        command: command.to_string(),
        timeout_ms: 60_000,
    };
    let started = std::time::Instant::now();
    let signal_it = async {
        let chunk = rx.recv().await.expect("the command prints first");
        canceller.cancel(CancelSignal::Terminate);
        (
            String::from_utf8_lossy(&chunk.data).into_owned(),
            started.elapsed(),
        )
    };
    let (out, (first, cancelled_after)) =
        tokio::join!(env.provider.exec_live(id, &req, io), signal_it);
    (out.expect("exec"), first, cancelled_after)
}

/// A cancel ends the whole command, not only its shell: a process of its group that outlives
/// the signalled shell (here one that ignores the signal; a signal sent while bash forks a
/// process is lost the same way) is killed once the grace runs out, before the result returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_kills_what_outlives_the_signalled_shell() {
    let env = Env::new();
    let id = env.create("cancel", 1, None).await;
    let started = std::time::Instant::now();
    let (out, first, _) = cancel_at_first_output(
        &env,
        &id,
        "bash -c 'trap \"\" TERM; echo $$; exec sleep 30'; echo never",
    )
    .await;
    let pid: u32 = first.trim().parse().expect("a pid");
    // The shell died of the signal; the sleep ignored it and was killed after the grace.
    assert_eq!(out.exit_code, 143, "{out:?}");
    assert!(!out.stdout.contains("never"), "{out:?}");
    assert!(
        pid_gone(pid),
        "the process that ignored the signal still runs"
    );
    // Loose: about ten times the 3 s grace.
    assert!(started.elapsed() < std::time::Duration::from_secs(40));
    assert_eq!(env.run(&id, "echo next").await.stdout, "next\n");
}

/// A shell that lets the cancel's first signal go by (as bash does with one landing while it
/// forks; here a trap that only resets itself) gets it a second time, alone, and ends of it at
/// once — not at the grace's SIGKILL 3 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_signals_a_shell_that_let_the_first_signal_go_by_again() {
    a_shell_that_let_the_first_signal_go_by_gets_it_again(Env::new()).await;
}

/// The same in an isolated sandbox, whose shell is not the process that leads its group (that
/// one waits for it outside the sandbox's PID namespace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_signals_an_isolated_shell_that_let_the_first_signal_go_by_again() {
    let Some(env) = Env::isolated("nudge-isolated") else {
        return;
    };
    a_shell_that_let_the_first_signal_go_by_gets_it_again(env).await;
}

async fn a_shell_that_let_the_first_signal_go_by_gets_it_again(env: Env) {
    let id = env.create("nudge", 1, None).await;
    let started = std::time::Instant::now();
    let (out, _, cancelled_after) = cancel_at_first_output(
        &env,
        &id,
        "trap 'trap - TERM; echo first' TERM; echo ready; while :; do sleep 0.05; done",
    )
    .await;
    // Died of the second SIGTERM (143), after its trap ran for the first — not of the
    // grace's SIGKILL 3 s later (137): the exit code says which, whatever the machine's load.
    assert_eq!(
        out.exit_code, 143,
        "the grace's kill, not the second signal: {out:?}"
    );
    assert!(out.stdout.contains("first"), "{out:?}");
    let ended_after_cancel = started.elapsed() - cancelled_after;
    assert!(
        ended_after_cancel < std::time::Duration::from_secs(30),
        "ended {ended_after_cancel:?} after the cancel"
    );
}
