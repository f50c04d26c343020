"""The flow interface of ``Dispatcher``: what a ``LocalEndpoint`` calls for a flow bound in the
process that owns its queue's delivery (``FlowDelivery``): receive (waiting for messages),
ack, ack a range, nack, reject, unbind. ``Dispatcher`` provides the lock, the store, the clock
and the write submissions these use (declared here)."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from partq.delivery import owner
from partq.delivery.flow_state import FlowState
from partq.delivery.queue_delivery import QueueDelivery
from partq.delivery.tally import Tally
from partq.message import FlowChangeUpdate, Message
from partq.pending import WriteHandle
from partq.storage import crashpoints

log = logging.getLogger("partq.delivery")


class FlowService:
    """The flows' calls, under the dispatcher's lock; writes are waited for outside it."""

    store: Any
    clock: Any
    tally: Tally
    polls: int
    _lock: threading.RLock
    _ticker: threading.Thread | None

    def _submit(self, ops: list, qd: QueueDelivery | None = None) -> WriteHandle | None:
        raise NotImplementedError

    @staticmethod
    def _one_op(ops: list, qd: QueueDelivery | None = None) -> Callable | None:
        raise NotImplementedError

    def _queue_timer_ops(self, qd: QueueDelivery, r, claimed: bool) -> list:
        raise NotImplementedError

    def _wait_timers(self, futs: list[WriteHandle]) -> None:
        raise NotImplementedError

    def _commit_and_notify(self, fut, qid: int | None = None) -> None:
        raise NotImplementedError

    def _timer_due(self) -> bool:
        raise NotImplementedError

    def change_token(self, qid: int | None = None) -> tuple[int, int]:
        raise NotImplementedError

    def wait_for_change(self, token: tuple[int, int], timeout: float,
                        qid: int | None = None) -> None:
        raise NotImplementedError

    def notify(self, qid: int | None = None) -> None:
        raise NotImplementedError

    def wake_at(self, when: float) -> None:
        raise NotImplementedError

    def receive(self, qd: QueueDelivery, state: FlowState, max_messages: int,
                timeout: float) -> list[Message]:
        poll = state.poll
        poll.touch(self.clock.now())
        poll.receiving += 1
        try:
            # woken by changes of its queue (with a ticker to watch other processes' commits)
            scope = qd.qid if self._ticker is not None else None
            msgs = self.wait_for_messages(lambda n: self._collect(qd, state, n), max_messages,
                                          timeout, scope)
        finally:
            poll.receiving -= 1
            poll.touch(self.clock.now())
        if msgs:
            self.tally.delivered(qd.name, msgs)
        return msgs if msgs is not None else []

    def wait_for_messages(self, collect: Callable[[int], list[Message] | None], max_messages: int,
                          timeout: float, qid: int | None = None) -> list[Message] | None:
        """Call ``collect(max_messages)`` until it returns messages (or None: the caller's flow
        moved elsewhere) or ``timeout`` seconds passed, sleeping in between until something
        could make a message deliverable (to a flow of queue ``qid``, when given:
        ``Wakeups``)."""
        self.store.check_usable()
        if timeout <= 0:            # one look (a server's pump): no change to wait for
            self.polls += 1
            msgs = collect(max_messages)
            return msgs if msgs is None or msgs else []
        deadline = time.monotonic() + timeout
        looked_at = None     # the change token when the logs last had nothing
        while True:
            now_seen = self.change_token(qid)
            if now_seen != looked_at or self._timer_due():
                self.polls += 1
                msgs = collect(max_messages)
                if msgs is None or msgs:
                    return msgs
                looked_at = now_seen
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            self.wait_for_change(now_seen, remaining, qid)

    def _collect(self, qd: QueueDelivery, state: FlowState, max_messages: int) -> list[Message]:
        with self._lock:
            qd.check_flow(state)
            if qd.full(state) and self._ticker is not None:
                return []       # nothing to hand out: no snapshot (a server's pump looks
                                # often); the ticker runs the queue's timers
            claimed = qd.claimed         # before the snapshot (``owner.check``)
            with self.store.read() as r:
                owner.check(qd, r, claimed)   # another process took delivery over: nothing here
                timer_fut = self._submit(self._queue_timer_ops(qd, r, claimed), qd)
                msgs, handout = qd.collect(state, max_messages, r, self.clock.now(),
                                           self.clock.wall_ns())
            seen: dict[int, int] = {}     # marks another process wrote since the read
            fut = self._submit(qd.collect_ops(handout, seen), qd)
        if handout.wake is not None:
            self.wake_at(handout.wake)
        if timer_fut is not None:
            self._wait_timers([timer_fut])
            self.notify()
        if fut is not None:
            try:
                fut.result()
            except BaseException:
                with self._lock:
                    qd.undo_collect(state, msgs, handout)
                raise
            with self._lock:
                qd.collected(handout)
                if seen:
                    msgs = qd.flag_concurrent(msgs, seen)
        return msgs

    def ack_async(self, qd: QueueDelivery, state: FlowState, msgs: Iterable[Message],
                  commit_here: bool = False) -> WriteHandle | None:
        """``commit_here``: the caller waits for the acks; when the writer is idle they commit
        in the calling thread, after the lock is left (the claim, taken under it, keeps them
        in order with every later write)."""
        state.poll.touch(self.clock.now())
        claimed = None
        with self._lock:
            full = qd.full(state)
            with self.store.read() as r:
                ops = qd.ack(state, msgs, self.clock.now(), r)
            if commit_here and ops and self.store.claim_commit():
                claimed = self._one_op(ops, qd)
                fut = None
            else:
                fut = self._submit(ops, qd)
        if claimed is not None:
            fut = self.store.commit_claimed(claimed)
        if crashpoints.ENABLED:
            crashpoints.hit("at_ack")
        if (full and state.poll.receiving) or qd.acks_wake_others():
            self.notify(qd.qid)   # credit came back to a waiting receive of a full flow, or
        return fut                # a handoff or scaling waits for these acks

    def ack_through(self, qd: QueueDelivery, state: FlowState, partition: int,
                    seq: int) -> WriteHandle | None:
        state.poll.touch(self.clock.now())
        with self._lock:
            with self.store.read() as r:
                fut = self._submit(qd.ack_through(state, partition, seq, self.clock.now(), r),
                                   qd)
        self.notify(qd.qid)
        return fut

    def nack(self, qd: QueueDelivery, state: FlowState, msg: Message,
             delay: float | None = None) -> list[int]:
        state.poll.touch(self.clock.now())
        with self._lock:
            ops, back = qd.nack(state, msg, self.clock.now(), delay, self.clock.wall_ns())
            fut = self._submit(ops, qd)
            wake = qd.next_wake()
        if wake is not None:
            self.wake_at(wake)
        self.tally.nacked(qd.name)
        self._commit_and_notify(fut, qd.qid)
        return back

    def reject(self, qd: QueueDelivery, state: FlowState, msg: Message,
               headers: dict | None = None) -> None:
        state.poll.touch(self.clock.now())
        with self._lock:
            fut = self._submit(qd.reject(state, msg, self.clock.now(), self.clock.wall_ns(),
                                         headers), qd)
        self._commit_and_notify(fut, qd.qid)

    def unbind(self, qd: QueueDelivery, state: FlowState, leave: bool = False) -> None:
        with self._lock:
            if state.closed:
                return
            state.close("unbound by the application")
            fut = self._submit(qd.unbind(state, self.clock.now(), leave), qd)
        log.info("flow %s unbound from queue %r", state.name or state.flow_id, qd.name)
        self._commit_and_notify(fut)

    def partitions(self, qd: QueueDelivery, state: FlowState) -> frozenset[int]:
        with self._lock:
            return qd.partitions_of(state.flow_id)

    def events(self, state: FlowState) -> list[FlowChangeUpdate]:
        with self._lock:
            out = list(state.events)
            state.events.clear()
            return out

