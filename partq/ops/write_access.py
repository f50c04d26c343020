"""Whether this process may write a partq directory, asked before anything is opened: a command
that only reads opens a store it may not write read-only (``partq.ops.read_only``), and one that
writes is refused at once with the reason."""
from __future__ import annotations

import os

READ_ONLY_ENV = "PARTQ_READ_ONLY"


def read_only_reason(path: str) -> str | None:
    """Why this process must open ``path`` read-only (it may not write the directory, its
    ``data.mdb`` or its ``lock.mdb``, or ``$PARTQ_READ_ONLY`` is set), or None when it may
    write. A missing directory is not a reason: opening it says what is wrong."""
    if os.environ.get(READ_ONLY_ENV, "").strip().lower() not in ("", "0", "no", "false", "off"):
        return f"${READ_ONLY_ENV} is set"
    if not os.path.isdir(path):
        return None
    if not os.access(path, os.W_OK | os.X_OK):
        return f"this user may not write {path}"
    for name in ("data.mdb", "lock.mdb"):
        file = os.path.join(path, name)
        if os.path.exists(file) and not os.access(file, os.R_OK | os.W_OK):
            return f"this user may not write {file}"
    return None
