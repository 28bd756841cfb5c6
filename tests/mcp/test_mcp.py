"""`taskbox mcp` driven by the official MCP Python SDK (`mcp` on PyPI) as its client.

Run by the Rust integration test `mcp::the_official_python_sdk_drives_taskbox_mcp` (which makes
the venv and passes the debug binary as TASKBOX_BIN); by hand:

    target/py-mcp/bin/python -m pytest tests/mcp -q   # with TASKBOX_BIN=target/debug/taskbox

Each test gets its own TASKBOX_HOME. Most run twice: under `terminal.server = never` (the tools
drive an engine inside `taskbox mcp`) and `auto` (they go to an auto-started `taskbox serve`,
stopped again at the end of the test).
"""

import base64
import os
import re
import subprocess
import time
from contextlib import asynccontextmanager

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

BIN = os.environ["TASKBOX_BIN"]
TOOLS = {
    "run_command",
    "suspend_task",
    "resume_task",
    "fork_task",
    "checkpoint_task",
    "rewind_task",
    "list_tasks",
    "show_task",
    "read_file",
    "write_file",
}
# Every test is bounded; a hang fails instead of stalling the run.
LIMIT = 120


class Home:
    def __init__(self, path, mode):
        self.path = str(path)
        self.mode = mode
        self.env = {"TASKBOX_HOME": self.path, "TASKBOX_SERVER": mode, "RUST_LOG": "warn"}
        # Should a test be killed before it stops its server, the server does not linger: it
        # snapshots an idle sandbox after a minute and exits 10 s after that.
        with open(os.path.join(self.path, "config.toml"), "w") as f:
            f.write("[terminal]\nlifetime_seconds = 60\nserver_idle_exit_seconds = 10\n")

    def taskbox(self, *args, check=True):
        env = dict(os.environ, **self.env)
        out = subprocess.run([BIN, *args], env=env, capture_output=True, text=True, timeout=180)
        if check and out.returncode != 0:
            raise AssertionError(f"taskbox {args} failed: {out.stdout}{out.stderr}")
        return out

    def stop_server(self):
        # An auto-started server suspends its live tasks and exits.
        if self.mode != "never":
            self.taskbox("serve", "--stop", check=False)


@pytest.fixture(params=["never", "auto"])
def home(request, tmp_path):
    h = Home(tmp_path, request.param)
    yield h
    h.stop_server()


@pytest.fixture
def home_never(tmp_path):
    yield Home(tmp_path, "never")


@asynccontextmanager
async def session(home):
    params = StdioServerParameters(command=BIN, args=["mcp"], env=home.env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            yield s


def text(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def call(s, tool, **args):
    return await s.call_tool(tool, args)


async def ok(s, tool, **args):
    r = await call(s, tool, **args)
    assert not r.is_error, f"{tool} {args} failed: {text(r)}"
    return r


def run(coro_fn):
    async def bounded():
        with anyio.fail_after(LIMIT):
            await coro_fn()

    anyio.run(bounded)


def test_lists_the_tools_with_schemas_and_descriptions(home_never):
    async def go():
        async with session(home_never) as s:
            tools = (await s.list_tools()).tools
            assert {t.name for t in tools} == TOOLS
            for t in tools:
                assert t.description and "\n" not in t.description, t.name
                assert t.input_schema["type"] == "object", t.name
                if t.name != "list_tasks":
                    assert "task" in t.input_schema["required"], t.name
            run_schema = next(t for t in tools if t.name == "run_command").input_schema
            assert set(run_schema["properties"]) == {"task", "command", "timeout", "env"}
            assert set(run_schema["required"]) == {"task", "command"}

    run(go)


def test_run_suspend_and_run_again_finds_the_file(home):
    async def go():
        async with session(home) as s:
            r = await ok(s, "run_command", task="t1", command="echo hello > notes.txt; cat notes.txt")
            assert r.structured_content["exit_code"] == 0
            assert r.structured_content["stdout"] == "hello\n"
            assert "hello" in text(r)

            r = await ok(s, "suspend_task", task="t1")
            snap = r.structured_content["snapshot_id"]
            assert snap, text(r)

            r = await ok(s, "run_command", task="t1", command="cat notes.txt; exit 3")
            assert r.structured_content["exit_code"] == 3
            assert r.structured_content["stdout"] == "hello\n"
            # The agent is told the sandbox is new and where its files came from.
            assert any("recreated from snapshot" in n for n in r.structured_content["notes"]), text(r)
            assert snap in text(r)

    run(go)


def test_resume_list_show_and_the_timeline_resource(home):
    async def go():
        async with session(home) as s:
            await ok(s, "run_command", task="t2", command="true")
            await ok(s, "suspend_task", task="t2")
            r = await ok(s, "resume_task", task="t2")
            assert r.structured_content["sandbox_id"]

            r = await ok(s, "list_tasks")
            rows = r.structured_content["tasks"]
            assert [row["task"] for row in rows] == ["t2"]
            assert rows[0]["latest_snapshot"]

            r = await ok(s, "show_task", task="t2", journal=3)
            shown = r.structured_content["task"]
            assert shown["task"]["id"] == "t2"
            assert len(shown["journal"]) == 3

            resources = (await s.list_resources()).resources
            assert [str(x.uri) for x in resources] == ["taskbox://tasks/t2/timeline"]
            body = (await s.read_resource("taskbox://tasks/t2/timeline")).contents[0].text
            assert "snapshot" in body and "t2" in body, body

    run(go)


def test_fork_starts_a_new_task_from_the_files_of_another(home):
    async def go():
        async with session(home) as s:
            await ok(s, "write_file", task="p1", path="plan.txt", content="v1\n")
            r = await ok(s, "fork_task", task="p1", new_task="c1")
            assert r.structured_content["task"] == "c1" and r.structured_content["parent"] == "p1"
            r = await ok(s, "run_command", task="c1", command="cat plan.txt; echo v2 > plan.txt")
            assert r.structured_content["stdout"] == "v1\n"
            r = await ok(s, "read_file", task="p1", path="plan.txt")
            assert r.structured_content["content"] == "v1\n"
            r = await ok(s, "read_file", task="c1", path="plan.txt")
            assert r.structured_content["content"] == "v2\n"

            r = await call(s, "fork_task", task="p1", new_task="c1")
            assert r.is_error and "c1" in text(r), text(r)
            r = await call(s, "fork_task", task="nosuch", new_task="c2")
            assert r.is_error and "nosuch" in text(r), text(r)

    run(go)


def test_bad_input_is_a_tool_error_and_the_session_goes_on(home):
    async def go():
        async with session(home) as s:
            r = await call(s, "run_command", task="../etc", command="true")
            assert r.is_error
            assert "task id" in text(r) and "hint:" in text(r), text(r)
            assert r.structured_content["code"]

            r = await call(s, "suspend_task", task="nosuch")
            assert r.is_error
            assert "nosuch" in text(r), text(r)
            assert r.structured_content["code"] == "no_such_task", r.structured_content

            r = await call(s, "read_file", task="nosuch", path="a.txt")
            assert r.is_error and "nosuch" in text(r), text(r)

            r = await call(s, "run_command", task="t3")
            assert r.is_error and "command" in text(r), text(r)

            r = await call(s, "run_command", task="t3", command="true", timeout=0)
            assert r.is_error and "timeout" in text(r), text(r)

            # Still serving.
            await ok(s, "run_command", task="t3", command="true")
            assert {t.name for t in (await s.list_tools()).tools} == TOOLS

    run(go)


def test_env_reaches_the_command_as_a_secret_and_nothing_of_the_callers_does(home):
    async def go():
        home.env["MCP_CALLER_SECRET"] = "caller-Zq9x-value"
        async with session(home) as s:
            r = await ok(
                s, "run_command", task="e1", command="env",
                env={"PASSED": "passed-Zq9x-value", "OTHER": "x"},
            )
            out = text(r)
            assert "PASSED=passed-Zq9x-value" in out and "OTHER=x" in out, out
            assert "MCP_CALLER_SECRET" not in out, out
            assert "TASKBOX_HOME" not in out, out
            r = await ok(s, "show_task", task="e1")
            assert "Zq9x" not in text(r), text(r)
            assert "Zq9x" not in str(r.structured_content), r.structured_content

            r = await call(s, "run_command", task="e1", command="true",
                           env={"TASKBOX_WORKSPACE": "refused-Zq9x-value"})
            assert r.is_error and "TASKBOX_" in text(r), text(r)
            assert "Zq9x" not in text(r), text(r)

    run(go)


def test_a_hung_command_is_killed_at_its_timeout(home):
    async def go():
        async with session(home) as s:
            start = time.monotonic()
            r = await ok(s, "run_command", task="t4", command="echo started; sleep 600", timeout=2)
            took = time.monotonic() - start
            assert r.structured_content["timed_out"] is True
            assert r.structured_content["exit_code"] == 124
            assert r.structured_content["stdout"] == "started\n"
            assert any("timed out after 2 s" in n for n in r.structured_content["notes"])
            assert took < 30, took
            # The sandbox is still there for the next command.
            r = await ok(s, "run_command", task="t4", command="echo again")
            assert r.structured_content["stdout"] == "again\n"

    run(go)


def test_a_cancelled_call_stops_its_command(home):
    async def go():
        async with session(home) as s:
            await ok(s, "run_command", task="t7", command="true")
            start = time.monotonic()
            # The SDK sends `notifications/cancelled` for a call its caller gave up on.
            with anyio.move_on_after(2):
                await call(
                    s,
                    "run_command",
                    task="t7",
                    command="trap 'echo term > got.txt; exit 0' TERM; sleep 600 & wait",
                )
            # A task runs one command at a time: this one waits for the cancelled one to end.
            r = await ok(s, "run_command", task="t7", command="cat got.txt")
            assert r.structured_content["stdout"] == "term\n", text(r)
            assert time.monotonic() - start < 60

    run(go)


def test_read_and_write_files_within_the_workspace(home):
    async def go():
        async with session(home) as s:
            r = await ok(s, "write_file", task="t5", path="src/deep/a.txt", content="héllo\nwörld\n")
            assert r.structured_content["size"] == len("héllo\nwörld\n".encode())
            r = await ok(s, "run_command", task="t5", command="cat src/deep/a.txt; pwd -P")
            assert r.structured_content["stdout"].startswith("héllo\nwörld\n")
            root = r.structured_content["stdout"].splitlines()[-1]

            r = await ok(s, "read_file", task="t5", path="src/deep/a.txt")
            assert r.structured_content["content"] == "héllo\nwörld\n"
            assert r.structured_content["next_offset"] is None
            # Absolute inside the workspace is the same file.
            r = await ok(s, "read_file", task="t5", path=root + "/src/./deep/a.txt")
            assert r.structured_content["content"] == "héllo\nwörld\n"

            # Relative to the workspace root, not to where the last command cd'ed.
            await ok(s, "run_command", task="t5", command="cd src")
            r = await ok(s, "read_file", task="t5", path="src/deep/a.txt")
            assert r.structured_content["content"].startswith("héllo")
            await ok(s, "run_command", task="t5", command="cd ..")

            # Replacing keeps the mode.
            await ok(s, "run_command", task="t5", command="printf '#!/bin/sh\\necho 1\\n' > run.sh; chmod 755 run.sh")
            await ok(s, "write_file", task="t5", path="run.sh", content="#!/bin/sh\necho 2\n")
            r = await ok(s, "run_command", task="t5", command="./run.sh; stat -c %a run.sh")
            assert r.structured_content["stdout"] == "2\n755\n"

            # A large file is read in parts; a multi-byte character is never split.
            await ok(s, "run_command", task="t5", command="for i in $(seq 1 30000); do printf 'é'; done > big.txt")
            got, offset, size = "", 0, None
            while offset is not None:
                r = await ok(s, "read_file", task="t5", path="big.txt", offset=offset)
                got += r.structured_content["content"]
                size = r.structured_content["size"]
                offset = r.structured_content["next_offset"]
            assert size == 60000 and got == "é" * 30000

            # Bytes that are not text travel as base64, both ways.
            raw = bytes(range(256))
            await ok(s, "write_file", task="t5", path="bin.dat", content=base64.b64encode(raw).decode(), encoding="base64")
            r = await ok(s, "read_file", task="t5", path="bin.dat")
            assert r.structured_content["encoding"] == "base64"
            assert base64.b64decode(r.structured_content["content"]) == raw

    run(go)


def test_file_paths_cannot_leave_the_workspace_or_go_through_symlinks(home, tmp_path):
    # A file of the host's, outside the workspace: not even in the sandbox (an isolated local
    # sandbox, taskbox's default, shows only its workspace of the host's files).
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("secret\n")

    async def go():
        async with session(home) as s:
            await ok(s, "write_file", task="t6", path="in.txt", content="inside\n")
            # Links out of the workspace to what the sandbox does have (its read-only system),
            # and one to the host's file.
            await ok(
                s,
                "run_command",
                task="t6",
                command=f"ln -s /etc/passwd out-link; ln -s /etc out-dir; ln -s {secret} host-link; "
                "ln -s in.txt in-link; mkdir d",
            )

            async def refused(tool, path, *needles, **more):
                r = await call(s, tool, task="t6", path=path, **more)
                assert r.is_error, f"{tool} {path} was not refused: {text(r)}"
                assert any(n in text(r) for n in needles), text(r)

            await refused("read_file", "../x", "out of")
            await refused("read_file", "d/../../x", "out of")
            await refused("read_file", str(secret), "outside")
            await refused("read_file", "out-link", "outside")
            await refused("read_file", "out-dir/passwd", "outside")
            # Dangling where the host's file is not there at all (isolated), else outside.
            await refused("read_file", "host-link", "no such file", "outside")
            await refused("read_file", "d", "directory")
            await refused("read_file", "missing.txt", "no such file")
            await refused("write_file", "../x", "out of", content="x")
            await refused("write_file", str(outside / "new.txt"), "outside", content="x")
            await refused("write_file", "out-link", "symlink", content="x")
            await refused("write_file", "host-link", "symlink", content="x")
            await refused("write_file", "out-dir/new.txt", "symlink", content="x")
            await refused("write_file", "in-link", "symlink", content="x")
            await refused("write_file", "d", "directory", content="x")
            await refused("write_file", "in.txt/x", "not a directory", content="x")

            # A symlink that stays inside is read through; the user's symlinks are kept.
            r = await ok(s, "read_file", task="t6", path="in-link")
            assert r.structured_content["content"] == "inside\n"
            r = await ok(s, "run_command", task="t6", command="readlink out-link host-link in-link; ls out-dir/passwd")
            assert r.structured_content["stdout"] == f"/etc/passwd\n{secret}\nin.txt\nout-dir/passwd\n"

        assert secret.read_text() == "secret\n"
        assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]

    run(go)


def test_http_needs_a_token_and_serves_with_one(home_never, tmp_path):
    env = dict(os.environ, **home_never.env)
    out = subprocess.run([BIN, "mcp", "--http", "127.0.0.1:0"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 125, out
    assert "bearer token" in out.stderr, out.stderr

    token_file = tmp_path / "token"
    token_file.write_text("  \n")
    out = subprocess.run(
        [BIN, "mcp", "--http", "127.0.0.1:0", "--token-file", str(token_file)],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 125 and "empty" in out.stderr, out

    token = "t0k3n-" + "x" * 32
    token_file.write_text(token + "\n")
    proc = subprocess.Popen(
        [BIN, "mcp", "--http", "127.0.0.1:0", "--token-file", str(token_file)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        m = re.search(r"at (http://\S+/mcp)", line)
        assert m, line
        url = m.group(1)

        r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=10)
        assert r.status_code == 401, r
        assert token not in r.text
        r = httpx2.post(url, json={}, headers={"Authorization": "Bearer wrong"}, timeout=10)
        assert r.status_code == 401, r

        async def go():
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
            async with client, streamable_http_client(url, http_client=client) as (read, write, *_):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    assert {t.name for t in (await s.list_tools()).tools} == TOOLS
                    r = await ok(s, "run_command", task="h1", command="echo over http > f; cat f")
                    assert r.structured_content["stdout"] == "over http\n"
                    r = await call(s, "show_task", task="no-such")
                    assert r.is_error

        run(go)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()
