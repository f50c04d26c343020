"""Delivery in the process that owns it: one lock, the per-queue runtimes, timers, write
submissions and the wake-ups of waiting receivers. Flows reach it only through ``LocalEndpoint``,
the narrow interface (``partq.flow.FlowEndpoint``) that a flow served over a socket implements
too.

Threads and locks
* ``_lock`` guards every runtime and flow state. Under it, code may read LMDB and *queue*
  writes, but never waits for a commit: that happens after the lock is released, so the
  group-commit thread can never wait on a caller holding the lock.
* Waiting receivers sleep in ``wakeups`` (``partq.delivery.wakeups``) until something that can
  make a message deliverable to them happens: a commit of this process that appended to their
  queue, a change of its delivery state (bind, unbind, an ack that gave credit back, a nack, a
  rebalance), a due timer, or a commit of another process. A receiver reads the logs only when
  one of those happened since it last found nothing: an idle flow reads nothing, and a flow is
  not woken by the publishes and acks of other queues.
* With a ``SystemClock`` a ticker thread looks at the store's version every ``POLL_INTERVAL``
  (waking the receivers when another process committed) and runs due timers. With any other
  clock (``ManualClock`` in tests) there is no ticker: timers run when ``tick()`` or a receive
  is called, and a waiting receive looks at the store's version itself every poll interval.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from partq.config import DEFAULT_CONSUMER_TIMEOUT, QueueConfig
from partq.delivery import owner
from partq.delivery.flow_service import FlowService
from partq.delivery.flow_state import FlowState
from partq.delivery.local_endpoint import LocalEndpoint
from partq.delivery.lock import DeliveryLock, lease_for
from partq.delivery.peers import control_requests
from partq.delivery.peers.link import REQUEST_TIMEOUT
from partq.delivery.peers.owner_channel import ControlServer, query_view
from partq.delivery.peers.peer_delivery import FAILOVER_BACKOFF, PeerQueue
from partq.delivery.queue_delivery import QueueDelivery
from partq.delivery.saved_state import DeliveryView, doc_to_view, view_to_doc
from partq.delivery.tally import Tally
from partq.delivery.timers import POLL_INTERVAL, Timers
from partq.delivery.txn_service import TxnService
from partq.delivery.wakeups import Wakeups
from partq.errors import (
    DeliveryLocked,
    InvalidConfig,
    OwnerLost,
    PartqError,
    queue_not_found,
)
from partq.flow import FlowEndpoint
from partq.pending import WriteHandle

log = logging.getLogger("partq.delivery")

PROCESS = f"pid {os.getpid()} on {socket.gethostname()}"


class Dispatcher(Timers, FlowService, TxnService):
    def __init__(self, store, clock, auto_tick: bool) -> None:
        self.store = store
        self.clock = clock
        self._lock = threading.RLock()
        self._runtimes: dict[str, QueueDelivery] = {}
        self._locks: dict[str, DeliveryLock] = {}
        self._servers: dict[str, ControlServer] = {}      # serving other processes' flows
        self._peer_queues: dict[str, PeerQueue] = {}    # flows of queues others deliver
        self.wakeups = Wakeups(store)
        self.polls = 0                     # receive wake-ups that read the logs (diagnostics)
        self.tally = Tally()               # what this process delivered, for the metrics
        self._closed = False
        self._wake: float | None = None    # when a nack's delay ends (``wake_at``)
        self._settled = False              # ``settle`` ran: this process is closing
        store.on_commit_changes(self.wakeups.committed)
        self.after_tick: Callable[[], None] | None = None   # the broker's periodic work
        self._ticker: threading.Thread | None = None
        self._ticker_stop = threading.Event()
        if auto_tick:
            self._ticker = threading.Thread(target=self._tick_loop, name="partq-ticker",
                                            daemon=True)
            self._ticker.start()

    def after_fork(self) -> None:
        """In a forked child: a thread of the parent may have held these locks at fork time;
        fresh ones let the child reach the store's pid check (UsedAcrossFork) instead of
        hanging."""
        self._lock = threading.RLock()
        self.wakeups.after_fork()

    # ------------------------------------------------------------------ binding
    def bind(self, queue: str, name: str | None, hint: list[int] | None,
             skip_corrupt: bool) -> FlowEndpoint:
        """Bind a flow: in this process when it owns (or can take) the queue's delivery, else
        through the owner's control channel (``peers.peer_delivery``). Returns the flow's
        endpoint. An owner that died, or is stopped and let its lease run out while this bind
        waited for it (``OwnerLost``), is taken over here, or followed to the process that took
        over: bind tries again, for up to ``REQUEST_TIMEOUT`` after the first such loss."""
        if hint is not None:
            control_requests.check_hint(hint)   # as the owner checks another process's
        deadline = None
        delay = FAILOVER_BACKOFF[0]
        while True:
            with self._lock:
                peer_queue = self._peer_queues.get(queue)
            try:
                if peer_queue is None:
                    try:
                        return self.bind_local(queue, name, hint, skip_corrupt)
                    except DeliveryLocked:
                        peer_queue = self._peer_queue(queue)
                return peer_queue.bind(name, hint, skip_corrupt)
            except OwnerLost:
                # the owner died or stopped under the bind: take delivery over (``bind_local``)
                # or follow the new owner; bind again once this process's failover has
                if deadline is None:
                    deadline = time.monotonic() + REQUEST_TIMEOUT
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, FAILOVER_BACKOFF[1])

    def bind_local(self, queue: str, name: str | None, hint: list[int] | None,
                   skip_corrupt: bool) -> LocalEndpoint:
        """Bind a flow delivered by this process (``DeliveryLocked`` if another owns it)."""
        state = FlowState(uuid.uuid4().hex[:12], name, queue, skip_corrupt,
                          now=self.clock.now())
        self.step_down(queue)     # fenced since the ticker last looked: its flows go first
        qd = self._add_flow(queue, state, hint)
        log.info("flow %s bound to queue %r: partitions %s", name or state.flow_id, queue,
                 sorted(self.partitions(qd, state)))
        return LocalEndpoint(self, qd, state)

    def _add_flow(self, queue: str, state: FlowState, hint: list[int] | None) -> QueueDelivery:
        with self._lock:
            qd = self._runtime(queue)
            now = self.clock.now()
            with self.store.read() as r:      # a change stored since the last tick comes first
                ops = qd.config_ops(r, now)
            if state.name is not None and qd.core.find_bound(state.name) is not None:
                self._submit(ops, qd)
                raise InvalidConfig(f"a flow named {state.name!r} is already bound to "
                                    f"{queue!r}; unbind it first or pick another name")
            fut = self._submit(ops + qd.bind(state, hint, now), qd)
        self._commit_and_notify(fut)
        return qd

    def _peer_queue(self, queue: str) -> PeerQueue:
        """This process's group of flows of ``queue`` delivered by another process (connects to
        the owner's control socket on first use)."""
        with self.store.read() as r:
            raw = r.queue(queue)
            if raw is None:
                raise queue_not_found(queue, r.queues())
        group = PeerQueue(self, queue, raw["qid"])
        with self._lock:
            existing = self._peer_queues.get(queue)
            if existing is None:
                self._peer_queues[queue] = group
                return group
        group.close()
        return existing

    def forget_peer_queue(self, queue: str, group: PeerQueue) -> None:
        """``group``'s flows now live in this process's own runtime (it took delivery over)."""
        with self._lock:
            if self._peer_queues.get(queue) is group:
                del self._peer_queues[queue]

    def take_over(self, queue: str) -> bool:
        """Take the queue's delivery if no other process holds it (the owner died or closed);
        whether this process now runs it."""
        with self._lock:
            try:
                self._runtime(queue)
            except DeliveryLocked:
                return False
            return True

    def _runtime(self, queue: str) -> QueueDelivery:
        """This process's delivery runtime for ``queue``; takes the queue's delivery lock and
        starts serving other processes' flows."""
        qd = self._runtimes.get(queue)
        if qd is not None:
            return qd
        with self.store.read() as r:
            raw = r.queue(queue)
            if raw is None:
                raise queue_not_found(queue, r.queues())
        config = QueueConfig.from_dict(raw)
        lock = DeliveryLock(self.store.path, config.qid, queue, lease=lease_for(config.consumer_timeout))
        try:
            with self.store.read() as r:
                qd = QueueDelivery(config, r, self.clock.now(), self.tally, self.clock.wall_ns())
            server = ControlServer(self, self.store.path, queue, config.qid, beat=lock.touch)
        except BaseException:
            lock.release()
            raise
        qd.owner_token = owner.new_token()      # before any other write of its delivery
        claimed = self.store.submit(owner.claim(config.qid, qd.owner_token))
        claimed.add_done_callback(lambda: owner.claimed(qd, claimed))
        self._locks[queue] = lock
        self._runtimes[queue] = qd
        self._servers[queue] = server
        log.info("this process (pid %d) runs delivery of queue %r", os.getpid(), queue)
        return qd

    def step_down(self, queue: str) -> None:
        """Another process took the delivery of ``queue`` over while this one was stopped
        (``owner``): stop delivering it here. This process's flows of it are closed (their
        next call raises ``FlowClosed``: bind again); flows of other processes lose their
        connection and follow the new owner."""
        with self._lock:
            qd = self._runtimes.get(queue)
            if qd is None or not qd.fenced:
                return
            del self._runtimes[queue]
            reason = str(owner.lost(queue))
            for state in list(qd.flows.values()):
                if state.remote is None:
                    state.close(reason)
            lock = self._locks.pop(queue, None)
            server = self._servers.pop(queue, None)
        log.warning("queue %r: another process took its delivery over while this one (pid %d) "
                    "was stopped; its flows here are closed", queue, os.getpid())
        if server is not None:
            server.stop()
        if lock is not None:
            lock.release()
        self.notify()

    # ------------------------------------------------------------------ flows of other processes
    def bind_peer(self, queue: str, name: str | None, hint: list[int] | None,
                    skip_corrupt: bool, sink, client: str) -> str:
        """Bind a flow of another process (its control connection is ``sink``)."""
        state = FlowState(uuid.uuid4().hex[:12], name, queue, skip_corrupt, remote=sink,
                          client=client)
        try:
            self._add_flow(queue, state, hint)
        except BaseException:
            # a bind that failed half-way must leave no flow behind that nobody would unbind
            try:
                self.unbind_peer(queue, state.flow_id)
            except Exception:
                log.exception("removing flow %s after its bind failed", state.flow_id)
            raise
        log.info("flow %s of %s bound to queue %r", name or state.flow_id, client, queue)
        return state.flow_id

    def unbind_peer(self, queue: str, flow_id: str, leave: bool = False) -> None:
        """A flow of another process leaves (it unbound, or its process disconnected or went
        quiet: rule `liveness` makes no difference); ``leave``: for good, its process closed
        its broker (``QueueDelivery.unbind``)."""
        with self._lock:
            qd = self._runtimes.get(queue)
            state = qd.flows.get(flow_id) if qd is not None else None
            if qd is None or state is None:
                return
            state.close("unbound")
            fut = self._submit(qd.unbind(state, self.clock.now(), leave), qd)
        log.info("flow %s of %s left queue %r", state.name or flow_id, state.client, queue)
        self._commit_and_notify(fut)

    def report(self, queue: str, flow_id: str, counts: dict[int, int],
               paused: set[int] | None = None, held: dict[int, list] | None = None) -> None:
        """A flow of another process reports what it holds unacked per partition (and which of
        them it saw paused for a handoff, and what holds messages back on them:
        ``QueueDelivery.report``)."""
        with self._lock:
            qd = self._runtimes.get(queue)
            state = qd.flows.get(flow_id) if qd is not None else None
            if qd is None or state is None:
                return
            fut = self._submit(qd.report(state, counts, self.clock.now(), paused, held), qd)
        self._commit_and_notify(fut)

    def consumer_timeout(self, queue: str) -> float:
        with self._lock:
            qd = self._runtimes.get(queue)
            return qd.config.consumer_timeout if qd is not None else DEFAULT_CONSUMER_TIMEOUT

    def view_doc(self, queue: str, clients: dict[str, dict]) -> dict | None:
        """The live view as a document for another process (``control``'s "view")."""
        with self._lock:
            qd = self._runtimes.get(queue)
            view = None if qd is None else qd.view(PROCESS, self.clock.now())
        return None if view is None else view_to_doc(view, clients)

    def owns(self, queue: str) -> bool:
        with self._lock:
            return queue in self._runtimes

    def owner_guard(self, queue: str) -> Callable | None:
        """The first operation of a write for ``queue``'s delivery made outside the flows'
        calls (``owner.guard``); None when this process does not deliver it."""
        with self._lock:
            qd = self._runtimes.get(queue)
            return None if qd is None else owner.guard(qd)

    def view(self, queue: str) -> DeliveryView | None:
        """The live view of ``queue``'s delivery, when this process runs it; else the owner's,
        asked over its control socket; None when no process answers for it."""
        with self._lock:
            qd = self._runtimes.get(queue)
            view = qd.view(PROCESS, self.clock.now()) if qd is not None else None
            server = self._servers.get(queue)
        if view is not None:
            clients = server.clients() if server is not None else {}
            return doc_to_view(view_to_doc(view, clients)) if clients else view
        with self.store.read() as r:
            raw = r.queue(queue)
        if raw is None:
            return None
        doc = query_view(self.store.path, raw["qid"])
        return doc_to_view(doc) if doc is not None else None

    def release(self, queue: str, reason: str) -> DeliveryLock | None:
        """Stop delivering ``queue`` here (it is being deleted): close its flows with ``reason``
        (in other processes too) and hand back its delivery lock, still held, for the caller
        to release."""
        with self._lock:
            qd = self._runtimes.pop(queue, None)
            if qd is not None:
                for state in list(qd.flows.values()):
                    state.close(reason)
            lock = self._locks.pop(queue, None)
            server = self._servers.pop(queue, None)
            peer_queue = self._peer_queues.pop(queue, None)
        if server is not None:
            server.stop()
        if peer_queue is not None:
            peer_queue.close()
        self.notify()
        return lock

    # ------------------------------------------------------------------ writes and wake-ups
    def _submit(self, ops: list, qd: QueueDelivery | None = None) -> WriteHandle | None:
        """Queue ``ops`` as one write (call under the lock to keep their order); ``qd``: they
        are writes of that queue's delivery, refused once another process claimed it
        (``owner.guard``)."""
        op = self._one_op(ops, qd)
        return None if op is None else self.store.submit(op)

    @staticmethod
    def _one_op(ops: list, qd: QueueDelivery | None = None) -> Callable | None:
        """``ops`` as one write (None for none), guarded as ``_submit`` says."""
        if not ops:
            return None
        if qd is not None:
            ops = [owner.guard(qd), *ops]
        if len(ops) == 1:
            return ops[0]
        return lambda w: [op(w) for op in ops]

    def _commit_and_notify(self, fut, qid: int | None = None) -> None:
        """Wait for a commit (never under the lock), then wake receivers: delivery state
        changed (of queue ``qid``; None: of any queue)."""
        if fut is not None:
            fut.result()
        self.notify(qid)

    def change_token(self, qid: int | None = None) -> tuple[int, int]:
        """What ``wait_for_change`` compares (``Wakeups.token``): with ``qid``, the changes of
        that queue and of every queue; without, every change of this process and the store's
        version (another process's commit)."""
        return self.wakeups.token(qid)

    def wait_for_change(self, token: tuple[int, int], timeout: float,
                        qid: int | None = None) -> None:
        """Sleep until something may have made a message deliverable since ``token`` was taken
        (``wait_for_messages`` sleeps here between collects; so does a caller that serves many
        flows from one thread): a commit or a change of delivery state of this process (of
        queue ``qid`` when given), ``notify()``, another process's commit, a due timer; or
        until ``timeout`` seconds passed."""
        poll = POLL_INTERVAL if self._ticker is None else None   # nobody else watches the store
        self.wakeups.wait(token, timeout, qid, poll, self._timer_due)

    def notify(self, qid: int | None = None) -> None:
        """Wake the receivers of queue ``qid`` (None: of every queue) and the unscoped
        waiters."""
        self.wakeups.notify(qid)

    # ------------------------------------------------------------------ lifecycle
    def settle(self) -> None:
        """Before this process stops delivering: make delivery counts and delivered marks exact,
        so whoever delivers next counts only real deliveries (``QueueDelivery.settle_all``).
        ``close`` does it; the broker does it before it stops serving DR-standbys, so that they
        get this commit too. Once: ``close`` after it writes nothing more."""
        with self._lock:
            if self._settled:
                return
            self._settled = True
            now, now_ns = self.clock.now(), self.clock.wall_ns()
            writes = [(qd, ops) for qd in self._runtimes.values()
                      if (ops := qd.settle_all(now, now_ns))]
            futs = []
            try:
                if writes:
                    self.store.check_writable()
                futs = [self._submit(ops, qd) for qd, ops in writes]
            except PartqError as exc:
                log.warning("could not settle delivery counts on close: %s", exc)
        for fut in futs:
            try:
                if fut is not None:
                    fut.result()
            except PartqError as exc:
                log.warning("could not settle delivery counts on close: %s", exc)

    def close(self, reason: str) -> None:
        """Close every flow with ``reason`` (their state stays stored: consumers that come back
        within the rebalance delay keep their partitions) and release the delivery locks."""
        self._closed = True
        if self._ticker is not None:
            self._ticker_stop.set()
            if threading.current_thread() is not self._ticker:
                self._ticker.join()
        self.store.remove_commit_changes_hook(self.wakeups.committed)
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
            peer_queues, self._peer_queues = list(self._peer_queues.values()), {}
        for group in peer_queues:
            group.close()
        for server in servers:        # before the locks go: clients then fail over
            server.stop()
        self.settle()
        with self._lock:
            for qd in self._runtimes.values():
                for state in list(qd.flows.values()):
                    state.close(reason)
            self._runtimes.clear()
            for lock in self._locks.values():
                lock.release()
            self._locks.clear()
        self.notify()
