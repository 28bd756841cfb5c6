"""The plugin's own settings (``terminal.backends.taskbox`` in Hermes's config.yaml).

taskbox's config (``terminal.*``: backend, timeouts, lifetimes, Vercel credentials) stays
taskbox's: the server reads it from its own config file, as the CLI does. Hermes-side, only where
to find taskbox:

``data_dir``
    taskbox's data dir: its store, the tasks' workspaces and snapshots, and the server's socket
    ``<data_dir>/taskbox.sock``. Default: what taskbox itself uses — ``$TASKBOX_DATA_DIR``, else
    ``$TASKBOX_HOME/data``, else ``$XDG_DATA_HOME/taskbox`` (``~/.local/share/taskbox``). When set,
    it reaches every ``taskbox`` process the plugin starts as ``TASKBOX_DATA_DIR``.
``server``
    ``auto`` (default): when no server answers on the socket, start ``taskbox serve --auto`` in the
    background as the CLI does (it exits once idle with no live sandbox). ``always``: use the
    running server only (a systemd unit, say) and fail each command with a clear message when
    none answers.
``taskbox_bin``
    the ``taskbox`` binary, needed to start a server and for ``hermes doctor``. Default:
    ``$TASKBOX_BIN``, else ``taskbox`` on ``PATH``.
``task``
    the taskbox task of Hermes's shared ``"default"`` environment (the CLI's, with
    ``container_persistent``), for a user who wants every session to share one task's files.
    Default: empty — one task per Hermes session, else per project directory
    (:func:`hermes_taskbox.ids.shared_task_id`).

Released Hermes (0.22's provider interface) does not pass these to the provider and its
``hermes config set`` does not know them: the plugin reads them from config.yaml itself.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

#: Where Hermes keeps these settings.
CONFIG_PREFIX = "terminal.backends.taskbox"

#: The environment variable naming the ``taskbox`` binary.
BIN_ENV = "TASKBOX_BIN"
#: The environment variable naming taskbox's data dir (read by taskbox itself too).
DATA_DIR_ENV = "TASKBOX_DATA_DIR"

SERVER_MODES = ("auto", "always")

#: ``get_config_schema()``: the dashboard's fields under ``terminal.backends.taskbox``.
CONFIG_SCHEMA: Dict[str, Dict[str, Any]] = {
    "data_dir": {
        "type": "string",
        "description": "taskbox's data dir (its store, workspaces, snapshots and the server's "
        "socket taskbox.sock). Empty: taskbox's default ($TASKBOX_DATA_DIR, $TASKBOX_HOME/data "
        "or ~/.local/share/taskbox).",
        "default": "",
    },
    "server": {
        "type": "select",
        "options": list(SERVER_MODES),
        "description": "auto: start `taskbox serve` in the background when none answers; "
        "always: only use a server already running (fail otherwise).",
        "default": "auto",
    },
    "taskbox_bin": {
        "type": "string",
        "description": "The taskbox binary. Empty: $TASKBOX_BIN, else taskbox on PATH.",
        "default": "",
    },
    "task": {
        "type": "string",
        "description": "The taskbox task of Hermes's shared environment (the CLI's). Empty: one "
        "task per Hermes session, else per project directory.",
        "default": "",
    },
}


class SettingsError(ValueError):
    """A ``terminal.backends.taskbox`` value taskbox cannot use; the message names the key and the fix."""


@dataclass(frozen=True)
class Settings:
    """The resolved settings."""

    #: taskbox's data dir (absolute).
    data_dir: Path
    #: Whether ``data_dir`` was chosen here (then ``TASKBOX_DATA_DIR`` is passed to taskbox).
    data_dir_explicit: bool
    #: ``auto`` or ``always``.
    server: str
    #: The ``taskbox`` binary, or ``None`` when none was found.
    taskbox_bin: Optional[str]
    #: Where ``taskbox_bin`` came from (for messages): a config key, an env var or ``PATH``.
    taskbox_bin_source: str
    #: The task of Hermes's shared ``"default"`` environment, or ``None`` (derived).
    task: Optional[str] = None

    @property
    def socket(self) -> Path:
        """The server's Unix socket."""
        return self.data_dir / "taskbox.sock"

    def taskbox_env(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """The environment for a ``taskbox`` process: ``base`` (default: this process's) with
        ``TASKBOX_DATA_DIR`` set when ``data_dir`` was configured here."""
        env = dict(os.environ if base is None else base)
        if self.data_dir_explicit:
            env[DATA_DIR_ENV] = str(self.data_dir)
        return env


def _non_empty(env: Mapping[str, str], key: str) -> Optional[str]:
    value = env.get(key)
    return value if value else None


def default_data_dir(env: Mapping[str, str]) -> Path:
    """taskbox's own choice of data dir (``Paths::from_env`` in ``src/engine/paths.rs``)."""
    explicit = _non_empty(env, DATA_DIR_ENV)
    if explicit:
        return Path(explicit)
    home = _non_empty(env, "TASKBOX_HOME")
    if home:
        return Path(home) / "data"
    user_home = Path(_non_empty(env, "HOME") or ".")
    data = _non_empty(env, "XDG_DATA_HOME")
    return (Path(data) if data else user_home / ".local" / "share") / "taskbox"


def resolve(config: Optional[Mapping[str, Any]], env: Optional[Mapping[str, str]] = None) -> Settings:
    """Resolves ``terminal.backends.taskbox`` (``config``, may be empty) against the environment.

    Raises :class:`SettingsError` for an unknown key or a value of the wrong kind.
    """
    env = os.environ if env is None else env
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_SCHEMA))
    if unknown:
        raise SettingsError(
            f"unknown setting {CONFIG_PREFIX}.{unknown[0]}: the taskbox backend reads "
            + ", ".join(f"{CONFIG_PREFIX}.{k}" for k in CONFIG_SCHEMA)
            + " (taskbox's own settings go in taskbox's config: `taskbox config set terminal.KEY VALUE`)"
        )

    def text(key: str) -> str:
        value = config.get(key)
        if value is None:
            return ""
        if not isinstance(value, (str, os.PathLike)):
            raise SettingsError(
                f"{CONFIG_PREFIX}.{key} must be text, not {type(value).__name__} ({value!r})"
            )
        return os.fspath(value).strip()

    data_dir_text = text("data_dir")
    if data_dir_text:
        data_dir = Path(os.path.expanduser(data_dir_text))
        if not data_dir.is_absolute():
            raise SettingsError(
                f"{CONFIG_PREFIX}.data_dir must be an absolute path (or start with ~), "
                f"not {data_dir_text!r}: set {CONFIG_PREFIX}.data_dir: /path/to/dir in Hermes's config.yaml"
            )
    else:
        data_dir = default_data_dir(env)
        if not data_dir.is_absolute():
            data_dir = Path.cwd() / data_dir

    server = text("server").lower() or "auto"
    if server not in SERVER_MODES:
        hint = (
            " (the plugin always talks to a server: it is what cancels a single command and keeps "
            "sandboxes' timers between commands)"
            if server == "never"
            else ""
        )
        raise SettingsError(
            f"{CONFIG_PREFIX}.server must be one of {', '.join(SERVER_MODES)}, not {server!r}{hint}"
        )

    bin_text = text("taskbox_bin")
    if bin_text:
        taskbox_bin: Optional[str] = _executable(os.path.expanduser(bin_text))
        source = f"{CONFIG_PREFIX}.taskbox_bin ({bin_text})"
    elif _non_empty(env, BIN_ENV):
        taskbox_bin = _executable(os.path.expanduser(env[BIN_ENV]))
        source = f"${BIN_ENV} ({env[BIN_ENV]})"
    else:
        taskbox_bin = shutil.which("taskbox", path=env.get("PATH"))
        source = "taskbox on PATH"
    task = text("task") or None
    if task is not None:
        from .ids import is_valid_task_id

        if not is_valid_task_id(task):
            raise SettingsError(
                f"{CONFIG_PREFIX}.task must be a taskbox task id (1 to 64 of A-Z a-z 0-9 _ -, "
                f"starting with a letter or digit), not {task!r}"
            )
    return Settings(
        task=task,
        data_dir=data_dir,
        data_dir_explicit=bool(data_dir_text),
        server=server,
        taskbox_bin=taskbox_bin,
        taskbox_bin_source=source,
    )


def _executable(path: str) -> Optional[str]:
    """``path`` when it names an executable file (a bare name is looked up on ``PATH``)."""
    if os.sep not in path:
        return shutil.which(path)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def missing_binary_message(settings: Settings) -> str:
    """Why there is no binary, and the three ways to name one."""
    return (
        f"the taskbox binary was not found ({settings.taskbox_bin_source}); set "
        f"{CONFIG_PREFIX}.taskbox_bin: /path/to/taskbox in Hermes's config.yaml, set ${BIN_ENV}, "
        "or put taskbox on PATH"
    )


def hermes_backend_config() -> Dict[str, Any]:
    """``terminal.backends.taskbox`` from Hermes's config.yaml, when Hermes is importable
    (empty otherwise). Hermes versions that pass ``backend_config`` to ``create_environment``
    make this unnecessary."""
    try:
        from hermes_cli.config import load_config  # type: ignore
    except Exception:
        return {}
    try:
        config = load_config() or {}
    except Exception:
        return {}
    node: Any = config
    for key in ("terminal", "backends", "taskbox"):
        if not isinstance(node, Mapping):
            return {}
        node = node.get(key)
    return dict(node) if isinstance(node, Mapping) else {}
