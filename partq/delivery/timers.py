"""The timers of ``Dispatcher``: rebalance and handoff deadlines, hung consumers, queue config
changes stored by any process, the end of a nack's delay, and the ticker thread that runs them
with a ``SystemClock`` (with any other clock, ``tick()`` runs them when a test calls it). Also
where a process finds that another one took a queue's delivery over (``owner``) and steps
down. ``Dispatcher`` provides the lock, the store, the runtimes and the submissions (declared
here)."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from partq.delivery import owner
from partq.delivery.queue_delivery import QueueDelivery
from partq.delivery.wakeups import Wakeups
from partq.errors import FlowClosed, PartqError
from partq.pending import WriteHandle

log = logging.getLogger("partq.delivery")

POLL_INTERVAL = 0.02     # seconds between looks at the store for other processes' commits


class Timers:
    """Due timers, run under the dispatcher's lock; their writes are waited for outside it."""

    store: Any
    clock: Any
    _lock: threading.RLock
    _runtimes: dict[str, QueueDelivery]
    _wake: float | None
    wakeups: Wakeups
    _ticker_stop: threading.Event
    _closed: bool
    after_tick: Callable[[], None] | None

    def _submit(self, ops: list, qd: QueueDelivery | None = None) -> WriteHandle | None:
        raise NotImplementedError

    def notify(self, qid: int | None = None) -> None:
        raise NotImplementedError

    def step_down(self, queue: str) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        """Run every rebalance and handoff timer that is due by the clock, and apply queue
        config changes stored by any process; step down from queues another process took over
        (``step_down``)."""
        self.store.check_usable()
        with self._lock:
            futs = self._submit_timers()
        self._wait_timers(futs)
        with self._lock:
            fenced = [name for name, qd in self._runtimes.items() if qd.fenced]
        for name in fenced:
            self.step_down(name)
        if futs:
            self.notify()

    def _submit_timers(self) -> list[WriteHandle]:
        """Submit the due timers' writes of every queue delivered here, one write per queue
        (so that a queue another process took over fails alone)."""
        futs = []
        for qd, ops in self._due_timer_ops():
            fut = self._submit(ops, qd)
            if fut is not None:
                futs.append(fut)
        return futs

    def _wait_timers(self, futs: list[WriteHandle]) -> None:
        """Wait for timer writes (never under the lock); a queue this process no longer owns
        is stepped down from by the next tick."""
        for fut in futs:
            try:
                fut.result()
            except FlowClosed:
                pass

    def wake_at(self, when: float) -> None:
        """Make receivers look again at ``when`` (``clock.now()``): a nack's delay ends."""
        with self._lock:
            if self._wake is None or when < self._wake:
                self._wake = when

    def _timer_due(self) -> bool:
        if self._wake_due():
            return True
        now = self.clock.now()
        with self._lock:
            return any(d is not None and d <= now
                       for d in (qd.core.next_deadline() for qd in self._runtimes.values()))

    def _wake_due(self) -> bool:
        """Whether a nack's delay has ended since the last look (``wake_at``)."""
        now = self.clock.now()
        with self._lock:
            if self._wake is not None and self._wake <= now:
                self._wake = None
                return True
            return False

    def _due_timer_ops(self) -> list[tuple[QueueDelivery, list]]:
        """The due timers' writes, per queue delivered here."""
        out = []
        if self._runtimes:
            # claims resolved before the snapshot began: a later one is not in it
            claimed = {name: qd.claimed for name, qd in self._runtimes.items()}
            with self.store.read() as r:
                for name, qd in self._runtimes.items():
                    ops = self._queue_timer_ops(qd, r, claimed[name])
                    if ops:
                        out.append((qd, ops))
        return out

    def _queue_timer_ops(self, qd: QueueDelivery, r, claimed: bool) -> list:
        """Under the lock, in snapshot ``r`` (``claimed``: ``qd.claimed`` before it began): the
        writes of ``qd``'s due timers, and what its stored config, owner claim, cut-over and
        outside acks ask for when the store changed since they were last read (a receive
        looks at its own queue in its own snapshot; the ticker at every queue). A change they
        take in (a new config, an online scaling drained, acks written outside delivery) wakes
        the queue's receives: no commit that appended woke them."""
        now = self.clock.now()
        ops: list = []
        version = r.version()
        if qd.seen_version != version:
            qd.seen_version = version
            if claimed and qd.claim_error is None and not owner.holds(r, qd.qid, qd.owner_token):
                qd.fenced = True
                return ops
            before = (qd.config_raw, qd.cutover, qd.outside)
            ops += qd.config_ops(r, now)
            ops += qd.cutover_ops(r)      # acks moved: an online scaling done?
            ops += qd.take_outside_acks(r, now)
            if (qd.config_raw, qd.cutover, qd.outside) != before:
                self.notify(qd.qid)     # its receives look again under what changed
        if qd.fenced:
            return ops
        deadline = qd.core.next_deadline()
        if deadline is not None and deadline <= now:
            ops += qd.tick(now)
        ops += qd.unbind_hung(now)
        return ops

    def _tick_loop(self) -> None:
        """Every ``POLL_INTERVAL``: wake the waiting receivers if another process committed
        since the last look, or a nack's delay ended (so they need not poll themselves); after
        commits of this process only, wake the unscoped waiters (this process's receives were
        woken by the commits that concern them: ``Wakeups``); run due timers."""
        seen = self.store.version()
        wakeups = self.wakeups
        while not self._ticker_stop.wait(POLL_INTERVAL):
            try:
                version = self.store.version()
                changed = version != seen
                foreign = changed and wakeups.foreign(seen, version)
                seen = version
                if foreign or self._wake_due():
                    self.notify()
                elif changed:
                    wakeups.notify_unscoped()
                self.tick()
                if self.after_tick is not None:
                    self.after_tick()
            except PartqError as exc:
                if self._closed:
                    return
                log.warning("timer run failed: %s", exc)
