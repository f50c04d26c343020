"""One flow of a queue whose delivery another process owns, as its ``Flow`` sees it: the
``FlowEndpoint`` that forwards to its ``PeerQueue`` (``follower.py``), or, after this process
took delivery over, to a local endpoint."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from partq import errors
from partq.delivery.cursor import Cursor
from partq.message import FlowChangeUpdate, Message

if TYPE_CHECKING:
    from partq.delivery.peers.peer_delivery import PeerQueue


class PeerFlow:
    """A flow bound through the owner's control channel; the endpoint its ``Flow`` calls.
    After a failover that made this process the owner it delegates to a local endpoint."""

    def __init__(self, group: PeerQueue, flow_id: str, name: str | None,
                 skip_corrupt: bool) -> None:
        self.group = group
        self.flow_id = flow_id
        self.name = name
        self.queue = group.queue
        self.skip_corrupt = skip_corrupt
        self.cursors: dict[int, Cursor] = {}
        self.resync: set[int] = set()   # partitions whose cursor must be rebuilt from the store
        self.inflight = 0
        self.rr = 0
        self.pending_error: errors.CorruptRecord | None = None
        self.reason: str | None = None      # why it was unbound (None while bound)
        self.last_partitions: frozenset[int] = frozenset()
        self.pending_events: deque[FlowChangeUpdate] = deque()
        self.callback: Callable[[FlowChangeUpdate], None] | None = None
        self.local = None            # the LocalEndpoint after this process took delivery over

    # the FlowEndpoint interface ------------------------------------------------
    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        dispatcher = self.group.dispatcher

        def collect(max_messages: int) -> list[Message] | None:
            if self.local is not None:
                return None
            return self.group.collect(self, max_messages)
        msgs = dispatcher.wait_for_messages(collect, max_messages, timeout)
        if msgs is None and self.local is not None:   # taken over meanwhile: it receives
            return self.local.receive(max_messages, timeout)
        if msgs:
            dispatcher.tally.delivered(self.queue, msgs)
        return msgs or []

    def ack_async(self, msgs: Iterable[Message]):
        if self.local is not None:
            return self.local.ack_async(msgs)
        return self.group.ack(self, list(msgs))

    def ack_through(self, partition: int, seq: int):
        if self.local is not None:
            return self.local.ack_through(partition, seq)
        return self.group.ack_through(self, partition, seq)

    def nack(self, msg: Message) -> None:
        if self.local is not None:
            return self.local.nack(msg)
        self.group.nack(self, msg)
        self.group.dispatcher.tally.nacked(self.queue)

    def unbind(self) -> None:
        if self.local is not None:
            return self.local.unbind()
        self.group.unbind(self)

    def partitions(self) -> frozenset[int]:
        if self.local is not None:
            return self.local.partitions()
        return self.group.partitions(self)

    def events(self) -> list[FlowChangeUpdate]:
        if self.local is not None:
            return self.local.events()
        with self.group.lock:
            out = list(self.pending_events)
            self.pending_events.clear()
            return out

    def unacked(self) -> int:
        return self.local.unacked() if self.local is not None else self.inflight

    def closed(self) -> bool:
        if self.local is not None:
            return self.local.closed()
        return self.reason is not None

    def closed_reason(self) -> str | None:
        return self.local.closed_reason() if self.local is not None else self.reason

    def on_change(self, callback) -> None:
        self.callback = callback
        if self.local is not None:
            self.local.on_change(callback)

    def changed(self, update: FlowChangeUpdate) -> None:
        self.pending_events.append(update)
        if self.callback is not None:
            self.callback(update)

    def close(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.inflight = 0
        self.cursors.clear()
