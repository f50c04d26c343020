"""Room for the writes that drain a store: a store that is full, in its map or on its disk,
must still take acks, or nothing could empty it.

Two reserves, one rule: appends stop while a reserve cannot be kept; every other write (acks,
settings, operator fixes) goes on and uses it.

- **The map** (``max_map_size``, address space): appends stop once the pages the data needs come
  within ``map_reserve`` of the largest map.
- **The disk**: LMDB grows ``data.mdb`` by writing pages past its end, so a full disk fails any
  commit, acks included (LMDB reports a short write as an I/O error). After its commits this
  process keeps ``disk_reserve`` bytes past the last page LMDB uses *allocated* in the file
  (``posix_fallocate``): blocks the disk has handed over and that a commit can write into
  without asking it again. When the disk cannot give that reserve, appends stop (``StorageFull``
  saying so) until it can again, or until the pages freed inside the file (by acks, by trimmed
  logs) make up the reserve; acks meanwhile write into the reserve.

The same object keeps the file covering the last page the meta page counts: LMDB never writes
the pages a transaction allocated and freed again, so ``data.mdb`` could end before that page,
which the check at open (``Opening``) would take for a truncated file.
"""
from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable

DISK_RESERVE = 8 << 20          # bytes kept allocated past the last used page of data.mdb
RETRY_INTERVAL = 1.0            # seconds between attempts to take the disk reserve again
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class Space:
    """The reserves of one store in one process (used by ``Store``; its methods run in the
    group-commit thread, the one writer of the process)."""

    def __init__(self, path: str, psize: int, max_map_size: int) -> None:
        self.data_file = os.path.join(path, "data.mdb")
        self.psize = psize
        # (a store opened only to read knows no max_map_size: it judges by the default reserve)
        self.map_reserve = min(max(max_map_size // 16, 16 * psize), 64 << 20) \
            if max_map_size > 0 else 64 << 20
        self.disk_reserve = min(DISK_RESERVE, self.map_reserve)
        self._allocated = 0         # data.mdb is allocated (not sparse) this far
        self._covered = 0           # data.mdb is this long or longer
        self._short = False         # the disk could not give the reserve at the last attempt
        self._next_try = 0.0
        self._lock = threading.Lock()

    @property
    def disk_short(self) -> bool:
        """Whether the last attempt to allocate the disk reserve failed for want of space."""
        return self._short

    def disk_full(self, file_size: int, live: int) -> bool:
        """Whether appends are refused for want of disk, as any process can tell: this
        process's last attempt failed, or the free space of the disk and the pages free inside
        data.mdb together fall short of the reserve."""
        if self._short:
            return True
        if not self.disk_reserve:
            return False
        try:
            st = os.statvfs(self.data_file)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize + max(file_size - live, 0) < self.disk_reserve

    def after_commit(self, last_pgno: int) -> None:
        """Cover the pages up to ``last_pgno`` and keep the disk reserve past them. Never
        raises: the commit it follows is made."""
        used = (last_pgno + 1) * self.psize
        with self._lock:
            try:
                if used > self._covered:
                    size = os.path.getsize(self.data_file)
                    if size < used:
                        os.truncate(self.data_file, used)   # sparse: pages LMDB never wrote
                    self._covered = max(size, used)
            except OSError:     # the commit is made: nothing here may fail it; next time
                pass
            if used + self.disk_reserve // 2 > self._allocated and self._may_try():
                self._allocate(used + self.disk_reserve)

    def _may_try(self) -> bool:
        return not self._short or time.monotonic() >= self._next_try

    def _allocate(self, end: int) -> bool:
        """Allocate ``data.mdb`` up to ``end``; False (and short) when the disk has no room."""
        start = min(self._allocated, end)
        try:
            fd = os.open(self.data_file, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.posix_fallocate(fd, start, end - start)
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                self.disk_reserve = 0       # a file system that cannot allocate: no reserve
                self._allocated = end
                return True
            self._short = True
            self._next_try = time.monotonic() + RETRY_INTERVAL
            return False
        self._allocated = end
        self._covered = max(self._covered, end)
        self._short = False
        return True

    def append_refusal(self, last_pgno: int, map_size: int, max_map_size: int,
                       live_pages: Callable[[], int]) -> str | None:
        """Why an append must not run now (the start of a ``StorageFull`` message), or None.
        ``live_pages`` counts the pages the data needs (read only when a reserve is at stake:
        it walks every database's statistics)."""
        used = (last_pgno + 1) * self.psize
        # another process may have grown the map past this process's own limit: use it all
        map_limit = max(max_map_size, map_size) - self.map_reserve
        map_tight = map_size >= max_map_size and used >= map_limit
        with self._lock:
            # a fresh process does not know how far the file is allocated: find out first
            unknown = self._allocated == 0
            disk_tight = (self._short or unknown) and not (
                self._may_try() and self._allocate(used + self.disk_reserve))
        if not map_tight and not disk_tight:
            return None
        live = live_pages() * self.psize
        if map_tight and live >= map_limit:
            return (f"is at max_map_size={max_map_size} bytes with its reserve for acks "
                    f"reached; ack and drain messages, or open the broker with a larger "
                    f"max_map_size")
        if disk_tight and max(self._covered, self._allocated) - live < self.disk_reserve:
            return (f"is on a full disk: appends stop while data.mdb cannot keep its "
                    f"{self.disk_reserve >> 20} MiB reserve for acks; acks still run: free "
                    f"space on that disk, or ack and drain messages")
        return None
