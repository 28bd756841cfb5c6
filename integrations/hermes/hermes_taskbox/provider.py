"""The Hermes terminal environment provider ``taskbox``.

Implements ``agent.terminal_env_provider.TerminalEnvironmentProvider`` as documented (Hermes's
terminal backend plugins). The published hermes-agent 0.19.0 predates that module: there the
provider is a plain class with the same members, so it can still be constructed and used.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import settings as _settings
from .client import Client, TaskboxError
from .ids import HERMES_SHARED_TASK_ID, shared_task_id, taskbox_task_id

logger = logging.getLogger(__name__)

try:  # Hermes with terminal backend plugins (after 0.19.0)
    from agent.terminal_env_provider import TerminalEnvironmentProvider as _ProviderBase  # type: ignore
except Exception:  # hermes-agent 0.19.0: no provider interface to subclass
    _ProviderBase = object  # type: ignore[assignment,misc]

#: Persistence note, as taskbox doctor prints it.
PERSISTENCE_NOTE = "snapshots keep the filesystem only; live processes do not survive sandbox recreation"


class TaskboxProvider(_ProviderBase):  # type: ignore[misc,valid-type]
    """Runs each Hermes task's commands in its own taskbox sandbox."""

    name = "taskbox"
    display_name = "taskbox"
    # Commands do not run in Hermes's own working directory or process: host cwd hints are
    # suppressed and host-looking cwds are not passed on.
    is_remote = True
    is_container = True
    # Each task is resumed by name (its snapshots): two sessions must not share one by accident.
    session_isolated_when_nonpersistent = True

    def __init__(self, config: Optional[Mapping[str, Any]] = None):
        #: ``terminal.backends.taskbox`` when given by the caller; else read from Hermes's config.
        self._config = dict(config) if config is not None else None

    # -- classification --------------------------------------------------------------------------

    @property
    def description(self) -> str:
        return (
            "Run each task's commands in its own taskbox sandbox (local workspace or Vercel "
            "Sandbox); files are kept in snapshots and come back when the task resumes."
        )

    @property
    def skip_container_guards(self) -> bool:
        # On taskbox's local backend commands run on this host as this user: keep Hermes's
        # dangerous-command approvals on.
        return False

    @property
    def cache_path_base(self) -> Optional[str]:
        return None

    @property
    def strip_env_keys(self) -> frozenset:
        # taskbox's Vercel credentials: for the taskbox server, never for a model's command.
        return frozenset({"VERCEL_TOKEN", "VERCEL_OIDC_TOKEN"})

    @property
    def env_description(self) -> str:
        return "a taskbox sandbox of its own per task (Linux; its files persist across sandboxes)"

    # -- settings --------------------------------------------------------------------------------

    def get_config_schema(self) -> Dict[str, Dict[str, Any]]:
        """The fields under ``terminal.backends.taskbox``."""
        return json.loads(json.dumps(_settings.CONFIG_SCHEMA))

    def resolve_config(self, config: Mapping[str, Any]) -> Dict[str, Any]:
        """Checks ``terminal.backends.taskbox`` (raises ``SettingsError`` naming the key)."""
        _settings.resolve(config)
        return dict(config)

    def settings(self, backend_config: Optional[Mapping[str, Any]] = None) -> _settings.Settings:
        """The resolved settings: ``backend_config`` if given, else the provider's, else Hermes's
        config.yaml."""
        if backend_config is not None:
            config = backend_config
        elif self._config is not None:
            config = self._config
        else:
            config = _settings.hermes_backend_config()
        return _settings.resolve(config)

    # -- availability ----------------------------------------------------------------------------

    def is_available(self) -> bool:
        """Whether commands can be served: a server answers, or a binary can start one. No
        network; at most a stat of the socket."""
        try:
            s = self.settings()
        except _settings.SettingsError:
            return False
        if s.socket.exists():
            return True
        return s.server == "auto" and s.taskbox_bin is not None

    def check_requirements(self, config: Optional[Mapping[str, Any]] = None) -> bool:
        backend_config = None
        if isinstance(config, Mapping) and isinstance(config.get("backend_config"), Mapping):
            backend_config = config["backend_config"]
        try:
            s = self.settings(backend_config)
        except _settings.SettingsError as e:
            logger.error("taskbox backend: %s", e)
            return False
        if s.taskbox_bin is None and not Client(s).answers():
            logger.error("taskbox backend: %s", _settings.missing_binary_message(s))
            return False
        return True

    def probe(self) -> Tuple[str, str]:
        """``(status, detail)`` without creating anything: asks the server's health (which does
        not count as activity), else says whether one can be started."""
        try:
            s = self.settings()
        except _settings.SettingsError as e:
            return ("needs_setup", str(e))
        except Exception as e:
            return ("unavailable", f"taskbox settings: {e}")
        try:
            health = Client(s).health(timeout=1.5)
            live = len(health.get("live_tasks") or [])
            return (
                "ready",
                f"taskbox server {health.get('version')} (pid {health.get('pid')}) serving "
                f"{health.get('data_dir')}, {live} live sandbox{'es' if live != 1 else ''}",
            )
        except TaskboxError:
            pass
        except Exception as e:
            return ("unavailable", f"taskbox server on {s.socket}: {e}")
        if s.server == "always":
            return ("unavailable", f"no taskbox server answers on {s.socket} (server = always)")
        if s.taskbox_bin is None:
            return ("needs_setup", _settings.missing_binary_message(s))
        return ("ready", f"{s.taskbox_bin}; a server starts with the first command ({s.data_dir})")

    def probe_with_config(self, config: Mapping[str, Any]) -> Tuple[str, str]:
        return self.probe()

    def setup_instructions(self) -> List[str]:
        return [
            "taskbox runs each task's commands in its own sandbox and keeps its files in snapshots.",
            "The taskbox binary: `cargo install --path .` in a taskbox checkout, or set "
            "terminal.backends.taskbox.taskbox_bin (or $TASKBOX_BIN).",
            "taskbox's own settings (backend, timeouts, Vercel credentials): `taskbox config set terminal.KEY VALUE`.",
            "Check it: `hermes status --full` (its taskbox rows run `taskbox doctor`).",
        ]

    def doctor_checks(self) -> List[Tuple[bool, str, str]]:
        """``hermes doctor`` rows: the binary, the server, taskbox's backend, then each line of
        ``taskbox doctor --json``."""
        rows: List[Tuple[bool, str, str]] = []
        try:
            s = self.settings()
        except _settings.SettingsError as e:
            return [(False, "taskbox settings", str(e))]
        if s.taskbox_bin is None:
            rows.append((False, "taskbox binary", _settings.missing_binary_message(s)))
        else:
            version = _run_taskbox(s, ["--version"])
            ok = version is not None and version[0] == 0
            rows.append((ok, "taskbox binary", f"{s.taskbox_bin} ({version[1].strip() if ok else 'does not run'})"))
        try:
            h = Client(s).health(timeout=2.0)
            live = ", ".join(t.get("task", "?") for t in h.get("live_tasks") or []) or "none"
            rows.append((True, "taskbox server", f"pid {h.get('pid')}, version {h.get('version')}, "
                         f"serving {h.get('data_dir')}; live sandboxes: {live}"))
        except TaskboxError as e:
            if s.server == "auto":
                rows.append((True, "taskbox server", f"not running; one starts with the first command "
                             f"(server = auto, socket {s.socket})"))
            else:
                rows.append((False, "taskbox server", f"{e.message} (server = always)"))
        if s.taskbox_bin is None:
            return rows
        backend = _run_taskbox(s, ["config", "get", "terminal.backend"])
        if backend is not None and backend[0] == 0:
            rows.append((True, "taskbox backend", backend[1].strip()))
        else:
            rows.append((False, "taskbox backend", (backend[2].strip() if backend else "") or "cannot read taskbox's config"))
        doctor = _run_taskbox(s, ["doctor", "--json"], timeout=60)
        try:
            if doctor is None:
                raise ValueError("taskbox doctor did not finish")
            report = json.loads(doctor[1])
            for check in report.get("checks") or []:
                detail = str(check.get("detail") or "")
                if check.get("hint"):
                    detail += f" (hint: {check['hint']})"
                rows.append((bool(check.get("ok")), f"taskbox doctor: {check.get('name')}", detail))
            rows.append((True, "taskbox persistence", str(report.get("note") or PERSISTENCE_NOTE)))
        except (ValueError, AttributeError) as e:
            err = (doctor[2].strip().splitlines() or [""])[0] if doctor else ""
            rows.append((False, "taskbox doctor", f"{e}: {err}".strip(": ")))
        return rows

    # -- environments ----------------------------------------------------------------------------

    def create_environment(self, *, cwd: str = "", timeout: int = 180, task_id: str = "default",
                           image: Optional[str] = None,
                           container_config: Optional[Dict[str, Any]] = None,
                           backend_config: Optional[Mapping[str, Any]] = None, **kwargs: Any):
        """The environment of Hermes task ``task_id``: the taskbox task
        :func:`hermes_taskbox.ids.taskbox_task_id` maps it to, or, for Hermes's shared
        ``"default"``, the ``task`` setting, else one task per Hermes session, else per project
        directory (:func:`hermes_taskbox.ids.shared_task_id`). ``image`` and
        ``container_config`` are Hermes's container knobs; taskbox's own config decides its
        sandboxes. Unknown keyword arguments are accepted and ignored."""
        from .environment import TaskboxEnvironment

        s = self.settings(backend_config)
        session_id = current_session_id()
        if task_id == HERMES_SHARED_TASK_ID:
            task = s.task or shared_task_id(session_id, os.getcwd())
        else:
            task = taskbox_task_id(task_id)
        env = TaskboxEnvironment(
            task=task,
            hermes_task_id=task_id,
            settings=s,
            cwd=cwd,
            timeout=timeout,
        )
        if task_id == HERMES_SHARED_TASK_ID and session_id:
            _alias_for_session(env, session_id)
        return env


def current_session_id() -> str:
    """The Hermes session this thread works for (``HERMES_SESSION_ID``, which Hermes keeps in a
    context variable and mirrors in the environment), or ``""``."""
    try:
        from gateway.session_context import get_session_env  # type: ignore

        value = get_session_env("HERMES_SESSION_ID", "")
    except Exception:
        value = os.environ.get("HERMES_SESSION_ID", "")
    return value.strip() if isinstance(value, str) else ""


def _alias_for_session(env: Any, session_id: str) -> None:
    """Makes ``cleanup_vm(<session id>)`` reach the environment Hermes keys as ``"default"``.

    Hermes closes an agent with ``cleanup_vm(session_id)`` (``AIAgent.close()``), which looks the
    environment up under that id only; a shared environment lives under ``"default"``, so the
    session's task would never be suspended. The environment is also entered under the session
    id in Hermes's table of live environments — without an activity stamp, so the idle reaper
    keeps timing the ``"default"`` entry alone; ``cleanup()`` is idempotent, so the two entries
    suspend the task once. A Hermes without that table (0.19.0) is left as it is.
    """
    try:
        from tools import terminal_tool  # type: ignore

        table = terminal_tool._active_environments
        lock = terminal_tool._env_lock
    except Exception:
        return
    with lock:
        existing = table.get(session_id)
        # An earlier alias of ours (its "default" entry was reaped or cleaned up since) gives way
        # to the new environment; an environment Hermes keyed by the session id itself stays.
        if existing is None or getattr(existing, "hermes_task_id", None) == HERMES_SHARED_TASK_ID:
            table[session_id] = env


def _run_taskbox(s: _settings.Settings, args: List[str], timeout: float = 15) -> Optional[Tuple[int, str, str]]:
    """``taskbox ARGS`` with the data dir's environment: (exit code, stdout, stderr), or ``None``
    when it could not run or did not finish."""
    try:
        out = subprocess.run(
            [s.taskbox_bin, *args], capture_output=True, text=True, timeout=timeout,
            env=s.taskbox_env(), stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.returncode, out.stdout, out.stderr
