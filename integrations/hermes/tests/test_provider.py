"""The provider: registration, task id mapping, settings, probe and doctor.

Registration is tested two ways here (and through Hermes 0.22's real registry in
``test_real_hermes.py``). hermes-agent 0.19.0 finds the plugin through its real entry-point scan
and loads it, but has no terminal backend registry (``agent.terminal_env_provider`` / ``register_terminal_environment_provider`` came later); the
provider's side of that registry is tested against the interface as Hermes documents it
(``RecordingContext`` stands for ``PluginContext``; the schema rules are the documented ones).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import re

import pytest

import hermes_taskbox
from hermes_taskbox import TaskboxProvider, taskbox_task_id
from hermes_taskbox.ids import is_valid_task_id
from hermes_taskbox.settings import SettingsError, resolve

# Hermes's built-in backend names, which a plugin may not register (documented).
BUILTIN_BACKENDS = {"local", "docker", "singularity", "modal", "managed_modal", "daytona",
                    "vercel_sandbox", "ssh"}
#: Whether this Hermes has terminal backend plugins (0.22; 0.19.0 has not).
HAS_BACKEND_PLUGINS = importlib.util.find_spec("agent.terminal_env_registry") is not None
# The documented field types of a provider's config schema.
SCHEMA_TYPES = {"boolean", "list", "number", "secret", "select", "string", "text"}


class RecordingContext:
    """The documented registration surface of Hermes's PluginContext."""

    def __init__(self):
        self.providers = []

    def register_terminal_environment_provider(self, provider):
        self.providers.append(provider)


# -- task ids -----------------------------------------------------------------------------------

@pytest.mark.parametrize("task_id", ["default", "a", "A-b_c", "20260101_120000_ab12cd", "9" * 64])
def test_ids_taskbox_accepts_are_kept(task_id):
    assert taskbox_task_id(task_id) == task_id


@pytest.mark.parametrize("task_id", [
    "", "a/b", "../etc", "-lead", "_lead", "x" * 65, "ü", "a b", "a.b", "a\nb", "\x00", "a/" * 100,
    "session:42", "-" * 10,
])
def test_ids_taskbox_refuses_are_mapped_to_valid_distinct_ids(task_id):
    mapped = taskbox_task_id(task_id)
    assert is_valid_task_id(mapped), mapped
    assert mapped == taskbox_task_id(task_id), "the mapping must be deterministic"
    assert mapped != task_id


def test_mapped_ids_keep_a_readable_prefix_and_do_not_collide():
    assert taskbox_task_id("a/b").startswith("a-b-")
    assert taskbox_task_id("a/b") != taskbox_task_id("a:b") != taskbox_task_id("a b")
    assert taskbox_task_id("x" * 65) != taskbox_task_id("x" * 66)
    assert taskbox_task_id("").startswith("hermes-")
    assert taskbox_task_id(42) == "42"


def test_validity_matches_taskbox_itself(home):
    # The Python rule and taskbox's own TaskId agree: taskbox accepts each mapped id and refuses
    # each original.
    for raw in ["a/b", "-x", "x" * 65, "ü"]:
        refused = home.taskbox("show", "--", raw, check=False)
        assert "invalid task id" in refused.stderr, refused.stderr
        accepted = home.taskbox("show", "--", taskbox_task_id(raw), check=False)
        assert "invalid task id" not in accepted.stderr


# -- registration -------------------------------------------------------------------------------

def test_register_registers_the_taskbox_provider_as_documented():
    ctx = RecordingContext()
    hermes_taskbox.register(ctx)
    assert len(ctx.providers) == 1
    provider = ctx.providers[0]
    assert provider.name == "taskbox" and re.fullmatch(r"[a-z0-9_]+", provider.name)
    assert provider.name not in BUILTIN_BACKENDS
    assert provider.display_name and provider.description
    # The documented classification flags.
    assert provider.is_remote is True and provider.is_container is True
    assert provider.skip_container_guards is False
    assert provider.cache_path_base is None
    assert {"VERCEL_TOKEN", "VERCEL_OIDC_TOKEN"} <= provider.strip_env_keys
    assert provider.session_isolated_when_nonpersistent is True
    # create_environment takes the documented keywords and ignores unknown ones.
    params = inspect.signature(provider.create_environment).parameters
    for name in ["cwd", "timeout", "task_id", "image", "container_config"]:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["task_id"].default == "default"
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    # The optional members exist and answer in the documented shapes.
    assert isinstance(provider.setup_instructions(), list)


def test_config_schema_follows_the_documented_rules():
    schema = TaskboxProvider().get_config_schema()
    assert set(schema) == {"data_dir", "server", "taskbox_bin", "task"}
    for key, entry in schema.items():
        assert re.fullmatch(r"[A-Za-z0-9_-]+", key)
        assert entry["type"] in SCHEMA_TYPES
        if entry["type"] == "select":
            assert all(isinstance(o, str) for o in entry["options"])
        json.dumps(entry, allow_nan=False)
    assert schema["server"]["options"] == ["auto", "always"]


def test_hermes_finds_and_loads_the_plugin_by_its_entry_point(caplog):
    from hermes_cli.plugins import PluginManager

    manager = PluginManager()
    manifests = [m for m in manager._scan_entry_points() if m.name == "taskbox"]
    assert len(manifests) == 1 and manifests[0].path == "hermes_taskbox"
    with caplog.at_level(logging.WARNING):
        manager._load_plugin(manifests[0])
    loaded = manager._plugins["taskbox"]
    assert loaded.error is None and loaded.enabled
    if HAS_BACKEND_PLUGINS:
        # A Hermes with terminal backend plugins (0.22): the provider is in its registry.
        from agent import terminal_env_registry

        assert isinstance(terminal_env_registry.get_provider("taskbox"), TaskboxProvider)
        assert "no terminal backend plugins" not in caplog.text
    else:
        # 0.19.0's PluginContext has no terminal backends: the plugin says so instead of failing.
        assert "no terminal backend plugins" in caplog.text


# -- settings -----------------------------------------------------------------------------------

def test_bad_settings_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(SettingsError, match=r"terminal\.backends\.taskbox\.server must be one of auto, always"):
        resolve({"server": "sometimes"})
    with pytest.raises(SettingsError, match="always talks to a server"):
        resolve({"server": "never"})
    with pytest.raises(SettingsError, match=r"data_dir must be an absolute path"):
        resolve({"data_dir": "relative/dir"})
    with pytest.raises(SettingsError, match=r"unknown setting terminal\.backends\.taskbox\.data-dir"):
        resolve({"data-dir": "/x"})
    with pytest.raises(SettingsError, match=r"taskbox_bin must be text"):
        resolve({"taskbox_bin": 3})
    with pytest.raises(SettingsError):
        TaskboxProvider(config={"server": "sometimes"}).create_environment(cwd="", timeout=1, task_id="x")
    assert TaskboxProvider(config={"server": "sometimes"}).check_requirements({}) is False
    with pytest.raises(SettingsError, match=r"terminal\.backends\.taskbox\.task must be a taskbox task id"):
        resolve({"task": "my project"})
    assert resolve({"task": "my-project"}).task == "my-project"
    assert resolve({}).task is None


def test_where_the_binary_comes_from(tmp_path, taskbox_bin, monkeypatch):
    monkeypatch.delenv("TASKBOX_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert resolve({}).taskbox_bin is None
    (tmp_path / "taskbox").symlink_to(taskbox_bin)
    assert resolve({}).taskbox_bin == str(tmp_path / "taskbox")
    monkeypatch.setenv("TASKBOX_BIN", taskbox_bin)
    assert resolve({}).taskbox_bin == taskbox_bin
    assert resolve({"taskbox_bin": "/nonexistent/taskbox"}).taskbox_bin is None


def test_data_dir_follows_taskbox_rules(tmp_path, monkeypatch):
    monkeypatch.delenv("TASKBOX_DATA_DIR", raising=False)
    monkeypatch.setenv("TASKBOX_HOME", str(tmp_path / "h"))
    assert resolve({}).data_dir == tmp_path / "h" / "data"
    monkeypatch.setenv("TASKBOX_DATA_DIR", str(tmp_path / "d"))
    assert resolve({}).data_dir == tmp_path / "d"
    s = resolve({"data_dir": str(tmp_path / "c")})
    assert s.data_dir == tmp_path / "c" and s.taskbox_env({})["TASKBOX_DATA_DIR"] == str(tmp_path / "c")


# -- probe and doctor ---------------------------------------------------------------------------

def test_probe_answers_without_creating_anything(home, provider):
    status, detail = provider.probe()
    assert status == "ready" and "starts with the first command" in detail
    assert not (home.data_dir / "taskbox.sock").exists(), "probe must not start a server"
    assert not (home.data_dir / "taskbox.db").exists(), "probe must not create a store"
    env = provider.create_environment(cwd="", timeout=60, task_id="probed")
    env.cleanup()
    def listing():
        # Without `cost`: its snapshot storage accrues with the time a snapshot is kept.
        tasks = json.loads(home.taskbox("tasks", "--json").stdout)
        for t in tasks:
            t.pop("cost", None)
        return tasks

    tasks_before = listing()
    status, detail = provider.probe()
    assert status == "ready" and "taskbox server" in detail and "0 live sandboxes" in detail
    assert listing() == tasks_before
    assert home.task("probed")["task"]["sandbox"] is None, "probe must not make a sandbox"


def test_probe_without_a_binary_needs_setup(home, monkeypatch, tmp_path):
    monkeypatch.delenv("TASKBOX_BIN")
    monkeypatch.setenv("PATH", str(tmp_path))
    status, detail = TaskboxProvider(config={}).probe()
    assert status == "needs_setup" and "taskbox_bin" in detail
    assert TaskboxProvider(config={}).is_available() is False


def test_doctor_reports_server_backend_and_taskbox_doctor(home, provider):
    rows = provider.doctor_checks()
    labels = [label for _, label, _ in rows]
    assert all(isinstance(ok, bool) and isinstance(d, str) for ok, _, d in rows)
    assert labels[:3] == ["taskbox binary", "taskbox server", "taskbox backend"]
    by_label = {label: (ok, detail) for ok, label, detail in rows}
    assert by_label["taskbox server"][0] and "not running" in by_label["taskbox server"][1]
    assert by_label["taskbox backend"] == (True, "local")
    # taskbox's own doctor lines, one row each (the names `taskbox doctor --json` prints).
    own = json.loads(home.taskbox("doctor", "--json", check=False).stdout)
    for check in own["checks"]:
        assert f"taskbox doctor: {check['name']}" in by_label
    assert "taskbox persistence" in by_label
    # With a server running, the row says who serves.
    provider.create_environment(cwd="", timeout=60, task_id="doc")
    rows = {label: (ok, detail) for ok, label, detail in provider.doctor_checks()}
    assert rows["taskbox server"][0] and "pid" in rows["taskbox server"][1]
    assert "doc" in rows["taskbox server"][1]
