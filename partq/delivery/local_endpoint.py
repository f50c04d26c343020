"""The endpoint of a flow bound in the process that runs its queue's delivery: what ``Flow``
calls, bound to that flow's runtime and state in the dispatcher."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from partq.message import FlowChangeUpdate, Message

if TYPE_CHECKING:
    from partq.delivery.dispatcher import Dispatcher
    from partq.delivery.flow_state import FlowState
    from partq.delivery.queue_delivery import QueueDelivery


class LocalEndpoint:
    """A flow's endpoint in the process that runs its queue's delivery: ``Flow`` calls these;
    a remote flow's endpoint offers the same methods over a connection."""

    __slots__ = ("_dispatcher", "_qd", "_state")

    def __init__(self, dispatcher: Dispatcher, qd: QueueDelivery, state: FlowState) -> None:
        self._dispatcher, self._qd, self._state = dispatcher, qd, state

    @property
    def flow_id(self) -> str:
        return self._state.flow_id

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        return self._dispatcher.receive(self._qd, self._state, max_messages, timeout)

    def ack_async(self, msgs: Iterable[Message]):
        return self._dispatcher.ack_async(self._qd, self._state, msgs)

    def ack_through(self, partition: int, seq: int):
        return self._dispatcher.ack_through(self._qd, self._state, partition, seq)

    def nack(self, msg: Message) -> None:
        self._dispatcher.nack(self._qd, self._state, msg)

    def unbind(self) -> None:
        self._dispatcher.unbind(self._qd, self._state)

    def partitions(self) -> frozenset[int]:
        return self._dispatcher.partitions(self._qd, self._state)

    def events(self) -> list[FlowChangeUpdate]:
        return self._dispatcher.events(self._state)

    def unacked(self) -> int:
        return self._state.inflight

    def closed(self) -> bool:
        return self._state.closed

    def closed_reason(self) -> str | None:
        return self._state.closed_reason

    def on_change(self, callback) -> None:
        self._state.on_change = callback
