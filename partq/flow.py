"""A consumer flow: the handle ``Broker.bind`` returns. Receive, ack, nack, unbind.

Thread-safety: a Flow may be used from several threads; each call takes the broker lock briefly.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Iterable, Iterator

from partq.message import FlowChangeUpdate, Message
from partq.pending import Pending

POLL_INTERVAL = 0.02     # a blocked receive re-reads the log this often (other processes publish)
from partq.storage import crashpoints


class Flow:
    def __init__(self, broker, delivery, flow_id: str, name: str | None, skip_corrupt: bool) -> None:
        self._broker = broker
        self._qd = delivery
        self.flow_id = flow_id
        self.name = name
        self.queue = delivery.name
        self.skip_corrupt = skip_corrupt
        self._inflight = 0
        self._rr = 0
        self._pending_error = None
        self._closed = False
        self._closed_reason = ""
        self._events: deque[FlowChangeUpdate] = deque()
        self._on_change: Callable[[FlowChangeUpdate], None] | None = None

    # ------------------------------------------------------------------ state
    @property
    def partitions(self) -> frozenset[int]:
        """The partitions assigned to this flow now: keep it as the hint for a rebind (S15). On an
        exclusive queue the active flow holds ``{PARENT}``, the parent queue's log."""
        with self._broker._lock:
            return self._qd.partitions_of(self.flow_id)

    @property
    def active(self) -> bool:
        """True while the flow holds partitions; a standby (S11) is inactive."""
        return bool(self.partitions)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def unacked(self) -> int:
        return self._inflight

    def events(self) -> list[FlowChangeUpdate]:
        """FlowChangeUpdate events since the last call (active/inactive transitions)."""
        with self._broker._lock:
            out = list(self._events)
            self._events.clear()
            return out

    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None:
        """Call ``callback(update)`` on every FlowChangeUpdate. It runs under the broker lock:
        keep it short and do not call back into the broker from it."""
        self._on_change = callback

    def _changed(self, update: FlowChangeUpdate) -> None:
        self._events.append(update)
        if self._on_change is not None:
            self._on_change(update)

    # ------------------------------------------------------------------ consume
    def receive(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        """Up to ``max_messages`` messages from this flow's partitions, in order per partition.

        Returns as soon as at least one message is available, or an empty list once ``timeout``
        seconds (real time) passed; ``timeout=0`` never blocks. Bounded by
        ``max_delivered_unacked_per_flow`` (S14).
        """
        if max_messages < 1:
            raise ValueError("max_messages must be at least 1")
        broker, qd = self._broker, self._qd
        broker._store._check_usable()
        deadline = time.monotonic() + timeout
        while True:
            gen = broker._data_gen
            with broker._lock:
                qd.check_flow(self)
                timer_fut = broker._submit(broker._due_timer_ops())
                with broker._store.read() as r:
                    msgs, marks, skipped = qd.collect(self, max_messages, r)
                fut = broker._submit(qd.collect_ops(marks, skipped))
            broker._wait(timer_fut)
            if fut is not None:
                try:
                    fut.result()
                except BaseException:
                    with broker._lock:
                        qd.undo_collect(self, msgs, marks)
                    raise
            if msgs:
                return msgs
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            broker._wait_for_data(gen, min(remaining, POLL_INTERVAL))

    def messages(self, batch: int = 100, stop: threading.Event | None = None,
                 poll: float = 0.2) -> Iterator[Message]:
        """Iterate over messages until the flow is unbound or ``stop`` is set. The caller acks."""
        while not self._closed and not (stop is not None and stop.is_set()):
            for msg in self.receive(batch, timeout=poll):
                yield msg

    def run(self, handler: Callable[[Message], None], stop: threading.Event | None = None,
            batch: int = 100) -> None:
        """Callback style: call ``handler(msg)`` for each message and ack it once the handler
        returned; a handler that raises gets the message nacked (redelivered, in order)."""
        for msg in self.messages(batch, stop):
            try:
                handler(msg)
            except Exception:
                self.nack(msg)
                raise
            self.ack(msg)

    def ack(self, msg: Message) -> None:
        """Acknowledge one message; durable when this returns."""
        self.ack_many((msg,))

    def ack_many(self, msgs: Iterable[Message]) -> None:
        """Acknowledge messages in one commit; durable when this returns."""
        self.ack_many_async(msgs).result()

    def ack_many_async(self, msgs: Iterable[Message]) -> Pending:
        """Acknowledge messages in one commit without waiting for it: the acks take effect for
        delivery at once (nothing acked is delivered again), and are durable once the returned
        ``Pending.result()`` returns. A consumer can receive and process its next batch while
        the previous batch's acks are committed; until ``result()`` returns, a crash may bring
        those messages back (redelivered), as for an ack not yet made."""
        broker = self._broker
        with broker._lock:
            fut = broker._submit(self._qd.ack(self, msgs, broker.clock.now()))
        if crashpoints.ENABLED:
            crashpoints.hit("at_ack")
        return Pending(fut)

    def nack(self, msg: Message) -> None:
        """Return ``msg`` for redelivery (with every later unacked message of its partition)."""
        broker = self._broker
        with broker._lock:
            fut = broker._submit(self._qd.nack(self, msg, broker.clock.now()))
        broker._wait(fut)

    def unbind(self) -> None:
        """Leave the queue. Unacked messages go to whoever takes the partitions, marked
        redelivered. A named flow that binds again within the rebalance delay gets them back."""
        broker = self._broker
        with broker._lock:
            if self._closed:
                return
            self._close("unbound by the application")
            fut = broker._submit(self._qd.unbind(self, broker.clock.now()))
        broker._wait(fut)

    def _close(self, reason: str) -> None:
        self._closed = True
        self._closed_reason = reason

    def __enter__(self) -> "Flow":
        return self

    def __exit__(self, *exc) -> None:
        self.unbind()

    def __repr__(self) -> str:
        return (f"<Flow {self.name or self.flow_id} of {self.queue!r} "
                f"partitions={sorted(self.partitions)}{' closed' if self._closed else ''}>")

