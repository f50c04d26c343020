"""A consumer flow: the handle ``Broker.bind`` returns. Receive, ack, nack, unbind.

A ``Flow`` is a thin handle over a ``FlowEndpoint``: the delivery runtime of the process that
owns the queue's delivery (``partq.delivery.LocalEndpoint``), or a connection to that process
(a flow served over a socket). Both speak the same narrow interface, so a flow behaves the same
wherever it is bound.

Thread-safety: a Flow may be used from several threads.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from partq.message import FlowChangeUpdate, Message
from partq.pending import Pending


class FlowEndpoint(Protocol):
    """What a ``Flow`` needs from whoever delivers to it."""

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` s for the first."""

    def ack_async(self, msgs: Iterable[Message]):
        """Apply acks to delivery now; return a handle whose ``result()`` waits until they are
        durable (or None when there was nothing to write)."""

    def ack_through(self, partition: int, seq: int):
        """Ack every message of ``partition`` up to ``seq``; a handle like ``ack_async``'s."""

    def nack(self, msg: Message) -> None: ...
    def unbind(self) -> None: ...
    def partitions(self) -> frozenset[int]: ...
    def events(self) -> list[FlowChangeUpdate]: ...
    def unacked(self) -> int: ...
    def closed(self) -> bool: ...
    def closed_reason(self) -> str | None: ...
    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None: ...


class Flow:
    def __init__(self, endpoint: FlowEndpoint, flow_id: str, queue: str, name: str | None,
                 skip_corrupt: bool = False) -> None:
        self._endpoint = endpoint
        self.flow_id = flow_id
        self.queue = queue
        self.name = name
        self.skip_corrupt = skip_corrupt

    # ------------------------------------------------------------------ state
    @property
    def partitions(self) -> frozenset[int]:
        """The partitions assigned to this flow now: keep it as the hint for a rebind (S15). On an
        exclusive queue the active flow holds ``{PARENT}``, the parent queue's log."""
        return self._endpoint.partitions()

    @property
    def active(self) -> bool:
        """True while the flow holds partitions; a standby (S11) is inactive."""
        return bool(self.partitions)

    @property
    def closed(self) -> bool:
        return self._endpoint.closed()

    @property
    def closed_reason(self) -> str | None:
        """Why the flow was unbound (None while it is bound)."""
        return self._endpoint.closed_reason()

    @property
    def unacked(self) -> int:
        return self._endpoint.unacked()

    def events(self) -> list[FlowChangeUpdate]:
        """FlowChangeUpdate events since the last call (active/inactive transitions)."""
        return self._endpoint.events()

    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None:
        """Call ``callback(update)`` on every FlowChangeUpdate. It runs while delivery state is
        locked: keep it short and do not call back into the broker from it."""
        self._endpoint.on_change(callback)

    # ------------------------------------------------------------------ consume
    def receive(self, max_messages: int = 100, timeout: float = 0.0) -> list[Message]:
        """Up to ``max_messages`` messages from this flow's partitions, in order per partition.

        Returns as soon as at least one message is available, or an empty list once ``timeout``
        seconds (real time) passed; ``timeout=0`` never blocks. Bounded by
        ``max_delivered_unacked_per_flow`` (S14). A waiting receive sleeps: it wakes for new
        messages, a change of its partitions or a due timer, and looks for other processes'
        publishes every 20 ms at the cost of one read of the store's version.
        """
        return self._endpoint.receive(max_messages, timeout)

    def messages(self, batch: int = 100, stop: threading.Event | None = None,
                 poll: float = 0.2) -> Iterator[Message]:
        """Iterate over messages until the flow is unbound or ``stop`` is set. The caller acks."""
        while not self.closed and not (stop is not None and stop.is_set()):
            yield from self.receive(batch, timeout=poll)

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
        return Pending(self._endpoint.ack_async(msgs))

    def ack_through(self, partition: int, seq: int) -> Pending:
        """Acknowledge every message of ``partition`` (one this flow holds) up to ``seq``, in
        one commit, whether it was received through this flow or read from the log directly
        (a consumer of ranges, such as Spark's stream). Fenced like ``ack_many`` (S33): raises
        ``FlowFenced`` when the flow does not hold the partition. Durable once ``result()``
        returns."""
        return Pending(self._endpoint.ack_through(partition, seq))

    def nack(self, msg: Message) -> None:
        """Return ``msg`` for redelivery (with every later unacked message of its partition)."""
        self._endpoint.nack(msg)

    def unbind(self) -> None:
        """Leave the queue. Unacked messages go to whoever takes the partitions, marked
        redelivered. A named flow that binds again within the rebalance delay gets them back."""
        self._endpoint.unbind()

    def __enter__(self) -> Flow:
        return self

    def __exit__(self, *exc) -> None:
        self.unbind()

    def __repr__(self) -> str:
        return (f"<Flow {self.name or self.flow_id} of {self.queue!r} "
                f"partitions={sorted(self.partitions)}{' closed' if self.closed else ''}>")
