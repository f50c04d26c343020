"""One bound flow as its queue's runtime keeps it (``FlowState``), how the owner reaches a flow
of another process (``PeerSink``), and the ``FlowFenced`` errors of acks a flow may not make."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from partq.errors import CorruptRecord, FlowFenced
from partq.flow import PollWatch
from partq.message import FlowChangeUpdate, Message


def positions(msgs: list[Message]) -> str:
    """The first five messages as partition/seq, for an error ("0/3, 1/7 ...")."""
    return ", ".join(f"{m.partition}/{m.seq}" for m in msgs[:5]) + (" ..." if len(msgs) > 5 else "")


def fenced_error(queue: str, flow, msgs: list[Message], verb: str) -> FlowFenced:
    where = positions(msgs)
    return FlowFenced(
        f"flow {flow.name or flow.flow_id} of queue {queue!r} no longer holds the partition of "
        f"{len(msgs)} message(s) it {verb} (partition/seq {where}): nothing was {verb}; the "
        f"partition's current flow gets them redelivered", msgs)


def dead_error(queue: str, flow, msgs: list[Message]) -> FlowFenced:
    """The error of an ack naming messages that died since they were handed out."""
    where = positions(msgs)
    return FlowFenced(
        f"flow {flow.name or flow.flow_id} of queue {queue!r} acked {len(msgs)} message(s) that "
        f"died after it got them (expired, past max_redelivery, or rejected or killed: "
        f"partition/seq {where}): nothing of the batch was acked; they are in the dead message "
        f"queue (or were discarded, without one)", msgs)


def fenced_range(queue: str, flow, sp: int, seq: int) -> FlowFenced:
    """The error of an ``ack_through`` of a partition the flow does not hold."""
    return FlowFenced(f"flow {flow.name or flow.flow_id} of queue {queue!r} does not hold "
                      f"partition {sp}: nothing up to seq {seq} was acked; read it again from "
                      f"the flow's partitions")


class PeerSink(Protocol):
    """How the owner tells a flow of another process about changes (a control connection)."""

    def event(self, flow_id: str, update: FlowChangeUpdate) -> None: ...
    def closed(self, flow_id: str, reason: str) -> None: ...


class FlowState:
    """The delivery state of one bound flow, kept by its queue's runtime (the ``Flow`` a user
    holds is a handle on it). Changed only under the dispatcher's lock."""

    __slots__ = ("flow_id", "name", "queue", "skip_corrupt", "inflight", "rr", "pending_error",
                 "closed_reason", "events", "on_change", "remote", "reported", "reported_held",
                 "client", "poll")

    def __init__(self, flow_id: str, name: str | None, queue: str, skip_corrupt: bool,
                 remote: PeerSink | None = None, client: str | None = None,
                 now: float = 0.0) -> None:
        self.poll = PollWatch(now)        # its application's last call (rule `max-poll-interval`)
        self.flow_id, self.name, self.queue, self.skip_corrupt = flow_id, name, queue, skip_corrupt
        self.inflight = 0                 # messages delivered to it and not acked
        self.rr = 0                       # where the next receive starts among its partitions
        self.pending_error: CorruptRecord | None = None   # raised by its next receive
        self.closed_reason: str | None = None             # set once it is unbound
        self.events: deque[FlowChangeUpdate] = deque()
        self.on_change: Callable[[FlowChangeUpdate], None] | None = None
        # A flow delivered by another process (``peers.peer_delivery``): that process reads and acks its
        # partitions itself and reports what it holds unacked per slot; the owner tells it of
        # changes through ``remote``.
        self.remote = remote
        self.reported: dict[int, int] = {}
        self.reported_held: dict[int, list] = {}    # slot -> what holds its messages back
        self.client = client              # "pid P on HOST" of the process the flow lives in

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    def close(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
            if self.remote is not None:
                self.remote.closed(self.flow_id, reason)

    def changed(self, update: FlowChangeUpdate) -> None:
        if self.remote is not None:
            self.remote.event(self.flow_id, update)
            return
        self.events.append(update)
        if self.on_change is not None:
            self.on_change(update)
