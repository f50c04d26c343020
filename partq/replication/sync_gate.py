"""Sync mode's gate: callers whose commit wrote replicated changes wait here until one standby
has that commit durably (PostgreSQL's ``synchronous_standby_names = 'ANY 1 (*)'``), or fail
with ``ReplicationTimeout`` after ``sync_timeout`` seconds.

Only acks of authenticated links reach ``acked``, and each link caps its standby's ack at the
LSN it sent that standby, which the primary had committed: an ack can never release a commit
that did not reach a standby, however the peer lies about numbers. So the highest acked LSN
only rises, and one standby that stalls holds no one while another acks.

Thread-safety: every method may be called from any thread.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from partq.errors import ReplicationTimeout


class SyncGate:
    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._held: deque = deque()     # (lsn, deadline, pendings, results), LSN order
        self._acked = 0
        self._closed = False

    @property
    def acked_lsn(self) -> int:
        """The highest LSN one standby confirmed (0: none yet)."""
        return self._acked

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self, lsn: int, batch: list, results: list) -> None:
        """Called by the group commit after commit ``lsn``: hold its callers."""
        with self._lock:
            if lsn > self._acked and not self._closed:
                self._held.append((lsn, self._clock() + self.timeout, batch, results))
                return
            closed = self._closed and lsn > self._acked
        if closed:
            self._fail([(lsn, 0.0, batch, results)], "the broker closed before a DR-standby "
                       "confirmed it")
            return
        for pending, result in zip(batch, results, strict=True):
            pending.resolve(result)

    def acked(self, lsn: int) -> None:
        """A standby has every commit up to ``lsn`` durably: release their callers."""
        released = []
        with self._lock:
            if lsn > self._acked:
                self._acked = lsn
            while self._held and self._held[0][0] <= self._acked:
                released.append(self._held.popleft())
        for _, _, batch, results in released:
            for pending, result in zip(batch, results, strict=True):
                pending.resolve(result)

    def expire(self) -> None:
        """Fail the callers whose deadline passed."""
        now = self._clock()
        expired = []
        with self._lock:
            # deadlines follow LSN order (one timeout for all), so the expired ones lead
            while self._held and self._held[0][1] <= now:
                expired.append(self._held.popleft())
        self._fail(expired, f"no DR-standby confirmed it within {self.timeout:g} s")

    def close(self) -> None:
        """Fail everything still held (the primary stops serving standbys)."""
        with self._lock:
            self._closed = True
            held, self._held = list(self._held), deque()
        self._fail(held, "the broker closed before a DR-standby confirmed it")

    @staticmethod
    def _fail(items: list, why: str) -> None:
        for lsn, _, batch, _ in items:
            err = ReplicationTimeout(
                f"commit {lsn} is stored on the primary, but {why}: its outcome on the standby is "
                f"unknown; it reaches a standby when one connects (check `partq dr status`)")
            for pending in batch:
                pending.resolve(error=err)
