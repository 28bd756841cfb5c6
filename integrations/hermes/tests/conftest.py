"""Fixtures: a throwaway taskbox home per test, the taskbox binary under test, and the servers
the plugin starts stopped at the end of each test.

``TASKBOX_BIN`` names the binary (the Rust integration test passes its debug build).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def taskbox_bin() -> str:
    path = os.environ.get("TASKBOX_BIN") or shutil.which("taskbox")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("set TASKBOX_BIN to the taskbox binary under test (cargo build; target/debug/taskbox)")
    return os.path.abspath(path)


class Home:
    """A TASKBOX_HOME of its own; ``taskbox(...)`` runs the CLI against it."""

    def __init__(self, root: Path, taskbox_bin: str):
        self.root = root
        self.bin = taskbox_bin
        self.data_dirs = {root / "data"}

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def env(self, **extra: str) -> dict:
        env = dict(os.environ)
        env["TASKBOX_HOME"] = str(self.root)
        env.pop("TASKBOX_DATA_DIR", None)
        env.update(extra)
        return env

    def taskbox(self, *args: str, data_dir: Path | None = None, check: bool = True) -> subprocess.CompletedProcess:
        extra = {"TASKBOX_DATA_DIR": str(data_dir)} if data_dir else {}
        out = subprocess.run(
            [self.bin, *args], capture_output=True, text=True, timeout=120,
            env=self.env(**extra), stdin=subprocess.DEVNULL,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"taskbox {' '.join(args)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
        return out

    def task(self, task: str, data_dir: Path | None = None) -> dict:
        """`taskbox show --json TASK` (through the server, when one runs)."""
        return json.loads(self.taskbox("show", "--json", task, data_dir=data_dir).stdout)

    def stop_servers(self) -> None:
        for data_dir in self.data_dirs:
            if (data_dir / "taskbox.sock").exists():
                self.taskbox("serve", "--stop", data_dir=data_dir, check=False)


@pytest.fixture
def home(tmp_path: Path, taskbox_bin: str, monkeypatch: pytest.MonkeyPatch):
    root = tmp_path / "taskbox"
    root.mkdir()
    h = Home(root, taskbox_bin)
    # A server left behind by a test killed midway exits by itself once idle: its sandboxes
    # are snapshotted after a minute idle, then it exits a minute later.
    h.taskbox("config", "set", "terminal.server_idle_exit_seconds", "60")
    h.taskbox("config", "set", "terminal.lifetime_seconds", "60")
    monkeypatch.setenv("TASKBOX_HOME", str(root))
    monkeypatch.setenv("TASKBOX_BIN", taskbox_bin)
    monkeypatch.delenv("TASKBOX_DATA_DIR", raising=False)
    monkeypatch.delenv("TASKBOX_SERVER", raising=False)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "hermes"))
    try:
        yield h
    finally:
        h.stop_servers()


@pytest.fixture
def provider(home):
    from hermes_taskbox import TaskboxProvider

    return TaskboxProvider(config={})
