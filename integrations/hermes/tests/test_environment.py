"""The taskbox environment driven through Hermes's real ``BaseEnvironment.execute()``
(hermes-agent 0.19.0: its session snapshot, cwd markers, poll loop, timeout and interrupt), with a
real ``taskbox serve`` the plugin starts itself."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tools.environments.base import BaseEnvironment
from tools.interrupt import set_interrupt

from hermes_taskbox import taskbox_task_id
from hermes_taskbox.environment import TaskboxEnvironment


#: Where a task's workspace is inside its sandbox: taskbox's local backend isolates each sandbox
#: (its default, ``terminal.local_isolation = namespaces``), with the workspace at this path.
SANDBOX_ROOT = "/workspace"


def host_workspace(home, task: str) -> Path:
    """The task's workspace as the host sees it: in the data dir, never inside a sandbox."""
    return home.data_dir / "local" / "tasks" / task / "workspace"


def sandbox_id(home, task: str) -> str:
    return home.task(task)["task"]["sandbox"]["id"]


def ran(result: dict) -> tuple:
    """What a command gave: its output and exit code. Hermes versions add keys of their own
    (``cwd``, ``cwd_observed`` since 0.22), which are not the backend's to check."""
    return result["output"], result["returncode"]


def run_over(env: TaskboxEnvironment) -> dict:
    """The result line of the environment's last run, once the server sent it (Hermes returns
    at its timeout or interrupt without waiting for the cancelled command to end)."""
    run = env.last_run
    assert run is not None and run.wait(120) is not None, "the run did not end within 120 s"
    assert run.result is not None, f"the run ended without a result: {run.notes}"
    return run.result


def test_is_a_real_hermes_environment_and_starts_a_server(home, provider):
    assert not (home.data_dir / "taskbox.sock").exists()
    env = provider.create_environment(cwd="/root", timeout=60, task_id="run-basic")
    assert isinstance(env, BaseEnvironment) and isinstance(env, TaskboxEnvironment)
    # Hermes's init_session ran through taskbox: the snapshot is ready and the cwd is the
    # task's own workspace (its path inside the sandbox), not Hermes's made-up /root.
    assert env._snapshot_ready
    assert env.cwd == SANDBOX_ROOT
    assert (home.data_dir / "taskbox.sock").exists(), "the plugin did not start a server"

    assert ran(env.execute("echo hello; echo oops >&2; exit 3")) == ("hello\noops\n", 3)
    # The markers are stripped; the output is passed through unchanged.
    assert ran(env.execute("printf 'exact'")) == ("exact", 0)


def test_stdout_and_stderr_keep_the_commands_order(home, provider):
    env = provider.create_environment(cwd="", timeout=60, task_id="order")
    script = "for i in 1 2 3 4 5 6 7 8; do echo out$i; echo err$i >&2; done"
    expected = "".join(f"out{i}\nerr{i}\n" for i in range(1, 9))
    for _ in range(5):
        assert ran(env.execute(script)) == (expected, 0)


def test_commands_reuse_one_sandbox_and_carry_cwd_and_env(home, provider):
    env = provider.create_environment(cwd="", timeout=60, task_id="reuse")
    first = sandbox_id(home, "reuse")
    assert env.execute("mkdir -p a/b && cd a/b && export GREETING=hi")["returncode"] == 0
    assert env.cwd.endswith("/workspace/a/b")
    result = env.execute("pwd; echo $GREETING")
    assert result["output"] == f"{env.cwd}\nhi\n"
    assert env.execute("touch here.txt")["returncode"] == 0
    assert (host_workspace(home, "reuse") / "a" / "b" / "here.txt").is_file()
    assert sandbox_id(home, "reuse") == first, "a warm command must not make a new sandbox"
    # An explicit cwd for one command, as Hermes's terminal tool's workdir does.
    root = env.cwd.rsplit("/a/b", 1)[0]
    assert env.execute("pwd", cwd=root)["output"] == f"{root}\n"


def test_stdin_reaches_the_command(home, provider):
    env = provider.create_environment(cwd="", timeout=60, task_id="stdin")
    data = "line one\nline 'two' $HOME\n" + "x" * 100_000 + "\n"
    result = env.execute("cat > in.txt && wc -c < in.txt", stdin_data=data)
    assert result["returncode"] == 0
    assert result["output"].strip() == str(len(data.encode()))
    assert env.execute("head -n 2 in.txt")["output"] == "line one\nline 'two' $HOME\n"


def test_timeout_cancels_the_command_not_the_sandbox(home, provider):
    # The environment's own timeout (2 s). The server's timeout for the run is 5 s later (7 s),
    # after the command would have ended by itself (5 s): only the plugin's cancel at Hermes's
    # timeout stops it before it touches `finished`.
    env = provider.create_environment(cwd="", timeout=2, task_id="timeout")
    before = sandbox_id(home, "timeout")
    started = time.monotonic()
    result = env.execute("echo started; sleep 5; touch finished")
    elapsed = time.monotonic() - started
    assert result["returncode"] == 124
    # What the command printed before the timeout reaches Hermes, then Hermes's note.
    assert result["output"].startswith("started\n")
    assert "[Command timed out after 2s]" in result["output"]
    # Measured 2.2-2.3 s (load 14 on 2 cores); ten times that, for a busier machine.
    assert elapsed < 22, f"the timeout took {elapsed:.1f} s"
    over = run_over(env)
    assert not over["timed_out"], "the server's timeout stopped the command, not the plugin's cancel"
    assert over["exit_code"] != 0, f"the command was not cancelled: {over}"
    after = env.execute("ls; echo alive", timeout=60)
    assert after["returncode"] == 0 and after["output"].endswith("alive\n")
    assert "finished" not in after["output"], "the timed-out command kept running"
    assert sandbox_id(home, "timeout") == before, "a timeout must not replace the sandbox"


def test_interrupt_cancels_just_that_command(home, provider):
    env = provider.create_environment(cwd="", timeout=60, task_id="cancel")
    # A background process of an earlier command, and a file: both must survive the cancel.
    assert env.execute("echo kept > kept.txt; (sleep 120 & echo $! > bg.pid)")["returncode"] == 0
    bg_pid = int(env.execute("cat bg.pid")["output"].strip())
    before = sandbox_id(home, "cancel")

    tid = threading.get_ident()
    timer = threading.Timer(1.5, lambda: set_interrupt(True, tid))
    timer.start()
    try:
        started = time.monotonic()
        result = env.execute("echo working; sleep 60; touch finished")
        elapsed = time.monotonic() - started
    finally:
        timer.cancel()
        set_interrupt(False, tid)
    assert result["returncode"] == 130, result
    assert result["output"].startswith("working\n") and "[Command interrupted]" in result["output"]
    # Measured 1.8 s (1.5 s of it the timer; load 14 on 2 cores); ten times that.
    assert elapsed < 18, f"the interrupt took {elapsed:.1f} s"
    over = run_over(env)
    assert over["exit_code"] != 0 and not over["timed_out"], over
    check = env.execute(f"cat kept.txt; ls; kill -0 {bg_pid} && echo bg-alive")
    assert check["output"].startswith("kept\n")
    assert "finished" not in check["output"]
    assert "bg-alive" in check["output"], "the cancel stopped more than its command"
    assert sandbox_id(home, "cancel") == before
    env.execute(f"kill {bg_pid}")


def test_cleanup_suspends_and_a_new_environment_finds_the_files(home, provider):
    env = provider.create_environment(cwd="", timeout=60, task_id="persist")
    assert env.execute("mkdir -p notes && echo 'written before cleanup' > notes/a.txt")["returncode"] == 0
    env.cleanup()
    env.cleanup()  # idempotent
    view = home.task("persist")
    assert view["task"]["sandbox"] is None, "cleanup must stop the sandbox"
    assert view["snapshots"], "cleanup must snapshot the task's files"
    # The task is suspended, not removed: a new environment for it restores the files.
    env2 = provider.create_environment(cwd="", timeout=60, task_id="persist")
    output, code = ran(env2.execute("cat notes/a.txt"))
    assert code == 0 and output.startswith("written before cleanup\n"), output
    # The new environment's first command tells the agent where its files came from.
    assert "[taskbox: the sandbox was recreated from snapshot" in output and "the files are back" in output
    assert home.task("persist")["task"]["sandbox"]["generation"] == 2


def test_two_tasks_are_isolated(home, provider):
    a = provider.create_environment(cwd="", timeout=60, task_id="task-a")
    b = provider.create_environment(cwd="", timeout=60, task_id="task-b")
    # The same path inside each sandbox, two workspaces on the host.
    assert a.cwd == b.cwd == SANDBOX_ROOT
    assert a.execute("echo secret-a > only-a.txt")["returncode"] == 0
    assert b.execute("test -e only-a.txt; echo $?; ls")["output"] == "1\n"
    assert a.execute("ls")["output"] == "only-a.txt\n"
    assert (host_workspace(home, "task-a") / "only-a.txt").is_file()
    assert not (host_workspace(home, "task-b") / "only-a.txt").exists()


def test_hermes_task_ids_taskbox_refuses_are_mapped(home, provider):
    weird = "../../etc/passwd session/1 ü"
    env = provider.create_environment(cwd="", timeout=60, task_id=weird)
    mapped = taskbox_task_id(weird)
    assert env.task == mapped and env.hermes_task_id == weird
    assert env.execute("echo mapped > f.txt")["returncode"] == 0
    # Inside the data dir's task workspace, nowhere else.
    assert (host_workspace(home, mapped) / "f.txt").is_file()
    # The same Hermes id reaches the same task again.
    again = provider.create_environment(cwd="", timeout=60, task_id=weird)
    assert again.execute("cat f.txt")["output"] == "mapped\n"


def test_a_taskbox_error_is_a_failed_command_with_its_message(home, provider, capsys):
    env = provider.create_environment(cwd="", timeout=60, task_id="doomed")
    assert env.execute("true")["returncode"] == 0
    env.cleanup()
    home.taskbox("rm", "doomed")
    result = env.execute("echo never")
    assert result["returncode"] == 125
    assert "taskbox: " in result["output"] and "removed" in result["output"], result
    assert "Traceback" not in result["output"]
    assert "Traceback" not in capsys.readouterr().err


def test_server_always_without_a_server_fails_each_command_clearly(home):
    from hermes_taskbox import TaskboxProvider

    provider = TaskboxProvider(config={"server": "always"})
    env = provider.create_environment(cwd="", timeout=60, task_id="no-server")
    result = env.execute("echo never")
    assert result["returncode"] == 125
    assert "no taskbox server answers" in result["output"] and "always" in result["output"]
    assert not (home.data_dir / "taskbox.sock").exists(), "server = always must not start one"


def test_a_missing_binary_is_named_with_the_fix(home, monkeypatch, tmp_path):
    from hermes_taskbox import TaskboxProvider

    monkeypatch.delenv("TASKBOX_BIN")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    env = TaskboxProvider(config={}).create_environment(cwd="", timeout=60, task_id="nobin")
    result = env.execute("echo never")
    assert result["returncode"] == 125
    assert "taskbox binary was not found" in result["output"]
    assert "terminal.backends.taskbox.taskbox_bin" in result["output"] and "TASKBOX_BIN" in result["output"]


def test_data_dir_setting_reaches_taskbox(home, tmp_path):
    from hermes_taskbox import TaskboxProvider

    data_dir = tmp_path / "elsewhere"
    home.data_dirs.add(data_dir)
    env = TaskboxProvider(config={"data_dir": str(data_dir)}).create_environment(
        cwd="", timeout=60, task_id="placed"
    )
    assert env.execute("echo here > f.txt")["returncode"] == 0
    assert (data_dir / "taskbox.sock").exists()
    assert (data_dir / "local" / "tasks" / "placed" / "workspace" / "f.txt").is_file()
    assert not (home.data_dir / "taskbox.db").exists()
    assert home.task("placed", data_dir=data_dir)["task"]["id"] == "placed"


def test_a_recreated_sandbox_is_told_to_the_agent(home, provider):
    env = provider.create_environment(cwd="", timeout=60, task_id="told")
    assert env.execute("echo x > f.txt")["returncode"] == 0
    home.taskbox("suspend", "told")
    result = env.execute("cat f.txt")
    assert result["returncode"] == 0
    assert result["output"].startswith("x\n")
    assert "[taskbox: the sandbox was recreated from snapshot" in result["output"]
    assert "processes started earlier are gone" in result["output"]
    # Hermes still found its cwd marker behind the note.
    assert env.cwd.endswith("/workspace")


def test_a_server_that_cannot_start_fails_the_command_at_once_with_its_reason(home, provider):
    # taskbox's own config is broken: the server it would start refuses it.
    (home.root / "config.toml").write_text("[terminal]\ntimeout = -3\n")
    started = time.monotonic()
    env = provider.create_environment(cwd="", timeout=60, task_id="broken")
    result = env.execute("echo never")
    elapsed = time.monotonic() - started
    assert result["returncode"] == 125
    assert "cannot start a taskbox server" in result["output"]
    assert "config file" in result["output"] and "is not valid" in result["output"], result["output"]
    assert "serve.log" in result["output"]
    assert elapsed < 30, f"a server that cannot start took {elapsed:.0f} s to report"


def test_racing_starters_start_one_server(home, provider):
    # Hermes threads and a CLI, all finding no server at once: one server starts (the CLI's
    # autostart.lock serializes them) and every command runs.
    import subprocess

    results = {}

    def hermes(i):
        env = provider.create_environment(cwd="", timeout=60, task_id=f"race-{i}")
        results[i] = env.execute(f"echo {i}")

    threads = [threading.Thread(target=hermes, args=(i,)) for i in range(5)]
    cli = subprocess.Popen(
        [home.bin, "run", "-t", "race-cli", "--", "echo", "cli"], env=home.env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0 and out == "cli\n", err
    assert {i: r["output"] for i, r in results.items()} == {i: f"{i}\n" for i in range(5)}
    log = (home.data_dir / "serve.log").read_text()
    assert log.count("serving socket=") == 1, log
    # ... and no starter spawned a server that lost the data dir to another.
    assert "error" not in log.lower(), log


# -- where commands run ---------------------------------------------------------------------------

def test_hermes_default_cwds_mean_the_sandbox_root(home, provider, tmp_path, monkeypatch):
    """Hermes gives plugin backends `/root` (ssh: `~`) at creation and with every command; a
    file written there must land in the task's workspace, never in the host's /root or HOME."""
    fake_home = tmp_path / "user-home"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))
    env = provider.create_environment(cwd="/root", timeout=60, task_id="cwd-default")
    root = SANDBOX_ROOT
    assert env.sandbox_root == root and env.cwd == root
    marker = f"cwd-{os.getpid()}-{id(env)}.txt"
    for cwd in ("/root", "~", "~/", str(fake_home), "/root/"):
        assert ran(env.execute(f"pwd; echo hi > {marker}", cwd=cwd)) == (f"{root}\n", 0), cwd
    assert (host_workspace(home, "cwd-default") / marker).read_text() == "hi\n"
    assert not (Path("/root") / marker).exists(), "a command ran in the host's /root"
    assert not (fake_home / marker).exists(), "a command ran in the host's HOME"
    assert not (Path.cwd() / marker).exists(), "a command ran in Hermes's own directory"
    # Under Hermes's home spellings, a path is under the sandbox's root.
    assert ran(env.execute("mkdir -p sub/deeper"))[1] == 0
    assert ran(env.execute("pwd", cwd="~/sub")) == (f"{root}/sub\n", 0)
    assert ran(env.execute("pwd", cwd="/root/sub/deeper")) == (f"{root}/sub/deeper\n", 0)
    # A relative cwd is relative to the root; a path inside the sandbox is kept.
    assert ran(env.execute("pwd", cwd="sub")) == (f"{root}/sub\n", 0)
    assert ran(env.execute("pwd", cwd=f"{root}/sub/deeper")) == (f"{root}/sub/deeper\n", 0)
    for unset in ("~", ""):
        other = provider.create_environment(cwd=unset, timeout=60, task_id="cwd-default")
        assert other.cwd == root, unset


def test_a_cwd_reported_by_hermes_marker_is_kept(home, provider):
    env = provider.create_environment(cwd="/root", timeout=60, task_id="cwd-marker")
    root = env.sandbox_root
    assert ran(env.execute("mkdir -p a/b && cd a/b"))[1] == 0
    assert env.cwd == f"{root}/a/b"
    # The terminal tool passes the cwd its marker reported back as the next command's cwd.
    assert ran(env.execute("pwd", cwd=env.cwd)) == (f"{root}/a/b\n", 0)
    # Even outside the workspace: the marker saw the shell there, in the sandbox.
    assert ran(env.execute("cd /"))[1] == 0 and env.cwd == "/"
    assert ran(env.execute("pwd", cwd="/")) == ("/\n", 0)


def test_a_host_directory_outside_the_sandbox_is_refused(home, provider, tmp_path):
    env = provider.create_environment(cwd="", timeout=60, task_id="cwd-host")
    host_dir = tmp_path / "host-project"
    host_dir.mkdir()
    output, code = ran(env.execute("touch ran-here", cwd=str(host_dir)))
    assert code == 126
    assert f"the working directory {host_dir} is outside task cwd-host's sandbox" in output
    assert env.sandbox_root in output and "did not run" in output
    assert not (host_dir / "ran-here").exists()
    assert not (host_workspace(home, "cwd-host") / "ran-here").exists()
    # A host directory as the environment's cwd (terminal.cwd) starts it at the root instead.
    placed = provider.create_environment(cwd=str(host_dir), timeout=60, task_id="cwd-host")
    assert placed.cwd == env.sandbox_root
    assert ran(placed.execute("pwd", cwd=str(host_dir))) == (f"{env.sandbox_root}\n", 0)


# -- which task Hermes's shared "default" environment is -------------------------------------------

def test_the_shared_default_environment_is_one_task_per_session(home, provider, monkeypatch):
    monkeypatch.setenv("HERMES_SESSION_ID", "20261206_001122_a1b2c3")
    env = provider.create_environment(cwd="/root", timeout=60, task_id="default")
    assert env.task == "session-20261206_001122_a1b2c3" and env.hermes_task_id == "default"
    assert ran(env.execute("echo one > f.txt"))[1] == 0
    monkeypatch.setenv("HERMES_SESSION_ID", "20261206_001122_d4e5f6")
    other = provider.create_environment(cwd="/root", timeout=60, task_id="default")
    assert other.task == "session-20261206_001122_d4e5f6"
    assert ran(other.execute("ls")) == ("", 0)
    assert ran(env.execute("cat f.txt")) == ("one\n", 0)


def test_without_a_session_the_shared_environment_is_one_task_per_project(home, provider, monkeypatch, tmp_path):
    monkeypatch.delenv("HERMES_SESSION_ID", raising=False)
    (tmp_path / "alpha").mkdir()
    (tmp_path / "beta").mkdir()
    monkeypatch.chdir(tmp_path / "alpha")
    a = provider.create_environment(cwd="/root", timeout=60, task_id="default")
    assert ran(a.execute("echo from-alpha > f.txt"))[1] == 0
    monkeypatch.chdir(tmp_path / "beta")
    b = provider.create_environment(cwd="/root", timeout=60, task_id="default")
    assert a.task.startswith("project-alpha-") and b.task.startswith("project-beta-")
    assert ran(b.execute("cat f.txt 2>/dev/null; echo $?")) == ("1\n", 0)
    # The same project reaches the same task again, in any process.
    monkeypatch.chdir(tmp_path / "alpha")
    again = provider.create_environment(cwd="/root", timeout=60, task_id="default")
    assert again.task == a.task and ran(again.execute("cat f.txt")) == ("from-alpha\n", 0)
    # Nothing in the project directories themselves.
    assert not (tmp_path / "alpha" / "f.txt").exists() and not (tmp_path / "beta" / "f.txt").exists()


def test_a_configured_task_names_the_shared_environment(home, monkeypatch):
    from hermes_taskbox import TaskboxProvider

    monkeypatch.setenv("HERMES_SESSION_ID", "some-session")
    env = TaskboxProvider(config={"task": "shared-work"}).create_environment(
        cwd="", timeout=60, task_id="default"
    )
    assert env.task == "shared-work"
    # A task Hermes names itself keeps its own id.
    named = TaskboxProvider(config={"task": "shared-work"}).create_environment(
        cwd="", timeout=60, task_id="rl-rollout-7"
    )
    assert named.task == "rl-rollout-7"


def test_hermes_forwarded_variables_reach_the_command_and_nothing_else_does(home, provider, monkeypatch):
    """Hermes's env passthrough (a skill's required_environment_variables, or
    terminal.env_passthrough) reaches the command as the run's ``env``; the rest of Hermes's
    environment — which the server was started with — does not, and no value is journaled."""
    from tools.env_passthrough import clear_env_passthrough, register_env_passthrough

    secret = "tb-forwarded-Zq9x-value"
    monkeypatch.setenv("TB_FORWARDED", secret)
    monkeypatch.setenv("TB_NOT_FORWARDED", "tb-kept-Zq9x-value")
    monkeypatch.setenv("TASKBOX_OWN_SETTING", "not-for-commands")
    register_env_passthrough(["TB_FORWARDED", "TASKBOX_OWN_SETTING"])
    try:
        env = provider.create_environment(cwd="", timeout=60, task_id="forwarded")
        out, code = ran(env.execute(
            'echo "f=${TB_FORWARDED:-unset} n=${TB_NOT_FORWARDED:-unset} o=${TASKBOX_OWN_SETTING:-unset}"'
        ))
        assert code == 0, out
        assert f"f={secret} n=unset o=unset" in out, out
    finally:
        clear_env_passthrough()
    shown = home.taskbox("show", "--json", "forwarded").stdout
    assert "Zq9x" not in shown, "a forwarded value was journaled"


def test_checkpoint_keeps_processes_and_rewind_brings_files_back_undoably(home, provider):
    from hermes_taskbox.client import TaskboxError

    env = provider.create_environment(cwd="", timeout=60, task_id="undo")
    assert env.execute("echo v1 > f.txt; (sleep 300) > /dev/null 2>&1 & echo $! > pid")["returncode"] == 0
    first = env.checkpoint()
    assert first["outcome"] == "taken", first
    again = env.checkpoint()
    assert again["outcome"] == "unchanged" and again["snapshot_id"] == first["snapshot_id"], again
    # The sandbox lives on: the background process is still there.
    assert env.execute("kill -0 $(cat pid) && echo alive")["output"].startswith("alive")
    assert env.execute("rm f.txt")["returncode"] == 0
    rewound = env.rewind(to=f"undo.s{first['seq']}")
    assert rewound["to"] == first["snapshot_id"], rewound
    assert rewound["saved"], rewound
    assert env.execute("cat f.txt")["output"].startswith("v1\n")
    # Undo: back to the files kept before the rewind.
    undone = env.rewind(to=rewound["saved"])
    assert undone["to"] == rewound["saved"]
    assert "No such file" in env.execute("cat f.txt")["output"]
    try:
        env.rewind(back=40)
        raise AssertionError("a rewind beyond what exists must be refused")
    except TaskboxError as e:
        assert e.code == "rewind_too_far", (e.code, e.message)
    try:
        env.rewind(to="other.s1")
        raise AssertionError("another task's snapshot must be refused")
    except TaskboxError as e:
        assert e.code == "bad_request" and "other" in e.message, (e.code, e.message)
