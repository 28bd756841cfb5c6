"""One Hermes process driven the way its agent loop drives tools (used by test_real_hermes.py).

``python hermes_driver.py STEPS_JSON``: runs each step, in order, in this process, and prints one
JSON list with each step's answer. Steps:

- ``{"session": ID}``: the Hermes session this process serves from now on (``HERMES_SESSION_ID``,
  as ``AIAgent`` sets it), or ``null`` for none;
- ``{"terminal": COMMAND, "task_id": ID}``: the model's terminal tool call, through Hermes's real
  tool dispatcher (``model_tools.handle_function_call``); the answer is the tool's JSON result;
- ``{"cleanup_vm": ID}``: ``cleanup_vm(ID)``, as ``AIAgent.close()`` does with its session id;
- ``{"cleanup_all": true}``: ``cleanup_all_environments()``, as Hermes does when it exits;
- ``{"reap": true}``: Hermes's idle reaper, as if every environment had been idle too long.

Everything else comes from the environment: ``HERMES_HOME`` (its config.yaml), ``TASKBOX_BIN``,
``TASKBOX_HOME``.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    steps = json.loads(sys.argv[1])
    import model_tools
    from tools.terminal_tool_lifecycle import cleanup_all_environments, cleanup_vm

    answers = []
    for step in steps:
        if "session" in step:
            if step["session"] is None:
                os.environ.pop("HERMES_SESSION_ID", None)
            else:
                os.environ["HERMES_SESSION_ID"] = step["session"]
            answers.append(None)
        elif "terminal" in step:
            raw = model_tools.handle_function_call(
                "terminal", {"command": step["terminal"]}, task_id=step.get("task_id")
            )
            answers.append(json.loads(raw))
        elif "cleanup_vm" in step:
            answers.append(cleanup_vm(step["cleanup_vm"]))
        elif "cleanup_all" in step:
            answers.append(cleanup_all_environments())
        elif "reap" in step:
            from tools.terminal_tool_lifecycle import _cleanup_inactive_envs

            answers.append(_cleanup_inactive_envs(lifetime_seconds=-1))
        else:
            raise SystemExit(f"unknown step {step!r}")
    # Hermes may print its own lines: the answers are the one line with this prefix.
    print("HERMES-DRIVER " + json.dumps(answers), flush=True)


if __name__ == "__main__":
    main()
