"""This process's id, without a system call per look: ``os.getpid()`` is one (the C library no
longer caches it), and a store looks on every read and write, to refuse a forked child the
environment of its parent (``Store.check_usable``)."""
from __future__ import annotations

import os

_pid = os.getpid()


def this_pid() -> int:
    """``os.getpid()``, kept current by a hook that runs in a forked child."""
    return _pid


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)
