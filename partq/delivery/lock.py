"""Who runs something for a directory: one process at a time, recorded in a lock file that says
who. ``DIR/delivery-locks/<qid>.lock`` says who runs a queue's delivery; ``DIR/standby.lock``
who follows a primary (``partq standby``).

A lock file is held with ``flock`` (released by the kernel when the holder dies, so a SIGKILLed
holder never blocks its successor) and carries "pid P on HOST since T". It is opened with
``O_NOFOLLOW`` (a planted symbolic link is refused, never followed and truncated), created
readable by its owner only, and refused when another user owns it (``UnsafeDirectory``).

A delivery lock is also a lease: its holder touches the file (``touch``) several times a second,
so its modification time is the holder's heartbeat. A holder that is stopped (SIGSTOP, a
debugger, a frozen job) keeps its flock but stops beating; once the beat is older than the
queue's ``consumer_timeout`` another process may take the lock (``take_expired``): it removes
the file, under a second lock so that only one process does, and locks a new file at the same
path. The stopped holder keeps a lock on a file nobody finds any more; what it writes for the
queue is refused by the owner check in the store (``partq.delivery.owner``).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import socket
import time

from partq.errors import DeliveryLocked, LockHeld, PartqError, UnsafeDirectory

log = logging.getLogger("partq.delivery")

LOCK_DIR = "delivery-locks"
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class OwnerLock:
    """An exclusive, non-blocking lock on ``path`` stamped with who holds it."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            fd = os.open(path, _OPEN_FLAGS, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PartqError(f"{path} is a symbolic link; partq does not follow links for "
                                 f"its lock files: remove it") from None
            raise
        try:
            owner = os.fstat(fd).st_uid
            if owner != os.geteuid():
                os.close(fd)
                raise UnsafeDirectory(
                    f"the lock file {path} belongs to uid {owner}, not to this user (uid "
                    f"{os.geteuid()}): another user made it while its folder was writable by "
                    f"others, and could hold it for ever; stop that user's process, remove "
                    f"{path}, and keep {os.path.dirname(path)} writable by its owner only "
                    f"(chmod 700)")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if inode_of(path) != os.fstat(fd).st_ino:
                # a successor removed this file (its holder's lease ran out: ``take_expired``)
                # between the open and the lock, and that holder has just let go: the lock is
                # the file the path names now, not this one
                raise BlockingIOError
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(holder(path) or "another process") from None
        stamp = f"pid {os.getpid()} on {socket.gethostname()} since " \
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, stamp.encode(), 0)
        except OSError as exc:      # a full disk: the flock is the lock, the stamp only says who
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                os.close(fd)
                raise
        self._fd: int | None = fd
        self._pid = os.getpid()

    def touch(self) -> None:
        """Beat: set the file's modification time to now (the lease's heartbeat)."""
        fd = self._fd
        if fd is not None:
            try:
                os.utime(fd)
            except OSError:
                pass            # a full or read-only disk: the beat is late, the lock holds

    def release(self) -> None:
        """Release the lock. In a forked child only its copy of the descriptor is closed: the
        flock belongs to the open file description it shares with the parent, so unlocking
        here would release the parent's lock."""
        if self._fd is None:
            return
        if self._pid == os.getpid():
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


class DeliveryLock(OwnerLock):
    """The delivery lock of one queue (its queue id names the file). ``lease``: seconds after
    which a holder that stopped beating loses it (``take_expired``); None never."""

    def __init__(self, store_path: str, qid: int, queue: str, lease: float | None = None) -> None:
        path = lock_path(store_path, qid)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        try:
            super().__init__(path)
        except LockHeld as exc:
            if lease is None or not take_expired(path, lease):
                raise DeliveryLocked(
                    f"queue {queue!r} is delivered by {exc.holder}; bind in that process, or "
                    f"close its broker first") from None
            try:
                super().__init__(path)
            except LockHeld as again:       # another process took it first
                raise DeliveryLocked(f"queue {queue!r} is delivered by {again.holder}") from None


MIN_LEASE = 1.0     # seconds: a delivery lock's lease is at least this (it beats 4 times a second)


def lease_for(consumer_timeout: float) -> float:
    """How long a delivery owner may be silent before another process takes its lock."""
    return max(consumer_timeout, MIN_LEASE)


def lock_path(store_path: str, qid: int) -> str:
    return os.path.join(store_path, LOCK_DIR, f"{qid}.lock")


def beat_age(path: str) -> float | None:
    """Seconds since the holder of the lock at ``path`` last beat (None: no such file)."""
    try:
        return max(0.0, time.time() - os.stat(path).st_mtime)
    except FileNotFoundError:
        return None


def take_expired(path: str, lease: float) -> bool:
    """Remove the lock file at ``path`` when its holder has not beaten for ``lease`` seconds,
    so that a new lock can be taken there; whether it did (or the file was gone). Under
    ``path + ".break"``'s lock: two processes never both remove a lock, and never a fresh one."""
    fd = os.open(path + ".break", _OPEN_FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            age = beat_age(path)
            if age is None or holder(path) is None:
                return True             # gone or released meanwhile: lock it as usual
            if age <= lease:
                return False
            log.warning("the delivery lock %s was last renewed %.1f s ago (lease %g s) by %s: "
                        "taking it over", path, age, lease, holder(path))
            os.unlink(path)
        return True
    finally:
        os.close(fd)         # releases the break lock


def inode_of(path: str) -> int | None:
    """The inode ``path`` names now (None: no such file)."""
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def holder(path: str) -> str | None:
    """The text of a held lock, or None when nobody holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, OSError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace") or "another process"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def queue_holder(store_path: str, qid: int) -> str | None:
    return holder(lock_path(store_path, qid))
