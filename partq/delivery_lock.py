"""Who runs delivery for a queue: one process at a time, recorded in a lock file that says who.

``DIR/delivery-locks/<qid>.lock`` is held with ``flock`` (released by the kernel when the holder
dies, so a SIGKILLed owner never blocks its successor) and carries "pid P on HOST since T".
"""
from __future__ import annotations

import fcntl
import os
import socket
import time

from partq.errors import DeliveryLocked

LOCK_DIR = "delivery-locks"


class DeliveryLock:
    def __init__(self, store_path: str, qid: int, queue: str) -> None:
        directory = os.path.join(store_path, LOCK_DIR)
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"{qid}.lock")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DeliveryLocked(
                f"queue {queue!r} is delivered by {holder(self.path) or 'another process'}; bind in "
                f"that process, or close its broker first") from None
        stamp = f"pid {os.getpid()} on {socket.gethostname()} since " \
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, stamp.encode(), 0)
        self._fd = fd
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


def holder(path: str) -> str | None:
    """The text of a held delivery lock, or None when nobody holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
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
