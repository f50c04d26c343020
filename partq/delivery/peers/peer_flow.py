"""One flow of a queue whose delivery another process owns, as its ``Flow`` sees it: the
``FlowEndpoint`` that forwards to the group of this process's flows of that queue (``PeerQueue``
in ``peer_delivery.py``, known here only as the ``PeerGroup`` declared below), or, after this
process took delivery over, to a local endpoint.

Its delivery state (why it was unbound, and in ``PeerCursors``, ``peer_cursors.py``: the cursors
of the partitions it holds, how many messages it has in flight) changes only through the
methods under "state transitions" there and here, each one step of its life; ``PeerQueue``
calls them under its lock."""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Protocol

from partq.delivery.peers.peer_cursors import PeerCursors
from partq.delivery.txn_parts import TxnPart
from partq.errors import CorruptRecord, FlowClosed
from partq.flow import FlowEndpoint, PollWatch
from partq.message import FlowChangeUpdate, Message
from partq.pending import WriteHandle


class PeerGroup(Protocol):
    """What a ``PeerFlow`` asks of the group of its process's flows of one queue
    (``PeerQueue``): the ``FlowEndpoint`` calls that need the store or the owner. Each raises
    what ``partq.flow.FlowEndpoint`` documents for it."""

    def receive(self, flow: PeerFlow, max_messages: int, timeout: float) -> list[Message] | None:
        """Messages for ``flow``, waiting as ``FlowEndpoint.receive`` does; None when the flow
        was handed over to this process's own delivery meanwhile (ask that instead)."""

    def ack(self, flow: PeerFlow, msgs: list[Message],
            commit_here: bool = False) -> WriteHandle | None: ...

    def ack_through(self, flow: PeerFlow, partition: int, seq: int) -> WriteHandle | None: ...

    def nack(self, flow: PeerFlow, msg: Message, delay: float | None) -> list[int]: ...

    def reject(self, flow: PeerFlow, msg: Message, headers: dict | None = None) -> None: ...

    def unbind(self, flow: PeerFlow, *, leave: bool = False) -> None: ...

    def transaction_part(self, flow: PeerFlow, entries: list) -> TxnPart: ...

    def partitions(self, flow: PeerFlow) -> frozenset[int]: ...

    def now(self) -> float:
        """The time of the group's clock."""


class PeerFlow(PeerCursors):
    """A flow bound through the owner's control channel; the endpoint its ``Flow`` calls.
    After a failover that made this process the owner it forwards to a local endpoint. Its
    cursors, and the steps that change them, are ``PeerCursors``'."""

    def __init__(self, group: PeerGroup, queue: str, flow_id: str, name: str | None,
                 skip_corrupt: bool) -> None:
        self._group = group
        self._flow_id = flow_id
        self.queue, self.name, self.skip_corrupt = queue, name, skip_corrupt   # never change
        self.pending_error: CorruptRecord | None = None   # set by Cursor.take; the next receive
        super().__init__()                                # raises it
        self._reason: str | None = None       # why it was unbound (None while bound)
        self._events: deque[FlowChangeUpdate] = deque()
        self._events_lock = threading.Lock()
        self._callback: Callable[[FlowChangeUpdate], None] | None = None
        self._local: FlowEndpoint | None = None       # after this process took delivery over
        self.poll = PollWatch(group.now())            # rule `max-poll-interval`
        self.seen_paused: frozenset[int] = frozenset()  # its partitions paused for a handoff, as
                                    # its last receive saw them (its reports say so)

    # the FlowEndpoint interface ------------------------------------------------
    @property
    def flow_id(self) -> str:
        return self._flow_id

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        while True:
            local = self._local
            if local is not None:
                return local.receive(max_messages, timeout)
            msgs = self._group.receive(self, max_messages, timeout)
            if msgs is not None:
                return msgs

    def ack_async(self, msgs: Iterable[Message], commit_here: bool = False) -> WriteHandle | None:
        local = self._local
        if local is not None:
            return local.ack_async(msgs, commit_here)
        return self._group.ack(self, list(msgs), commit_here)

    def ack_through(self, partition: int, seq: int) -> WriteHandle | None:
        local = self._local
        if local is not None:
            return local.ack_through(partition, seq)
        return self._group.ack_through(self, partition, seq)

    def nack(self, msg: Message, delay: float | None = None) -> list[int]:
        local = self._local
        if local is not None:
            return local.nack(msg, delay)
        return self._group.nack(self, msg, delay)

    def reject(self, msg: Message, headers: dict | None = None) -> None:
        local = self._local
        if local is not None:
            return local.reject(msg, headers)
        self._group.reject(self, msg, headers)

    def unbind(self, leave: bool = False) -> None:
        local = self._local
        if local is not None:
            return local.unbind(leave=leave)
        self._group.unbind(self, leave=leave)

    def local_endpoint(self) -> FlowEndpoint | None:
        """The local endpoint it forwards to once this process took delivery over, or None."""
        return self._local

    def transaction_part(self, entries: list) -> TxnPart:
        """Its part of a transaction (``PeerAcks.transaction_part``); not handed over."""
        return self._group.transaction_part(self, entries)

    def partitions(self) -> frozenset[int]:
        local = self._local
        if local is not None:
            return local.partitions()
        return self._group.partitions(self)

    def events(self) -> list[FlowChangeUpdate]:
        local = self._local
        if local is not None:
            return local.events()
        with self._events_lock:
            out = list(self._events)
            self._events.clear()
            return out

    def unacked(self) -> int:
        local = self._local
        return local.unacked() if local is not None else self._inflight

    def closed(self) -> bool:
        local = self._local
        return local.closed() if local is not None else self._reason is not None

    def closed_reason(self) -> str | None:
        local = self._local
        return local.closed_reason() if local is not None else self._reason

    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None:
        self._callback = callback
        local = self._local
        if local is not None:
            local.on_change(callback)

    # state transitions (under the PeerQueue's lock) ----------------------------
    @property
    def bound(self) -> bool:
        """Not unbound yet (by the application, the owner, or this process's close)."""
        return self._reason is None

    @property
    def handed_over(self) -> bool:
        """This process took delivery over: the flow lives in its own delivery now."""
        return self._local is not None

    def hint(self) -> list[int] | None:
        """The partitions it last held, to present when it is bound again (rule `bind-hint`)."""
        return sorted(self._held) or None

    def held(self, partitions: frozenset[int]) -> None:
        """The owner's stored assignment gives it ``partitions`` now."""
        if self._reason is None:
            self._held = partitions

    def changed(self, update: FlowChangeUpdate) -> None:
        """The owner pushed a FlowChangeUpdate."""
        with self._events_lock:
            self._events.append(update)
        callback = self._callback
        if callback is not None:
            callback(update)

    def close(self, reason: str) -> None:
        """It is unbound (the first reason stays): it holds nothing, nothing is in flight."""
        if self._reason is None:
            self._reason = reason
        self._forget_cursors()

    def rebound(self, flow_id: str) -> None:
        """A new owner bound it again under ``flow_id``: under the new epochs its partitions
        are delivered again from their ack floors."""
        self._flow_id = flow_id
        self._forget_cursors()

    def hand_over(self, local: FlowEndpoint) -> bool:
        """This process took delivery over and bound the flow in it as ``local``: every call
        goes there from now on. False, changing nothing, when it was unbound meanwhile."""
        if self._reason is not None:
            return False
        if self._callback is not None:
            local.on_change(self._callback)
        self._local = local
        self._forget_cursors()
        return True

    def check_receivable(self) -> None:
        """Raise what a receive must raise before anything: ``FlowClosed`` once unbound, else
        the corrupt record an earlier receive met (once)."""
        if self._reason is not None:
            raise FlowClosed(f"flow {self.name or self._flow_id} of queue {self.queue!r} is "
                             f"unbound: {self._reason}; bind again")
        self.raise_pending_error()

    def raise_pending_error(self) -> None:
        err, self.pending_error = self.pending_error, None
        if err is not None:
            raise err
