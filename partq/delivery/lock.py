"""Who runs something for a directory: one process at a time, recorded in a lock file that says
who. ``DIR/delivery-locks/<qid>.lock`` says who runs a queue's delivery; ``DIR/standby.lock``
who follows a primary (``partq standby``).

A lock file is held with ``flock`` (released by the kernel when the holder dies, so a SIGKILLed
holder never blocks its successor) and carries "pid P on HOST since T". It is opened with
``O_NOFOLLOW`` (a planted symbolic link is refused, never followed and truncated) and created
readable by its owner only.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from partq.errors import DeliveryLocked, LockHeld, PartqError

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
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
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
    """The delivery lock of one queue (its queue id names the file)."""

    def __init__(self, store_path: str, qid: int, queue: str) -> None:
        directory = os.path.join(store_path, LOCK_DIR)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        try:
            super().__init__(os.path.join(directory, f"{qid}.lock"))
        except LockHeld as exc:
            raise DeliveryLocked(
                f"queue {queue!r} is delivered by {exc.holder}; bind in that process, or close "
                f"its broker first") from None


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
    return holder(os.path.join(store_path, LOCK_DIR, f"{qid}.lock"))
