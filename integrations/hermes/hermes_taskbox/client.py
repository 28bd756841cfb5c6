"""A client of ``taskbox serve`` (docs/api.md) over its Unix socket, standard library only.

Every failure is a :class:`TaskboxError` carrying the server's ``code``, ``message`` and ``hint``
(or the client's own, for a socket that does not answer), never a raw traceback for the caller to
print.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import socket
import subprocess
import time
import urllib.parse
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .settings import Settings, missing_binary_message

#: How long to wait for a server this client started to answer (as the CLI: 60 s).
START_WAIT = 60.0
#: The server's log in the data dir (the CLI appends to the same file).
LOG_FILE = "serve.log"
#: The lock a server holds on its data dir for as long as it runs.
SERVE_LOCK = "serve.lock"
#: Environment variables that are taskbox's, passed to a server this plugin starts even where
#: Hermes's own subprocess scrubbing would drop them.
_TASKBOX_ENV_PREFIXES = ("TASKBOX_",)
#: taskbox's Vercel credentials and settings: passed only when taskbox's backend is
#: vercel_sandbox (on the local backend commands run with the server's environment).
_VERCEL_ENV = (
    "VERCEL_TOKEN",
    "VERCEL_OIDC_TOKEN",
    "VERCEL_PROJECT_ID",
    "VERCEL_TEAM_ID",
    "TERMINAL_VERCEL_RUNTIME",
)


class TaskboxError(Exception):
    """A request taskbox refused or could not serve."""

    def __init__(self, code: str, message: str, hint: Optional[str] = None,
                 notices: Optional[List[Dict[str, Any]]] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint
        self.notices = notices or []

    def render(self) -> str:
        """The message and its hint, as lines for a command's output."""
        lines = [f"taskbox: {self.message}"]
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines) + "\n"


class NoServer(TaskboxError):
    """Nothing answers on the socket (nothing was sent)."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("taskbox", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class Client:
    """Requests to the server of one data dir."""

    def __init__(self, settings: Settings):
        self.settings = settings

    # -- plumbing -------------------------------------------------------------------------------

    def _connect(self, timeout: Optional[float]) -> _UnixConnection:
        sock = str(self.settings.socket)
        conn = _UnixConnection(sock, timeout)
        try:
            conn.connect()
        except (FileNotFoundError, ConnectionRefusedError) as e:
            conn.close()
            raise NoServer(
                "no_server",
                f"no taskbox server answers on {sock} ({e.strerror or e})",
                "start one with `taskbox serve`, or set "
                "terminal.backends.taskbox.server to auto",
            ) from None
        except OSError as e:
            conn.close()
            raise TaskboxError(
                "connect", f"cannot connect to the taskbox server on {sock}: {e}"
            ) from None
        return conn

    def _send(self, method: str, path: str, body: Any = None, *,
              timeout: Optional[float] = 30.0, raw: Optional[bytes] = None,
              ) -> Tuple[_UnixConnection, http.client.HTTPResponse]:
        conn = self._connect(timeout)
        headers = {}
        data: Optional[bytes] = raw
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise TaskboxError(
                "connection", f"the taskbox server did not answer {method} {path}: {e}"
            ) from None
        return conn, resp

    @staticmethod
    def _error_from(status: int, payload: bytes) -> TaskboxError:
        try:
            obj = json.loads(payload.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            obj = None
        if isinstance(obj, dict) and "message" in obj:
            return error_from_object(obj)
        text = payload.decode("utf-8", "replace").strip()[:500]
        return TaskboxError("http", f"the taskbox server answered {status}: {text}")

    def request(self, method: str, path: str, body: Any = None, *,
                timeout: Optional[float] = 30.0, raw: Optional[bytes] = None) -> Any:
        """One request with a JSON answer; an error answer raises :class:`TaskboxError`."""
        conn, resp = self._send(method, path, body, timeout=timeout, raw=raw)
        try:
            payload = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise TaskboxError(
                "connection", f"the taskbox server's answer to {method} {path} was cut: {e}"
            ) from None
        finally:
            conn.close()
        if resp.status >= 400:
            raise self._error_from(resp.status, payload)
        try:
            return json.loads(payload.decode("utf-8")) if payload else None
        except (ValueError, UnicodeDecodeError):
            raise TaskboxError(
                "http", f"the taskbox server's answer to {method} {path} is not JSON"
            ) from None

    # -- endpoints ------------------------------------------------------------------------------

    def health(self, timeout: float = 2.0) -> Dict[str, Any]:
        """``GET /v1/health`` (does not count as activity)."""
        return self.request("GET", "/v1/health", timeout=timeout)

    def suspend(self, task: str) -> Dict[str, Any]:
        """``POST /v1/tasks/{task}/suspend``: snapshot the task's files, stop its sandbox."""
        return self.request("POST", f"/v1/tasks/{_quote(task)}/suspend", timeout=None)

    def checkpoint(self, task: str) -> Dict[str, Any]:
        """``POST /v1/tasks/{task}/checkpoint``: snapshot the task's files without stopping its
        sandbox (its processes pause for a moment). ``outcome`` says what happened: ``taken``,
        ``unchanged`` (the latest snapshot holds the files), ``stopped`` (the backend's snapshot
        stopped the sandbox) or ``no_sandbox``."""
        return self.request("POST", f"/v1/tasks/{_quote(task)}/checkpoint", timeout=None)

    def rewind(self, task: str, to: Optional[str] = None, back: Optional[int] = None) -> Dict[str, Any]:
        """``POST /v1/tasks/{task}/rewind``: keep the current files in a checkpoint, then restore
        snapshot ``to`` (``TASK.sN``) or the one ``back`` snapshots before. Exactly one of the
        two; the answer's ``saved`` snapshot undoes the rewind."""
        if (to is None) == (back is None):
            raise TaskboxError("bad_request", "rewind takes exactly one of `to` and `back`")
        body: Dict[str, Any] = {"to": to} if to is not None else {"back": back}
        return self.request("POST", f"/v1/tasks/{_quote(task)}/rewind", body, timeout=None)

    def show(self, task: str, journal: int = 0) -> Dict[str, Any]:
        """``GET /v1/tasks/{task}``."""
        return self.request("GET", f"/v1/tasks/{_quote(task)}?journal={journal}")

    def cancel(self, run: str, signal: str = "TERM") -> Dict[str, Any]:
        """``POST /v1/runs/{run}/cancel``: signal the run's command (never the sandbox)."""
        return self.request("POST", f"/v1/runs/{_quote(run)}/cancel", {"signal": signal})

    def send_stdin(self, run: str, data: bytes) -> Dict[str, Any]:
        """``POST /v1/runs/{run}/stdin``: the command's whole stdin."""
        return self.request("POST", f"/v1/runs/{_quote(run)}/stdin", raw=data, timeout=None)

    def run(self, task: str, command: str, timeout_secs: int, stdin: bool,
            env: Optional[Mapping[str, str]] = None) -> Iterator[Dict[str, Any]]:
        """``POST /v1/tasks/{task}/run``: the NDJSON lines as they come (``started``, ``output``...,
        then ``result`` or ``error``). ``env``: variables for the command (secrets: the server
        never journals nor shows them). A refused request raises :class:`TaskboxError`."""
        body: Dict[str, Any] = {"command": command, "timeout_secs": timeout_secs}
        if stdin:
            body["stdin"] = True
        if env:
            body["env"] = dict(env)
        conn, resp = self._send("POST", f"/v1/tasks/{_quote(task)}/run", body, timeout=None)
        try:
            if resp.status >= 400:
                raise self._error_from(resp.status, resp.read())
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise TaskboxError(
                        "connection", f"the taskbox server's run stream was cut: {e}"
                    ) from None
                if not line:
                    return
                line = line.strip()
                if not line:
                    continue
                try:
                    yield json.loads(line.decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    raise TaskboxError(
                        "http", f"the taskbox server sent a line that is not JSON: {line[:200]!r}"
                    ) from None
        finally:
            conn.close()

    # -- starting a server ------------------------------------------------------------------------

    def answers(self) -> bool:
        """Whether a server answers on the socket now."""
        try:
            self.health(timeout=2.0)
            return True
        except TaskboxError:
            return False

    def ensure_server(self) -> Optional[int]:
        """Makes sure a server answers, starting ``taskbox serve --auto`` as the CLI does when
        ``server`` is ``auto``: detached (its own session), stdin from /dev/null, output appended
        to ``<data>/serve.log``, racing starters serialized by ``<data>/autostart.lock`` (the
        CLI's lock, so a CLI and Hermes starting at once start one server). Returns the pid of a
        server this call started, ``None`` when one already answered."""
        settings = self.settings
        if self.answers():
            return None
        if settings.server != "auto":
            raise NoServer(
                "no_server",
                f"no taskbox server answers on {settings.socket} and "
                "terminal.backends.taskbox.server is `always`",
                "start one (`taskbox serve`), or set terminal.backends.taskbox.server: auto "
                "in Hermes's config.yaml",
            )
        if not settings.taskbox_bin:
            raise TaskboxError("no_binary", f"cannot start a taskbox server: {missing_binary_message(settings)}")
        data_dir = settings.data_dir
        log_path = data_dir / LOG_FILE

        def start_error(message: str) -> TaskboxError:
            return TaskboxError(
                "start",
                f"cannot start a taskbox server for {data_dir}: {message}",
                f"see {log_path}, or start one yourself with `taskbox serve`",
            )

        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            lock = open(data_dir / "autostart.lock", "a")
        except OSError as e:
            raise start_error(f"cannot create the data dir or its autostart.lock: {e}") from None
        with lock:
            started = time.monotonic()
            while True:
                try:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - started > START_WAIT:
                        raise start_error(
                            "another process has been starting a server for over 60 s"
                        ) from None
                    time.sleep(0.01)
            # Holding the lock: a concurrent starter may have won meanwhile.
            if self.answers():
                return None
            env = self._server_env()
            child: Optional[subprocess.Popen] = None
            last_exit = None
            log_start = 0
            started = time.monotonic()
            while True:
                if child is None:
                    log_start = _size(log_path)
                    child = self._spawn(env, log_path, start_error)
                if self.answers():
                    return child.pid
                code = child.poll()
                if code is not None:
                    last_exit = code
                    child = None
                    if not _held(data_dir / SERVE_LOCK):
                        # No stopping server holds the data dir: it failed by itself (a bad
                        # config, an unusable data dir). Say why, from its log, at once.
                        raise start_error(
                            f"`taskbox serve` exited with code {code}: "
                            + (_tail(log_path, log_start) or "(nothing in its log)")
                        )
                    # A server that is still stopping holds serve.lock: start another once it
                    # is gone.
                if time.monotonic() - started > START_WAIT:
                    if child is not None:
                        child.kill()
                    raise start_error(
                        f"`taskbox serve` exited with code {last_exit}"
                        if last_exit is not None
                        else f"its socket did not answer within {int(START_WAIT)} s"
                    )
                time.sleep(0.01)

    def _spawn(self, env: Dict[str, str], log_path, start_error) -> subprocess.Popen:
        try:
            with open(log_path, "ab") as log:
                return subprocess.Popen(
                    [self.settings.taskbox_bin, "serve", "--auto"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd=str(self.settings.data_dir),
                    env=env,
                    # Its own session: Hermes's Ctrl-C or a closed terminal does not reach it.
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as e:
            raise start_error(f"cannot run {self.settings.taskbox_bin}: {e}") from None

    def _server_env(self) -> Dict[str, str]:
        """The server's environment. No command sees it (taskbox builds each command's
        environment from scratch; variables reach a command only as a run's ``env``); as defence
        in depth it is still Hermes's scrubbed subprocess environment (no LLM keys or bot tokens)
        where Hermes offers one, plus taskbox's own variables — and taskbox's Vercel credentials
        only when its backend is vercel_sandbox."""
        base: Dict[str, str]
        try:
            from tools.environments.local import hermes_subprocess_env  # type: ignore

            base = dict(hermes_subprocess_env())
        except Exception:
            base = dict(os.environ)
        for key, value in os.environ.items():
            if key.startswith(_TASKBOX_ENV_PREFIXES):
                base[key] = value
        for key in _VERCEL_ENV:
            base.pop(key, None)
        env = self.settings.taskbox_env(base)
        if any(os.environ.get(k) for k in _VERCEL_ENV) and self._backend(env) == "vercel_sandbox":
            for key in _VERCEL_ENV:
                if key in os.environ:
                    env[key] = os.environ[key]
        return env

    def _backend(self, env: Dict[str, str]) -> Optional[str]:
        try:
            out = subprocess.run(
                [self.settings.taskbox_bin, "config", "get", "terminal.backend"],
                capture_output=True, text=True, timeout=10, env=env, stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None


def _size(path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _tail(path, start: int, limit: int = 2000) -> str:
    """What a server wrote to its log from ``start`` on (its last ``limit`` bytes), one line."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines)[-limit:]


def _held(lock_path) -> bool:
    """Whether a process holds the ``flock`` on ``lock_path`` (a server owning the data dir)."""
    try:
        with open(lock_path, "a") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def error_from_object(obj: Dict[str, Any]) -> TaskboxError:
    """The :class:`TaskboxError` of an API error object (docs/api.md, "Errors")."""
    message = str(obj.get("message") or "unknown error")
    causes = obj.get("causes") or []
    if causes:
        message += "".join(f"\ncaused by: {c}" for c in causes)
    return TaskboxError(
        str(obj.get("code") or "error"),
        message,
        obj.get("hint"),
        obj.get("notices") if isinstance(obj.get("notices"), list) else None,
    )
