"""The Hermes environment: a ``BaseEnvironment`` whose commands run in a taskbox task's sandbox.

Hermes's own ``execute()`` does everything it does for its built-in backends — the session
snapshot, ``cd`` into the working directory, the cwd markers, the timeout and interrupt loop —
and hands the wrapped script to :meth:`TaskboxEnvironment._run_bash`, which sends it to
``taskbox serve`` as one run (``POST /v1/tasks/{task}/run``). The output reaches Hermes as the
server streams it, unchanged (Hermes parses its markers out of it); a timeout or an interrupt
cancels that one run (``POST /v1/runs/{run}/cancel``), never the sandbox.
"""

from __future__ import annotations

import base64
import itertools
import logging
import os
import re
import shlex
import threading
import time
from typing import Any, Dict, List, Mapping, Optional

from tools.environments.base import BaseEnvironment  # type: ignore

from .client import Client, NoServer, TaskboxError, error_from_object
from .settings import Settings

logger = logging.getLogger(__name__)

#: taskbox's exit code for its own failures (the CLI's too).
EXIT_TASKBOX_ERROR = 125
#: The server's bounds on ``timeout_secs``.
MAX_TIMEOUT_SECS = 18_000
#: The server's own timeout runs this much after Hermes's, so Hermes's timeout (its message, its
#: exit 124) is the one that fires; the server's still stops a command whose caller went away.
SERVER_TIMEOUT_SLACK_SECS = 5
#: How long :meth:`TaskboxRun.poll` waits for the command to end before answering "running".
POLL_WAIT_SECS = 0.05
#: The signal a timeout or an interrupt sends (then SIGKILL 3 s later, server-side).
CANCEL_SIGNAL = "TERM"
#: Moves a command to its sandbox's root: the task's workspace, which taskbox's local backend
#: names in ``TASKBOX_WORKSPACE``, else Vercel's ``/vercel/sandbox``. (A sandbox's commands start
#: where its previous command ended.)
CD_SANDBOX_ROOT = (
    'if [ -n "${TASKBOX_WORKSPACE:-}" ]; then builtin cd -- "$TASKBOX_WORKSPACE"; '
    "elif [ -d /vercel/sandbox ]; then builtin cd /vercel/sandbox; fi\n"
)


#: A variable name taskbox passes to a command (``TASKBOX_*`` excepted: taskbox's own).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: Never forwarded to a command: taskbox's Vercel credentials (the provider's
#: ``strip_env_keys``), which are the taskbox server's alone.
_NEVER_FORWARDED = frozenset({"VERCEL_TOKEN", "VERCEL_OIDC_TOKEN"})


def forwarded_env(explicit: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables Hermes asks a backend to forward into a sandbox's commands, sent as each
    run's ``env`` (taskbox gives a command nothing else of anyone's environment, and never
    journals nor shows these values).

    ``explicit`` (the environment's own ``env``), then Hermes's env passthrough — a skill's
    ``required_environment_variables`` and ``terminal.env_passthrough`` in config.yaml, filtered
    through Hermes's provider-credential blocklist and resolved in the active profile's secret
    scope — exactly as its docker and ssh backends forward them
    (``tools.environments.remote_common.resolve_passthrough_env``; a Hermes without it: the
    registered names' values in this process). Names taskbox refuses (``TASKBOX_*``, not a
    shell name, a value with a NUL) and taskbox's Vercel credentials are left out, with a
    warning naming them (never their values).
    """
    values: Dict[str, str] = {}
    try:
        from tools.environments.remote_common import resolve_passthrough_env  # type: ignore

        values, _unset = resolve_passthrough_env()
    except ImportError:
        try:
            from tools.env_passthrough import get_all_passthrough  # type: ignore

            for name in get_all_passthrough():
                value = os.environ.get(name)
                if value is not None:
                    values[name] = value
        except ImportError:
            pass
    merged = {**dict(explicit or {}), **values}
    out: Dict[str, str] = {}
    for name, value in sorted(merged.items()):
        if (
            name in _NEVER_FORWARDED
            or name.startswith("TASKBOX_")
            or not _ENV_NAME.match(name)
            or not isinstance(value, str)
            or "\0" in value
        ):
            logger.warning("taskbox: not forwarding %r to the sandbox: taskbox refuses or keeps it", name)
            continue
        out[name] = value
    return out


def notice_text(notice: Dict[str, Any]) -> str:
    """One line telling the agent what a run's notice means."""
    kind = notice.get("kind")
    if kind == "recreated":
        taken = notice.get("taken_at")
        when = (
            time.strftime(" taken %Y-%m-%d %H:%M:%S UTC", time.gmtime(taken / 1000))
            if isinstance(taken, (int, float))
            else ""
        )
        lost = (
            "; files written after that snapshot are lost"
            if notice.get("changes_lost")
            else "; the files are back"
        )
        return (
            f"[taskbox: the sandbox was recreated from snapshot {notice.get('from_snapshot')}{when}"
            f"{lost}; processes started earlier are gone]"
        )
    if kind == "sandbox_expired":
        return "[taskbox: the sandbox expired; processes started earlier are gone]"
    if kind == "late_checkpoint":
        return (
            f"[taskbox: the sandbox was found past its deadline; its files were kept in snapshot "
            f"{notice.get('snapshot_id')}]"
        )
    if kind == "files_lost":
        return f"[taskbox: files were lost: {notice.get('reason')}]"
    return f"[taskbox: {notice}]"


class TaskboxRun:
    """The process handle Hermes's ``_wait_for_process`` polls: one taskbox run.

    Like Hermes's ``_ThreadedProcessHandle`` (a pipe for stdout, a worker thread), but the
    output is written to the pipe chunk by chunk as the server streams it, so a command that
    times out or is interrupted still shows what it printed, and :meth:`kill` cancels the run on
    the server — just that command.
    """

    def __init__(self, client: Client, task: str, command: str, timeout_secs: int,
                 stdin_data: Optional[str], env: Optional[Mapping[str, str]] = None):
        self._client = client
        #: The run's variables (secrets: sent in the request body only).
        self._env = dict(env or {})
        self._task = task
        self._command = command
        self._timeout_secs = timeout_secs
        self._stdin = stdin_data.encode("utf-8") if stdin_data is not None else None
        read_fd, self._write_fd = os.pipe()
        self._stdout = os.fdopen(read_fd, "r", encoding="utf-8", errors="replace")
        self._lock = threading.Lock()
        self._run_id: Optional[str] = None
        self._cancel_wanted = False
        self._cancel_sent = False
        self._reader_gone = False
        self._returncode: Optional[int] = None
        self._done = threading.Event()
        #: What the server said besides the output (notices, an error).
        self.notes: List[str] = []
        #: The run's result line, once it came.
        self.result: Optional[Dict[str, Any]] = None
        threading.Thread(target=self._worker, name=f"taskbox-run-{task}", daemon=True).start()

    # -- ProcessHandle --------------------------------------------------------------------------

    @property
    def stdout(self):
        return self._stdout

    @property
    def returncode(self) -> Optional[int]:
        return self._returncode

    @property
    def run_id(self) -> Optional[str]:
        """The server's id of this run (once it started)."""
        return self._run_id

    def poll(self) -> Optional[int]:
        # Waits briefly for the end instead of answering at once: Hermes's loop sleeps between
        # polls (5 ms, growing to 200 ms), so a command ending during a sleep is only seen at the
        # next poll; waiting here sees it the moment the result arrives. Hermes's timeout and
        # interrupt checks, between polls, are delayed by at most POLL_WAIT_SECS.
        self._done.wait(POLL_WAIT_SECS)
        return self._returncode if self._done.is_set() else None

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        self._done.wait(timeout=timeout)
        return self._returncode

    def kill(self) -> None:
        """Cancels the run's command (SIGTERM, SIGKILL 3 s later). Before the server named the
        run, the cancel is sent the moment it does, so the command does not start."""
        with self._lock:
            if self._done.is_set():
                return
            self._cancel_wanted = True
            run = self._run_id
        if run is not None:
            self._send_cancel(run)

    terminate = kill

    # -- the worker ----------------------------------------------------------------------------

    def _send_cancel(self, run: str) -> None:
        with self._lock:
            if self._cancel_sent:
                return
            self._cancel_sent = True
        try:
            self._client.cancel(run, CANCEL_SIGNAL)
        except TaskboxError as e:
            # 404: the run is over already; anything else: the result line still comes.
            logger.debug("taskbox: cancelling run %s: %s", run, e.message)

    def _write(self, data: bytes) -> None:
        if self._reader_gone or not data:
            return
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._write_fd, view)
                view = view[n:]
        except OSError:
            # Hermes closed its end: nobody reads the rest.
            self._reader_gone = True

    def _worker(self) -> None:
        code = EXIT_TASKBOX_ERROR
        try:
            code = self._run()
        except TaskboxError as e:
            self.notes.extend(notice_text(n) for n in e.notices)
            self._write(e.render().encode("utf-8"))
        except Exception as e:  # a bug here must still end as a failed command, not a hang
            logger.exception("taskbox: run in %s failed", self._task)
            self._write(f"taskbox: {type(e).__name__}: {e}\n".encode("utf-8"))
        finally:
            if self.notes:
                self._write(("\n" + "\n".join(self.notes) + "\n").encode("utf-8"))
            try:
                os.close(self._write_fd)
            except OSError:
                pass
            self._returncode = code
            self._done.set()

    def _run(self) -> int:
        events = self._client.run(
            self._task, self._command, self._timeout_secs, stdin=self._stdin is not None,
            env=self._env,
        )
        try:
            first = next(events)
        except NoServer:
            if self._cancel_wanted:
                return 128 + 15
            self._client.ensure_server()
            if self._cancel_wanted:  # cancelled while a server was starting: never start it
                return 128 + 15
            events = self._client.run(
                self._task, self._command, self._timeout_secs, stdin=self._stdin is not None,
                env=self._env,
            )
            first = next(events, None)
        except StopIteration:
            first = None
        if first is None:
            raise TaskboxError("connection", "the taskbox server ended the run's stream before it started")
        for event in itertools.chain([first], events):
            kind = event.get("type")
            if kind == "started":
                with self._lock:
                    self._run_id = str(event.get("run"))
                    cancel = self._cancel_wanted
                if cancel:
                    self._send_cancel(self._run_id)
                if self._stdin is not None:
                    threading.Thread(target=self._feed_stdin, args=(self._run_id,), daemon=True).start()
            elif kind == "output":
                if event.get("text") is not None:
                    self._write(event["text"].encode("utf-8"))
                elif event.get("base64") is not None:
                    try:
                        self._write(base64.b64decode(event["base64"]))
                    except ValueError:
                        pass
            elif kind == "result":
                self.result = event
                self.notes.extend(notice_text(n) for n in event.get("notices") or [])
                return int(event.get("exit_code", EXIT_TASKBOX_ERROR))
            elif kind == "error":
                raise error_from_object(event)
        raise TaskboxError(
            "connection",
            "the taskbox server ended the run's stream before its result (did it stop?)",
            "`taskbox status` says whether a server runs; the command may have run",
        )

    def _feed_stdin(self, run: str) -> None:
        try:
            self._client.send_stdin(run, self._stdin or b"")
        except TaskboxError as e:
            logger.warning("taskbox: sending stdin to run %s: %s", run, e.message)


class TaskboxEnvironment(BaseEnvironment):
    """A Hermes terminal environment backed by one taskbox task.

    Working directories (see :meth:`sandbox_cwd`): commands run in the task's sandbox, never in
    a directory Hermes made up for a container or took from the host. The sandbox's root is the
    task's workspace as its commands see it (``/workspace`` in the local backend's isolated
    sandbox, its default; the host path ``tasks/<task>/workspace`` in the data dir under
    ``terminal.local_isolation = none``; ``/vercel/sandbox`` on Vercel), learnt from the
    session's first command.
    """

    # stdin goes through the API's stdin endpoint, not a heredoc in the (journaled) command.
    _stdin_mode = "pipe"

    def __init__(self, *, task: str, settings: Settings, cwd: str = "", timeout: int = 180,
                 hermes_task_id: Optional[str] = None, env: Optional[dict] = None):
        self.task = task
        self.hermes_task_id = hermes_task_id if hermes_task_id is not None else task
        self.settings = settings
        self._client = Client(settings)
        self._used = False
        self._closed = False
        #: The cwd Hermes created the environment with: its default for every command.
        self._hermes_default_cwd = (cwd or "").strip()
        #: The sandbox's root, once the session's first command reported it.
        self.sandbox_root: Optional[str] = None
        #: The last run (for tests and diagnostics).
        self.last_run: Optional[TaskboxRun] = None
        #: What the server told about the session's first run (a sandbox recreated from a
        #: snapshot), for the first command's output: the agent never sees init_session's.
        self._pending_notes: List[str] = []
        super().__init__(cwd=".", timeout=timeout, env=env)
        # The session's first command starts at the sandbox's root (a sandbox's runs otherwise
        # start where its last one ended), so Hermes's marker reports the root.
        self._at_root_next = True
        self.init_session()
        self._at_root_next = False
        if self.last_run is not None and self.last_run.notes:
            self._pending_notes = list(self.last_run.notes)
        if os.path.isabs(self.cwd):
            self.sandbox_root = os.path.normpath(self.cwd)
        initial = self.sandbox_cwd(cwd)
        if initial is None:
            # A host directory as the environment's cwd (terminal.cwd, or Hermes's launch
            # directory): it is not in the sandbox; the sandbox's root is used instead.
            logger.info("taskbox: %r is outside task %s's sandbox; commands start in %s",
                        cwd, task, self.sandbox_root or "its root")
        elif initial:
            self.cwd = initial

    #: Directories Hermes gives a backend when nothing was configured (``tools/terminal_tool.py``:
    #: ``/root`` for container and plugin backends, ``~`` for ssh).
    HERMES_DEFAULT_CWDS = ("/root", "~", "~/")

    def sandbox_cwd(self, cwd: Optional[str]) -> Optional[str]:
        """Where a command Hermes asked to run in ``cwd`` runs, or ``None`` when it must not run.

        - empty: the environment's current directory (Hermes's own rule);
        - the directory Hermes's cwd marker last reported (``self.cwd``), or any path inside the
          sandbox's root: kept;
        - Hermes's defaults (``/root``, ``~``, the cwd the environment was created with, this
          user's ``$HOME``): the sandbox's root; ``/root/x`` and ``~/x``: ``x`` under the root;
        - a relative path: under the root;
        - any other absolute path is a host directory outside the sandbox: ``None`` (refused).
        """
        cwd = (cwd or "").strip()
        if not cwd:
            return ""
        root = self.sandbox_root
        if cwd == self.cwd or self._inside_root(cwd):
            return cwd
        home = os.path.expanduser("~")
        defaults = set(self.HERMES_DEFAULT_CWDS) | {home}
        if self._hermes_default_cwd:
            defaults.add(self._hermes_default_cwd)
        if cwd in defaults or cwd.rstrip("/") in defaults:
            return root or ""
        for prefix in ("~/", "/root/"):
            if cwd.startswith(prefix):
                rest = cwd[len(prefix):].lstrip("/")
                return os.path.join(root, rest) if root else rest
        if not os.path.isabs(cwd):
            return os.path.join(root, cwd) if root else cwd
        return None

    def _inside_root(self, path: str) -> bool:
        root = self.sandbox_root
        if root is None or not os.path.isabs(path):
            return False
        norm = os.path.normpath(path)
        return norm == root or norm.startswith(root.rstrip("/") + "/")

    def execute(self, command: str, cwd: str = "", **kwargs: Any) -> dict:
        """Hermes's ``execute()``, in the directory :meth:`sandbox_cwd` chooses; a host directory
        outside the sandbox fails the command (exit 126, as a failed ``cd`` does) without running
        it."""
        where = self.sandbox_cwd(cwd)
        if where is None:
            return {
                "output": (
                    f"taskbox: the working directory {cwd} is outside task {self.task}'s sandbox "
                    f"(its root is {self.sandbox_root or 'the task workspace'}); the command did "
                    "not run\nhint: use a path inside the sandbox, a relative path, or none\n"
                ),
                "returncode": 126,
            }
        result = super().execute(command, where, **kwargs)
        if self._pending_notes and isinstance(result.get("output"), str):
            notes, self._pending_notes = self._pending_notes, []
            result["output"] += "\n" + "\n".join(notes) + "\n"
        return result

    def _run_bash(self, cmd_string: str, *, login: bool = False, timeout: int = 120,
                  stdin_data: Optional[str] = None) -> TaskboxRun:
        if self._closed:
            # A command after cleanup(): the task was suspended; running again restores it.
            self._closed = False
        if getattr(self, "_at_root_next", False):
            cmd_string = CD_SANDBOX_ROOT + cmd_string
        if login:
            # The profile runs first (it may `cd ~`), then the script starts where a non-login
            # run would: in the directory the sandbox started the command in.
            cmd_string = (
                "exec bash -l -c "
                + shlex.quote('builtin cd -- "$0" 2>/dev/null; eval "$1"')
                + ' "$PWD" '
                + shlex.quote(cmd_string)
            )
        # Hermes reads one output, stderr merged into stdout, as its local backend's
        # `stderr=STDOUT` gives it. The server streams the two as separate pipes, whose relative
        # order is lost on the way; merging them in the sandbox keeps the command's own order.
        cmd_string = "exec 2>&1\n" + cmd_string
        timeout_secs = max(1, min(MAX_TIMEOUT_SECS, int(timeout or self.timeout) + SERVER_TIMEOUT_SLACK_SECS))
        self._used = True
        run = TaskboxRun(self._client, self.task, cmd_string, timeout_secs, stdin_data,
                         env=forwarded_env(getattr(self, "env", None)))
        self.last_run = run
        return run

    def checkpoint(self) -> dict:
        """Snapshots the task's files now without stopping its sandbox (``POST
        /v1/tasks/{task}/checkpoint``): its processes keep running."""
        return self._client.checkpoint(self.task)

    def rewind(self, to: Optional[str] = None, back: Optional[int] = None) -> dict:
        """Puts the task's files back as snapshot ``to`` (``TASK.sN``) or ``back`` snapshots ago
        held them, after keeping the current ones (the answer's ``saved`` undoes it); running
        processes end."""
        return self._client.rewind(self.task, to=to, back=back)

    def cleanup(self) -> None:
        """Suspends the task (snapshot, sandbox stopped), never deletes it; idempotent. A server
        is not started for it: with none running, no sandbox of this task is live."""
        if self._closed or not getattr(self, "_used", False):
            self._closed = True
            return
        self._closed = True
        try:
            self._client.suspend(self.task)
        except NoServer:
            pass
        except TaskboxError as e:
            logger.warning("taskbox: suspending task %s: %s", self.task, e.message)
        except Exception:  # never raise from cleanup (__del__ calls it)
            logger.debug("taskbox: suspending task %s", self.task, exc_info=True)
