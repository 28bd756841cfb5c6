"""Hermes task ids → taskbox task ids.

taskbox accepts 1 to 64 characters of ``[A-Za-z0-9_-]`` starting with a letter or digit
(``crates/taskbox-core/src/ids.rs``: task ids become directory and sandbox names). Hermes's task
ids are free-form (``default``, session ids, ids an RL harness or a gateway makes up). An id
taskbox accepts is used as it is, so ``taskbox show <id>`` finds the task Hermes named; any other
id is *mapped*, never refused: its safe characters are kept as a readable prefix and a digest of
the whole id is appended, so the mapping is deterministic (the same Hermes id always reaches the
same task, in every process) and two different ids do not share a task.

Hermes's ``"default"`` is not a task but "nothing distinguishes this environment" (every CLI
session, every project): :func:`shared_task_id` derives the task from the Hermes session, else
the project directory.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Optional

#: The longest task id taskbox accepts (``MAX_TASK_ID_LEN``).
MAX_TASK_ID_LEN = 64

_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_-]+")
# 16 hex digits (64 bits) of SHA-256: a collision between two Hermes ids is not a practical concern.
_DIGEST_LEN = 16


def is_valid_task_id(task_id: str) -> bool:
    """Whether taskbox accepts ``task_id`` as it is."""
    return (
        isinstance(task_id, str)
        and 0 < len(task_id) <= MAX_TASK_ID_LEN
        and task_id.isascii()
        and _VALID.fullmatch(task_id) is not None
    )


def taskbox_task_id(hermes_task_id: object) -> str:
    """The taskbox task for a Hermes task id (see the module's doc)."""
    raw = hermes_task_id if isinstance(hermes_task_id, str) else str(hermes_task_id)
    if is_valid_task_id(raw):
        return raw
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_LEN]
    prefix = _UNSAFE_RUN.sub("-", raw).lstrip("-_")
    prefix = prefix[: MAX_TASK_ID_LEN - 1 - _DIGEST_LEN].rstrip("-_")
    return f"{prefix or 'hermes'}-{digest}"


#: The task id Hermes gives every environment it does not key by task or session
#: (``tools/terminal_tool.py`` ``_resolve_container_task_id``: the CLI, cron, persistent mode).
HERMES_SHARED_TASK_ID = "default"


def shared_task_id(session_id: Optional[str], project_dir: Optional[str]) -> str:
    """The taskbox task for Hermes's shared ``"default"`` environment: one per Hermes session
    (``session-<id>``) when there is a session id, else one per project directory
    (``project-<dir name>-<digest of the whole path>``), so two sessions or two projects never
    share files by accident. Both are valid taskbox ids (mapped as :func:`taskbox_task_id`
    maps any other)."""
    if session_id and session_id.strip() and session_id.strip() != HERMES_SHARED_TASK_ID:
        return taskbox_task_id(f"session-{session_id.strip()}")
    path = os.path.realpath(project_dir or os.getcwd())
    digest = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_LEN]
    name = _UNSAFE_RUN.sub("-", os.path.basename(path.rstrip("/")) or "root").strip("-_")
    name = name[: MAX_TASK_ID_LEN - len("project--") - _DIGEST_LEN].rstrip("-_")
    return f"project-{name}-{digest}" if name else f"project-{digest}"
