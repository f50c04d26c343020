"""Who holds LMDB's write lock on a store, and whether it is stuck there.

A process stopped inside a commit (SIGSTOP, a debugger) holds LMDB's writer mutex, and every
other process that opens the store for writing would wait for it. ``Store`` asks ``stuck_writer``
first and opens read-only instead (docs/security.md); the mutex is read from ``lock.mdb`` on
Linux with glibc only (elsewhere: unknown, and opens wait as LMDB's writers do).
"""
from __future__ import annotations

import os
import platform
import sys
import threading
import time

WRITE_LOCK_POLL = 0.02               # seconds between looks at a write lock held elsewhere
STUCK_WRITER_AFTER = 2.0             # seconds one commit may hold the lock before open stops waiting
_LOCK_MAGIC = 0xBEEFC0DE             # LMDB's lock.mdb magic (MDB_MAGIC)
_WMUTEX_OFFSET = 64                  # LMDB's writer mutex in lock.mdb
_TXNID_OFFSET = 48                   # LMDB's last committed txnid in lock.mdb
_FUTEX_TID_MASK = 0x3FFFFFFF


class LockFile:
    """``lock.mdb`` of a store this process has open, read through one descriptor kept until
    ``close`` (after the environment's). LMDB holds an fcntl lock on lock.mdb for as long as
    its environment is open: a process opening the store that finds no such lock takes itself
    for the only user and resets the reader table and the writer mutex. POSIX drops every
    fcntl lock a process holds on a file when it closes *any* descriptor of that file, so
    reading lock.mdb through a file opened and closed again would let the next process to
    open the store reset both under this one."""

    def __init__(self, path: str) -> None:
        self.path = os.path.join(path, "lock.mdb")
        self._fd: int | None = None
        self._lock = threading.Lock()

    def head(self, size: int) -> bytes | None:
        """The first ``size`` bytes of lock.mdb, or None when it cannot be read."""
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                return os.pread(self._fd, size, 0)
            except OSError:
                return None

    def close(self) -> None:
        """Once the store's environment is closed (closing this drops its fcntl locks)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _head(path: str, size: int) -> bytes | None:
    """The first ``size`` bytes of ``path``/lock.mdb, through a file opened for this read:
    only for a store this process does not have open (``LockFile`` otherwise)."""
    try:
        with open(os.path.join(path, "lock.mdb"), "rb") as f:
            return f.read(size)
    except OSError:
        return None


def write_lock(path: str, lock_file: LockFile | None = None) -> tuple[int, int, bool] | None:
    """(holder pid, LMDB's last committed txnid, whether the holder is stopped) while a live
    process holds the store's write lock; else None. ``lock_file``: the store's, when this
    process has it open (see ``LockFile``).

    LMDB keeps its writer mutex in ``lock.mdb``: a process-shared robust pthread mutex at
    offset 64 (the second 64-byte cache line, after the reader mutex, the last txnid at offset
    48 and the reader count), whose first word glibc sets to the owning thread's id. That
    layout is read only on Linux with glibc, after checking the file's magic number."""
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    head = (lock_file.head(_WMUTEX_OFFSET + 4) if lock_file is not None
            else _head(path, _WMUTEX_OFFSET + 4))
    if head is None:
        return None
    if len(head) < _WMUTEX_OFFSET + 4 or int.from_bytes(head[:4], sys.byteorder) != _LOCK_MAGIC:
        return None
    tid = int.from_bytes(head[_WMUTEX_OFFSET:_WMUTEX_OFFSET + 4], sys.byteorder) & _FUTEX_TID_MASK
    if tid == 0:
        return None
    txnid = int.from_bytes(head[_TXNID_OFFSET:_TXNID_OFFSET + 8], sys.byteorder)
    try:
        with open(f"/proc/{tid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        pid, state = int(fields["Tgid"]), fields["State"].split()[0]
    except (OSError, KeyError, ValueError, IndexError):
        return None              # its holder died: the next writer recovers the lock
    return pid, txnid, state in ("T", "t")


def stopped_writer(path: str, lock_file: LockFile | None = None) -> int | None:
    """The pid of a process stopped while it holds the store's write lock, now (no waiting)."""
    lock = write_lock(path, lock_file)
    return lock[0] if lock is not None and lock[2] else None


def stuck_writer(path: str) -> int | None:
    """The pid of a process stuck inside a commit: stopped (SIGSTOP, a debugger), or holding
    LMDB's write lock for ``STUCK_WRITER_AFTER`` seconds while no commit ends. None when
    the lock is free or commits go on (this open then waits its turn, as writers do)."""
    deadline = time.monotonic() + STUCK_WRITER_AFTER
    first = None
    while (lock := write_lock(path)) is not None:
        pid, txnid, stopped = lock
        if stopped:
            return pid
        if first is None:
            first = txnid
        elif txnid != first:
            return None
        if time.monotonic() >= deadline:
            return pid
        time.sleep(WRITE_LOCK_POLL)
    return None
