"""The endpoint of a flow bound in the process that runs its queue's delivery: what ``Flow``
calls, bound to that flow's runtime and state in the delivery of this process (the
``Dispatcher``, which it knows only as the ``FlowDelivery`` it declares here)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from partq.delivery.flow_state import FlowState
from partq.message import FlowChangeUpdate, Message
from partq.pending import WriteHandle

if TYPE_CHECKING:
    from partq.delivery.queue_delivery import QueueDelivery


class FlowDelivery(Protocol):
    """What a ``LocalEndpoint`` calls in the delivery that owns its flow (``Dispatcher``): each
    takes the flow's queue runtime and state, under the delivery's lock, and raises what the
    matching ``FlowEndpoint`` method documents."""

    def receive(self, qd: QueueDelivery, state: FlowState, max_messages: int,
                timeout: float) -> list[Message]: ...

    def ack_async(self, qd: QueueDelivery, state: FlowState, msgs: Iterable[Message],
                  commit_here: bool = False) -> WriteHandle | None: ...

    def ack_through(self, qd: QueueDelivery, state: FlowState, partition: int,
                    seq: int) -> WriteHandle | None: ...

    def nack(self, qd: QueueDelivery, state: FlowState, msg: Message,
             delay: float | None) -> list[int]: ...

    def reject(self, qd: QueueDelivery, state: FlowState, msg: Message,
               headers: dict | None = None) -> None: ...

    def unbind(self, qd: QueueDelivery, state: FlowState, leave: bool = False) -> None: ...

    def partitions(self, qd: QueueDelivery, state: FlowState) -> frozenset[int]: ...

    def events(self, state: FlowState) -> list[FlowChangeUpdate]: ...


class LocalEndpoint:
    """A flow's endpoint in the process that runs its queue's delivery: the ``FlowEndpoint``
    its ``Flow`` calls (``partq.flow`` documents each method)."""

    __slots__ = ("_delivery", "_qd", "_state")

    def __init__(self, delivery: FlowDelivery, qd: QueueDelivery, state: FlowState) -> None:
        self._delivery, self._qd, self._state = delivery, qd, state

    @property
    def flow_id(self) -> str:
        return self._state.flow_id

    def delivered_by(self) -> tuple[FlowDelivery, QueueDelivery, FlowState]:
        """The delivery, queue runtime and flow state it is bound to (a transaction takes its
        part under that delivery's lock: ``partq.delivery.txn_parts``)."""
        return self._delivery, self._qd, self._state

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        return self._delivery.receive(self._qd, self._state, max_messages, timeout)

    def ack_async(self, msgs: Iterable[Message], commit_here: bool = False) -> WriteHandle | None:
        return self._delivery.ack_async(self._qd, self._state, msgs, commit_here)

    def ack_through(self, partition: int, seq: int) -> WriteHandle | None:
        return self._delivery.ack_through(self._qd, self._state, partition, seq)

    def nack(self, msg: Message, delay: float | None = None) -> list[int]:
        return self._delivery.nack(self._qd, self._state, msg, delay)

    def reject(self, msg: Message, headers: dict | None = None) -> None:
        self._delivery.reject(self._qd, self._state, msg, headers)

    def unbind(self, leave: bool = False) -> None:
        self._delivery.unbind(self._qd, self._state, leave)

    def partitions(self) -> frozenset[int]:
        return self._delivery.partitions(self._qd, self._state)

    def events(self) -> list[FlowChangeUpdate]:
        return self._delivery.events(self._state)

    def unacked(self) -> int:
        return 0 if self._state.closed else self._state.inflight

    def closed(self) -> bool:
        return self._state.closed

    def closed_reason(self) -> str | None:
        return self._state.closed_reason

    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None:
        self._state.on_change = callback
