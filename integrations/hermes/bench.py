"""Added latency per command: Hermes's real ``BaseEnvironment.execute()`` through the taskbox
environment against Hermes's own ``LocalEnvironment``, in the same run.

    python integrations/hermes/bench.py --taskbox target/release/taskbox [--rounds 200]

Both environments run the same command through the same ``execute()`` (Hermes's session snapshot,
cd, cwd markers, poll loop); rounds are interleaved, alternating which goes first, so a
neighbour's load slows both alike. Prints the medians, the difference (the latency taskbox adds,
with persistence), and the load average before and after. Uses a throwaway TASKBOX_HOME and
HERMES_HOME and stops the server it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def fsync_ms(directory: str, n: int = 20) -> float:
    """The median time of a small write's fsync in ``directory`` (taskbox's journal commits wait
    for one each; a command makes two)."""
    path = os.path.join(directory, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    times = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 128)
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--taskbox", required=True, help="the taskbox binary (a release build)")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--command", default="echo ok")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--poll-wait", type=float, default=None,
                    help="override the handle's wait inside poll() (seconds; 0 answers at once, "
                    "as Hermes's own handles do)")
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="hermes-taskbox-bench-")
    os.environ["TASKBOX_HOME"] = os.path.join(tmp, "taskbox")
    os.environ["HERMES_HOME"] = os.path.join(tmp, "hermes")
    os.environ["TASKBOX_BIN"] = os.path.abspath(args.taskbox)
    os.environ.pop("TASKBOX_DATA_DIR", None)
    workdir = os.path.join(tmp, "local-cwd")
    os.makedirs(workdir)

    from tools.environments.local import LocalEnvironment  # type: ignore

    from hermes_taskbox import TaskboxProvider
    from hermes_taskbox import environment as taskbox_environment

    if args.poll_wait is not None:
        taskbox_environment.POLL_WAIT_SECS = args.poll_wait

    fsync_before = fsync_ms(tmp)
    load_before = os.getloadavg()
    local = LocalEnvironment(cwd=workdir, timeout=60)
    taskbox = TaskboxProvider(config={}).create_environment(cwd="", timeout=60, task_id="bench")
    times = {"local": [], "taskbox": []}
    envs = {"local": local, "taskbox": taskbox}
    started = time.monotonic()
    try:
        for i in range(args.warmup + args.rounds):
            order = ("local", "taskbox") if i % 2 == 0 else ("taskbox", "local")
            for name in order:
                t0 = time.perf_counter()
                result = envs[name].execute(args.command)
                elapsed = time.perf_counter() - t0
                if result.get("returncode") != 0:
                    print(f"{name}: {result}", file=sys.stderr)
                    return 1
                if i >= args.warmup:
                    times[name].append(elapsed * 1000)
    finally:
        wall = time.monotonic() - started
        load_after = os.getloadavg()
        fsync_after = fsync_ms(tmp)
        taskbox.cleanup()
        local.cleanup()
        subprocess.run([os.environ["TASKBOX_BIN"], "serve", "--stop"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()}
    figures = {
        "command": args.command,
        "poll_wait_s": taskbox_environment.POLL_WAIT_SECS,
        "rounds": args.rounds,
        "local_median_ms": round(med["local"], 2),
        "taskbox_median_ms": round(med["taskbox"], 2),
        "added_ms": round(med["taskbox"] - med["local"], 2),
        "local_p90_ms": round(p90["local"], 2),
        "taskbox_p90_ms": round(p90["taskbox"], 2),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in load_after],
        "wall_s": round(wall, 1),
        "fsync_ms": [round(fsync_before, 2), round(fsync_after, 2)],
    }
    if args.json:
        print(json.dumps(figures))
    else:
        print(
            f"{args.rounds} interleaved rounds of `{args.command}` through Hermes's execute():\n"
            f"  Hermes LocalEnvironment  median {figures['local_median_ms']} ms (p90 {figures['local_p90_ms']})\n"
            f"  taskbox environment      median {figures['taskbox_median_ms']} ms (p90 {figures['taskbox_p90_ms']})\n"
            f"  added by taskbox         {figures['added_ms']:+} ms\n"
            f"  load {figures['load_before'][0]} -> {figures['load_after'][0]}, {figures['wall_s']} s, "
            f"fsync {figures['fsync_ms'][0]} / {figures['fsync_ms'][1]} ms (before / after)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
