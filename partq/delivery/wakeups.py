"""Who a change wakes: the wake-ups of the receives waiting in the process that runs delivery.

A receive waits until something may have made a message deliverable to it, then collects: it
reads the logs of its flow's partitions. Waking every waiting receive at every commit of the
directory made each wait end in a collect that found nothing (a publish to one queue woke the
flows of the others; an ack, its own flow's receive), so changes are scoped:

* a change of one queue (a commit of this process that appended to it, an ack that gave a full
  flow credit back, a nack) wakes the receives of that queue (``notify(qid)``);
* a change that may concern any queue (a bind, an unbind, a timer's write, a commit of another
  process, a nack's delay ending) wakes every receive (``notify()``).

A waiting receive compares a token: its queue's count of changes and the count of changes of
every queue. A caller that waits for any change (the pumps of ``partq serve``, the flows of a
queue another process delivers) waits unscoped: every change and every commit of the store,
its version being in that token.

Commits of other processes are found by the store's version (LMDB's last transaction id,
shared by every process): the ticker compares it with the versions of this process's own
commits (``committed``), and wakes everyone only when another process committed too
(``foreign``).
"""
from __future__ import annotations

import threading
import time
from collections import deque

OWN_KEPT = 4096      # versions of this process's latest commits kept (an older one counts as
                     # another process's: a wake-up too many, never one too few)


class Wakeups:
    def __init__(self, store) -> None:
        self.store = store
        self._cond = threading.Condition()
        self._generation = 0        # every change: the unscoped waiters
        self._everyone = 0          # changes that may concern every queue
        self._queues: dict[int, int] = {}     # qid -> changes of that queue
        self._own: deque[int] = deque(maxlen=OWN_KEPT)    # versions of own commits, ascending

    def after_fork(self) -> None:
        """A fresh condition in a forked child (a thread of the parent may have held it)."""
        self._cond = threading.Condition()

    def token(self, qid: int | None = None) -> tuple[int, int]:
        """What ``wait`` compares. ``qid``: a receive of that queue (scoped); None: any change
        and any commit of the store."""
        with self._cond:
            if qid is not None:
                return self._everyone, self._queues.get(qid, 0)
            generation = self._generation
        return generation, self.store.version()

    def _unchanged(self, token: tuple[int, int], qid: int | None) -> bool:
        """Under the condition: no notify since ``token`` (the store's version aside)."""
        if qid is None:
            return self._generation == token[0]
        return self._everyone == token[0] and self._queues.get(qid, 0) == token[1]

    def wait(self, token: tuple[int, int], timeout: float, qid: int | None, poll: float | None,
             due) -> None:
        """Sleep until the token moved, ``due()`` says a timer is due, or ``timeout`` seconds
        passed; ``poll``: look again at least that often (nobody else watches the store)."""
        deadline = time.monotonic() + timeout
        while self.token(qid) == token and not due():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if poll is not None:
                remaining = min(remaining, poll)
            with self._cond:
                if self._unchanged(token, qid):
                    self._cond.wait(remaining)

    def notify(self, qid: int | None = None) -> None:
        """Wake the receives of queue ``qid`` (None: of every queue) and the unscoped waiters."""
        with self._cond:
            self._generation += 1
            if qid is None:
                self._everyone += 1
            else:
                self._queues[qid] = self._queues.get(qid, 0) + 1
            self._cond.notify_all()

    def notify_unscoped(self) -> None:
        """Wake only the unscoped waiters: the store changed by this process's own commits."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def committed(self, version: int, qids: frozenset[int]) -> None:
        """The store's commit hook (``Store.on_commit_changes``): this process made ``version``,
        appending to the queues ``qids``, whose receives it wakes."""
        with self._cond:
            self._own.append(version)
            if qids:
                self._generation += 1
                queues = self._queues
                for qid in qids:
                    queues[qid] = queues.get(qid, 0) + 1
                self._cond.notify_all()

    def foreign(self, seen: int, version: int) -> bool:
        """Whether another process committed while the store went from version ``seen`` to
        ``version`` (each commit moves it by one): more commits than this process's own."""
        with self._cond:
            own = self._own
            while own and own[0] <= seen:
                own.popleft()
            mine = 0
            for v in own:
                if v > version:
                    break
                mine += 1
        return version - seen > mine
