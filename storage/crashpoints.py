"""Deterministic crash points, SQLite-style, for crash-recovery tests.

``PARTQ_CRASH_AT=name:N`` (several separated by commas) makes the process SIGKILL itself the
N-th time it passes the named point. Unset (always, outside tests), ``hit`` is never called:
callers test the module-level ``ENABLED`` flag first, so the cost is one attribute read.
A fork server whose children arm themselves after the import calls ``arm`` in the child;
``passes`` tells how often each point was passed.

Points: before_commit, after_commit_before_return, mid_batch, at_ack, during_truncation,
during_scaling, during_handoff, after_cutover, in_transaction (a transaction's write, between
its acks and its publishes).
"""
from __future__ import annotations

import os
import signal
import threading

POINTS = ("before_commit", "after_commit_before_return", "mid_batch", "at_ack",
          "during_truncation", "during_scaling", "during_handoff", "after_cutover",
          "in_transaction")


def _parse(spec: str) -> dict[str, int]:
    targets: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, n = part.partition(":")
        if name not in POINTS or not n.isdigit() or int(n) < 1:
            raise ValueError(f"PARTQ_CRASH_AT entry {part!r} must be NAME:N with N >= 1 and NAME one "
                             f"of {', '.join(POINTS)}")
        targets[name] = int(n)
    return targets


_targets = _parse(os.environ.get("PARTQ_CRASH_AT", ""))
_passes: dict[str, int] = {}
_lock = threading.Lock()
ENABLED = bool(_targets)


def arm(spec: str) -> None:
    """Arm the points of ``spec`` (``PARTQ_CRASH_AT``'s format; ``""`` disarms every point) and
    count passes afresh, as if this process had started with ``PARTQ_CRASH_AT=spec``."""
    global _targets, ENABLED
    targets = _parse(spec)
    with _lock:
        _targets = targets
        _passes.clear()
    ENABLED = bool(targets)


def passes() -> dict[str, int]:
    """How many times each point was passed since the import or the last ``arm``."""
    with _lock:
        return dict(_passes)


def hit(name: str) -> None:
    """Count a pass of point ``name``; die by SIGKILL on the configured pass."""
    with _lock:
        n = _passes[name] = _passes.get(name, 0) + 1
    if _targets.get(name) == n:
        os.kill(os.getpid(), signal.SIGKILL)
