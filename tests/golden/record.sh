#!/usr/bin/env bash
# Records the golden journals in this directory from real runs of the `taskbox` binary on the
# local backend (real bash processes, real snapshot archives, real SQLite), each scenario in a
# fresh TASKBOX_HOME, then exports them with `taskbox export`.
#
#   tests/golden/record.sh [path/to/taskbox]      (default: target/debug/taskbox)
#
# Re-record after a deliberate change to the core's decisions; `taskbox replay --journal` on the
# old goldens shows exactly which decisions changed. Takes about 15 s (it waits for deadlines).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../../target/debug/taskbox}"
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
work="$(mktemp -d)"
fake_pid=""
trap 'if [ -n "$fake_pid" ]; then kill "$fake_pid" 2>/dev/null || true; fi; rm -rf "$work"' EXIT

home() { export TASKBOX_HOME="$work/$1"; mkdir -p "$TASKBOX_HOME"; }
# One-shot engines, as the scenarios are written for: nothing runs between two commands, so a
# deadline passes while the agent is away (an always-on server would checkpoint in time).
export TASKBOX_SERVER=never
tb() { "$bin" "$@"; }
# Commands that are expected to fail (a sandbox expiring under them) must not stop the script.
tb_may_fail() { "$bin" "$@" || echo "  (exit $? as expected)"; }
export_to() { tb export --all --out "$here/$1.jsonl"; }

echo "== session: the issue's session (create, reuse, suspend, restore)"
home session
tb run --task demo -- bash -c 'echo hello > notes.txt; pwd'
tb run --task demo -- cat notes.txt
tb suspend demo
tb run --task demo -- 'export API_TOKEN=s3cr3tValue99; cat notes.txt'
export_to session

echo "== expiry: the sandbox passes its deadline while the agent is away; on the local backend"
echo "   its files are still there, so a late checkpoint keeps them before the restore"
home expiry
tb config set terminal.sandbox_timeout_seconds 2
tb config set terminal.max_sandbox_lifetime_seconds 2
tb config set terminal.checkpoint_margin_seconds 1
tb run -t expiry -- 'echo kept > f.txt'
tb suspend expiry
tb run -t expiry -- 'cat f.txt; echo later > g.txt'
sleep 3
tb run -t expiry -- 'cat f.txt g.txt'
tb run -t expiry -- 'cat f.txt'
export_to expiry

echo "== deadline: a command outlives the sandbox's last possible deadline (timers in-process)"
home deadline
tb config set terminal.sandbox_timeout_seconds 2
tb config set terminal.max_sandbox_lifetime_seconds 2
tb config set terminal.checkpoint_margin_seconds 1
tb run -t deadline -- 'echo before > f.txt'
tb_may_fail run -t deadline -- 'sleep 4'
tb_may_fail run -t deadline -- 'cat f.txt'
export_to deadline

echo "== extend: a long command gets its sandbox's timeout extended twice"
home extend
tb config set terminal.sandbox_timeout_seconds 2
tb config set terminal.max_sandbox_lifetime_seconds 10
tb config set terminal.checkpoint_margin_seconds 1
tb run -t extend -- 'sleep 3.5; echo done'
export_to extend

echo "== gone: the snapshot vanishes behind taskbox's back; the restore falls back to a fresh sandbox"
home gone
tb config set terminal.keep_snapshots 1
tb run -t gone -- 'echo one > f.txt'
tb suspend gone
tb run -t gone -- 'echo two >> f.txt'
tb suspend gone
rm -f "$TASKBOX_HOME/data/local/snapshots/gone/"*.tbx
tb run -t gone -- 'ls'
export_to gone

echo "== crash: taskbox is killed (SIGKILL) while a command runs; the next process recovers"
home crash
tb run -t crash -- 'echo before > f.txt'
"$bin" run -t crash -- 'sleep 3' &
pid=$!
# Kill it once the command is journaled as running (`taskbox show` takes no lock), and has had
# a moment to start.
for _ in $(seq 100); do
  tb show crash --json | grep -q '"command": "sleep 3"' && break
  sleep 0.05
done
sleep 0.3
kill -9 "$pid"
wait "$pid" || true
tb run -t crash -- 'cat f.txt'
export_to crash

echo "== several: two tasks, one not persistent, and a settings change in between"
home several
tb run -t alpha -- 'echo a > a.txt'
tb config set terminal.container_persistent false
tb run -t beta -- 'echo b > b.txt'
tb suspend beta
tb run -t beta -- 'ls'
tb config set terminal.container_persistent true
tb run -t alpha -- 'cat a.txt'
tb suspend alpha
export_to several

echo "== vercel: the session on the Vercel backend, against \`taskbox fake-vercel\` on loopback"
echo "   (the fake answers the first two API requests with 429 Retry-After: 1)"
home vercel
"$bin" fake-vercel --listen 127.0.0.1:0 --fault-rate-limit 2:1 >"$work/fake-url" 2>/dev/null &
fake_pid=$!
for _ in $(seq 100); do
  [ -s "$work/fake-url" ] && break
  sleep 0.05
done
tb config set terminal.backend vercel_sandbox
tb config set terminal.container_memory 2048
tb config set terminal.vercel_api_url "$(head -1 "$work/fake-url")"
VERCEL_TOKEN=tok VERCEL_TEAM_ID=team_t VERCEL_PROJECT_ID=prj_t bash -c '
  set -e
  "$0" run -t vdemo -- "echo hello > notes.txt"
  "$0" run -t vdemo -- cat notes.txt
  "$0" suspend vdemo
  "$0" run -t vdemo -- cat notes.txt
' "$bin"
kill "$fake_pid"
fake_pid=""
export_to vercel

echo "== fork: a live task forked (snapshotted first) and an older snapshot forked; each fork"
echo "   restores into a sandbox of its own; with one snapshot kept, the parent's retention"
echo "   releases the shared snapshot and the fork, its last holder, deletes it"
home fork
tb config set terminal.keep_snapshots 1
tb run -t demo -- 'echo one > f.txt'
tb fork demo demo-alt
tb run -t demo-alt -- 'cat f.txt; echo two > f.txt'
tb run -t demo -- 'echo three > f.txt'
tb suspend demo
tb fork demo demo-new --snapshot demo.s2
tb run -t demo-new -- 'cat f.txt'
tb suspend demo-alt
tb run -t demo-alt -- 'cat f.txt'
export_to fork

echo "recorded:"
for f in "$here"/*.jsonl; do echo "  $(basename "$f"): $(($(wc -l <"$f") - 1)) entries"; done
