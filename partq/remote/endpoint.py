"""A flow served by ``partq serve`` over a client's connection: the ``FlowEndpoint`` a remote
``Flow`` calls (``RemoteEndpoint``) and the answer to a request (``RemotePending``). A server's
error frame is raised as the error it stands for (``error_from_frame``): the same class, with
the same fields, as the server raised."""
from __future__ import annotations

import threading
import time
from _thread import allocate_lock
from collections import deque
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, Protocol

from partq import errors
from partq.delivery.flow_state import fenced_error, fenced_range
from partq.errors import FlowClosed, InvalidAck, PartqError, ServerUnavailable
from partq.flow import PollWatch
from partq.message import FlowChangeUpdate, Message
from partq.remote.inbox import Inbox, deliveries
from partq.wire.error_frames import error_from_frame

ACK_CHUNK = 50_000     # acks per request: a server reads at most 131,072 items an array
_ID = itemgetter(1, 2)      # a message's (partition, seq)
_QUEUE = itemgetter(0)


class AllOf:
    """The acks of one ``ack_many`` sent as several requests: done when all are, raising the
    first error."""

    __slots__ = ("_handles",)

    def __init__(self, handles: list[RemotePending]) -> None:
        self._handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self._handles)

    def result(self, timeout: float | None = None):
        for h in self._handles:
            h.result(timeout)
        return None


class RemotePending:
    """The answer to a request, once it comes (``Pending``'s interface). A bare lock, not an
    Event: a pipelining publisher makes one per message, and an Event (a Condition and two
    locks) was an eighth of its CPU."""

    __slots__ = ("_done", "_value", "_error", "_convert")

    def __init__(self, convert=lambda frame: frame) -> None:
        self._done = allocate_lock()
        self._done.acquire()
        self._value: object = None
        self._error: BaseException | None = None
        self._convert = convert

    def resolve(self, frame: dict | None, error: BaseException | None = None) -> None:
        if not self._done.locked():
            return                      # answered already: the first answer stands
        value = None
        if error is None and frame is not None and frame.get("op") == "error":
            error = error_from_frame(frame)
        if error is None:
            try:
                value = self._convert(frame)
            except Exception as exc:  # a malformed answer reaches its caller
                error = errors.ProtocolMismatch(f"malformed answer from the server: {exc!r}")
        self._settle(value, error)

    def set(self, value: object) -> None:
        """Resolve with ``value`` itself, not converted (an answer already taken apart)."""
        if self._done.locked():
            self._settle(value, None)

    def _settle(self, value: object, error: BaseException | None) -> None:
        self._value, self._error = value, error
        try:
            self._done.release()
        except RuntimeError:            # a second answer raced this one and won
            pass

    def done(self) -> bool:
        return not self._done.locked()

    def result(self, timeout: float | None = None):
        if not self._done.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            raise ServerUnavailable(f"no answer from the server within {timeout:g} s")
        self._done.release()
        if self._error is not None:
            raise self._error
        return self._value


class Connection(Protocol):
    """What a ``RemoteEndpoint`` asks of the connection it is bound over (``Client``)."""

    def request(self, frame: dict, convert: Callable[[dict], object]) -> RemotePending:
        """Send a request; the handle's ``result()`` gives ``convert(answer)``."""

    def call(self, frame: dict, convert: Callable[[dict], object] = ...) -> Any:
        """Send a request and wait for ``convert(answer)`` (the answer itself by default); an
        error answer raises its error. ``convert`` runs in the connection's reading thread,
        before it reads the next frame."""

    def attach(self, flow_id: str, endpoint: RemoteEndpoint, consumer_timeout: float) -> None:
        """Route the pushes of ``flow_id`` to ``endpoint``."""

    def detach(self, flow_id: str) -> None:
        """Stop routing the pushes of ``flow_id``."""


class RemoteEndpoint:
    """A flow served over a connection: the ``FlowEndpoint`` its ``Flow`` calls (``partq.flow``
    documents each method). Messages the server pushed wait in ``buffer`` until received. Once
    the flow is closed it hands out nothing more, and refuses acks and nacks at once, as its
    server would (``FlowFenced``: it holds nothing)."""

    def __init__(self, client: Connection, queue: str, name: str | None,
                 skip_corrupt: bool) -> None:
        self.client, self.queue, self.name, self.skip_corrupt = client, queue, name, skip_corrupt
        self.flow_id = ""
        self._cond = threading.Condition()
        self._inbox = Inbox()           # pushed, not received yet
        self._unacked: set[tuple[int, int]] = set()
        self._through: dict[int, int] = {}        # partition -> acked up to (ack_through)
        self._partitions: frozenset[int] = frozenset()
        self._events: deque[FlowChangeUpdate] = deque()
        self._callback: Callable[[FlowChangeUpdate], None] | None = None
        self._error: PartqError | None = None
        self._reason: str | None = None
        self._poll = PollWatch(time.monotonic())     # rule `max-poll-interval`
        self._max_poll = 0.0

    def bind(self, hint: list[int] | None) -> None:
        """Bind the flow on the server; raises the server's error (``QueueNotFound``...)."""
        self.client.call({"op": "bind", "queue": self.queue, "name": self.name, "hint": hint,
                          "skip_corrupt": self.skip_corrupt}, self._bound)

    def _bound(self, reply: dict) -> None:
        """Take the bind's answer. It runs in the client's reading thread, so the flow's pushes
        are routed here before that thread reads the next frame: its first delivery follows the
        answer at once and would otherwise find no flow to go to."""
        with self._cond:
            self.flow_id = str(reply["flow"])
            self._partitions = frozenset(reply["partitions"])
            self._max_poll = float(reply.get("max_poll_interval", 0.0))
        self.client.attach(self.flow_id, self, float(reply.get("consumer_timeout", 10.0)))

    def rebind(self) -> None:
        """After a reconnect: bind again under the name, presenting the partition set."""
        self.bind(sorted(self._partitions) or None)

    def disconnected(self) -> None:
        """What was pushed and not received comes again (marked) after the rebind."""
        with self._cond:
            self._inbox.clear()

    def lost(self, reason: str) -> None:
        with self._cond:
            self._reason = reason
            self._cond.notify_all()

    def pushed(self, frame: dict) -> None:
        op = frame.get("op")
        with self._cond:
            if op == "deliver":
                msgs, through = deliveries(self.queue, frame["messages"]), self._through
                if through:         # acked by ack_through while they were on their way
                    msgs = [m for m in msgs if m.seq > through.get(m.partition, -1)]
                self._inbox.add(frame["n"], msgs)
            elif op == "state":
                self._held(frozenset(frame["partitions"]))
            elif op == "event":
                update = FlowChangeUpdate(bool(frame["active"]), frozenset(frame["partitions"]))
                self._held(update.partitions)
                self._events.append(update)
                if self._callback is not None:
                    self._callback(update)
            elif op == "closed":
                self._reason = str(frame.get("reason", "unbound by the server"))
                self.client.detach(self.flow_id)
            elif op == "error":
                self._error = error_from_frame(frame)
            self._cond.notify_all()

    def _held(self, partitions: frozenset[int]) -> None:
        """The flow's partitions changed (under the lock): what was pushed from one it no longer
        holds is not handed out; the partition's new flow gets it (redelivered)."""
        self._partitions = partitions
        if not self._inbox.partitions() <= partitions:
            self._inbox.drop(lambda n, m: m.partition not in partitions)

    # the FlowEndpoint interface ------------------------------------------------
    def hung(self) -> str | None:
        """Why this flow must be unbound now (its handler hangs: rule `max-poll-interval`), or
        None. The client's heartbeat thread asks; the server cannot tell, as its pushes keep the
        flow busy on its side."""
        with self._cond:
            if self._reason is not None:
                return None
            return self._poll.hung(time.monotonic(), self._max_poll, len(self._unacked))

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        try:
            self._poll.receiving += 1
            return self._receive(max_messages, timeout)
        finally:
            self._poll.receiving -= 1
            self._poll.touch(time.monotonic())

    def _receive(self, max_messages: int, timeout: float) -> list[Message]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._reason is not None:
                    raise FlowClosed(f"flow {self.name or self.flow_id} of queue {self.queue!r} "
                                     f"is unbound: {self._reason}; bind again")
                if self._error is not None:
                    err, self._error = self._error, None
                    raise err
                if self._inbox:
                    out = self._inbox.take(max_messages)
                    self._unacked.update(map(_ID, out))
                    return out
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cond.wait(remaining)

    def _refuse(self, msgs: list[Message], verb: str) -> None:
        """Raise what the server would for acks or nacks of ``msgs``: ``InvalidAck`` for a
        message of another queue, ``FlowFenced`` once the flow is closed."""
        if set(map(_QUEUE, msgs)) - {self.queue}:
            m = next(m for m in msgs if m.queue != self.queue)
            raise InvalidAck(f"message of queue {m.queue!r} {verb} on a flow of "
                             f"{self.queue!r}")
        if self._reason is not None:
            raise fenced_error(self.queue, self, msgs, verb)

    def ack_async(self, msgs: Iterable[Message], commit_here: bool = False) -> RemotePending | AllOf:
        """``commit_here`` means nothing here: the server commits."""
        self._poll.touch(time.monotonic())
        msgs = msgs if type(msgs) is list else list(msgs)
        self._refuse(msgs, "acked")
        handles = []
        for start in range(0, max(len(msgs), 1), ACK_CHUNK):   # each request within the
            ids = list(map(_ID, msgs[start:start + ACK_CHUNK]))     # server's per-array
            handles.append(self.client.request({"op": "ack", "flow": self.flow_id, "ids": ids},
                                               self._confirmer(ids)))   # bound: (partition, seq)
        return handles[0] if len(handles) == 1 else AllOf(handles)

    def _confirmer(self, acked: Iterable[tuple[int, int]]):
        """The conversion of an ack's answer: ``acked`` are no longer unacked."""
        return lambda frame: self._confirmed(acked)

    def _confirmed(self, acked: Iterable[tuple[int, int]]) -> None:
        """The server made acks of ``acked`` durable (the reading thread; a refusal never gets
        here): they are no longer unacked."""
        with self._cond:
            self._unacked.difference_update(acked)

    def ack_through(self, partition: int, seq: int) -> RemotePending:
        if self._reason is not None:
            raise fenced_range(self.queue, self, partition, seq)
        with self._cond:       # acked: what was pushed (or is on its way) and not received goes
            self._through[partition] = max(self._through.get(partition, -1), seq)
            self._inbox.drop(lambda n, m: m.partition == partition and m.seq <= seq)
            acked = {(p, s) for p, s in self._unacked if p == partition and s <= seq}
        return self.client.request({"op": "ack_through", "flow": self.flow_id,
                                    "partition": partition, "seq": seq},
                                   lambda frame: self._confirmed(acked))

    def nack(self, msg: Message, delay: float | None = None) -> list[int]:
        self._poll.touch(time.monotonic())
        self._refuse([msg], "nacked")
        reply = self.client.call({"op": "nack", "flow": self.flow_id,
                                  "id": [msg.partition, msg.seq], "delay": delay})
        back = reply.get("back")
        if not isinstance(back, list):     # a server before "back": partition order
            back = sorted(s for p, s in self._unacked if p == msg.partition and s >= msg.seq)
        self._given_back(msg.partition, set(back), reply.get("upto", 0))
        return back

    def reject(self, msg: Message, headers: dict | None = None) -> None:
        self._poll.touch(time.monotonic())
        self._refuse([msg], "rejected")
        frame: dict = {"op": "reject", "flow": self.flow_id, "id": [msg.partition, msg.seq]}
        if headers:
            frame["headers"] = headers
        self.client.call(frame)
        with self._cond:
            self._unacked.discard((msg.partition, msg.seq))

    def transaction_settled(self, msg: Message, verb: str, done: dict | None) -> None:
        """A transaction acked, nacked or rejected ``msg`` (``done``: its answer for this flow,
        what a nack gave back and the last deliver frame sent before; None when it had
        committed before, on a connection since lost)."""
        if verb != "nacked":
            with self._cond:
                self._unacked.discard((msg.partition, msg.seq))
            return
        for partition, seq, back in (done or {}).get("back", []):
            if (partition, seq) == (msg.partition, msg.seq):
                self._given_back(partition, set(back), int(done["upto"]))   # type: ignore[index]

    def _given_back(self, partition: int, back: set[int], upto: int) -> None:
        with self._cond:       # the copies the nack gives back come again, marked
            self._inbox.drop(lambda n, m: n <= upto and m.partition == partition
                             and m.seq in back)
            self._unacked = {(p, s) for p, s in self._unacked
                             if not (p == partition and s in back)}

    def unbind(self, reason: str = "unbound by the application", leave: bool = False) -> None:
        with self._cond:
            if self._reason is not None:
                return
            self._reason = reason
            self._inbox.clear()
        self.client.detach(self.flow_id)
        frame: dict = {"op": "unbind", "flow": self.flow_id}
        if leave:
            frame["leave"] = True
        try:
            self.client.call(frame)
        except ServerUnavailable:
            pass           # the connection is gone: the server unbound it already

    def partitions(self) -> frozenset[int]:
        return frozenset() if self._reason is not None else self._partitions

    def events(self) -> list[FlowChangeUpdate]:
        with self._cond:
            out = list(self._events)
            self._events.clear()
            return out

    def unacked(self) -> int:
        return 0 if self._reason is not None else len(self._unacked)

    def closed(self) -> bool:
        return self._reason is not None

    def closed_reason(self) -> str | None:
        return self._reason

    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None:
        self._callback = callback
