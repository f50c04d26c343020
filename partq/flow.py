"""A consumer flow: the handle ``Broker.bind`` returns. Receive, ack, nack, unbind.

A ``Flow`` is a thin handle over a ``FlowEndpoint``: the delivery runtime of the process that
owns the queue's delivery (``partq.delivery.LocalEndpoint``), a flow of another process of the
host served by that owner (``partq.delivery.peers.PeerFlow``), or a connection to ``partq
serve`` (``partq.remote.RemoteEndpoint``). All three speak the same narrow interface, so a flow
behaves the same wherever it is bound; ``FlowEndpoint`` says where they differ.

Thread-safety: a Flow may be used from several threads.
"""
from __future__ import annotations

import logging
import math
import operator
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from partq.clock import MAX_SECONDS
from partq.errors import FlowClosed, FlowFenced, InvalidAck, InvalidConfig, InvalidMessage
from partq.message import FlowChangeUpdate, Message
from partq.pending import Pending, WriteHandle
from partq.storage.encoding import check_headers

log = logging.getLogger("partq.flow")

U32 = (1 << 32) - 1         # the largest partition number storage holds
U64 = (1 << 64) - 1         # the largest sequence
MAX_RECEIPTS = 1 << 16      # receipts a flow keeps (``Flow.received_copy``)
_ID = operator.itemgetter(1, 2)         # a message's (partition, seq)
_COUNT = operator.itemgetter(8)         # its delivery count


class FlowEndpoint(Protocol):
    """What a ``Flow`` calls: one interface for the three places a flow can be bound.

    * ``partq.delivery.LocalEndpoint``: bound in the process that owns the queue's delivery.
    * ``partq.delivery.peers.PeerFlow``: bound in another process of the host (rule
      `peer-flows`). The owner assigns its partitions over the control channel and this process
      reads and acks them in the store itself; once a failover made this process the owner
      (rule `owner-takeover`) it forwards every call to a ``LocalEndpoint``.
    * ``partq.remote.RemoteEndpoint``: a flow of ``partq.connect`` served by ``partq serve``
      (rule `serve`). The server pushes messages within the flow's credit; they wait in a
      buffer until received.

    ``tests/broker/test_endpoint_contract.py`` runs one suite on all three.

    Threads: every method may be called from several threads at once (each endpoint guards its
    state with a lock); two receives at once share the messages out between them. The
    ``on_change`` callback runs on a delivery thread while delivery state is locked.

    Errors (``partq.errors``, all ``PartqError``):

    * ``FlowClosed``: ``receive`` on a flow that was unbound, by ``unbind``, by the close of its
      broker or client, by a queue delete or change of access type, by the owner after
      ``consumer_timeout`` without a sign of life (rule `liveness`), or, remote, when a
      reconnect could not bind it again. ``closed_reason`` says which.
    * ``FlowFenced``: an ack, ``ack_through`` or nack of a partition the flow does not hold
      (rule `fencing`): nothing changed, ``messages`` lists the refused messages, and the
      partition's current flow gets them redelivered. An unbound flow holds nothing, so every
      ack or nack after ``unbind`` raises it.
    * ``InvalidAck``: an ack of a message never delivered, or an ack or nack of a message of
      another queue.
    * ``CorruptRecord``: ``receive`` met a record that fails its checksum (not with
      ``skip_corrupt``); delivery of that partition stops there.
    * ``BrokerClosed``: the broker of this process (local, peer) or the client (remote) was
      closed. ``UsedAcrossFork``: local and peer, the broker was opened before a fork.
    * ``ServerUnavailable``: remote, the connection dropped before the answer (the request may
      or may not have taken effect) or was not back within the client's timeout.

    Where the endpoints differ, by design:

    * A refused ack raises from ``ack_async`` or ``ack_through`` itself when the endpoint can
      tell at once (always for a local flow, and for every flow once unbound), else from the
      handle's ``result()``: a peer flow whose partition moved between its check and its commit,
      a remote flow whose server refused. ``Flow.ack_many`` waits, so it raises either way.
      (``test_a_refused_ack_raises_from_the_call_or_from_its_result``)
    * ``unacked()`` drops when an ack is applied for a local or peer flow, and when its server
      confirmed it for a remote flow (``ack_many`` has returned by then either way).
    * ``partitions()`` is the owner's live assignment for a local flow, the assignment the owner
      last stored for a peer flow, and what the server last pushed for a remote flow: a peer or
      remote flow may learn of a move a moment later (it cannot ack there meanwhile: fenced).
    * ``flow_id`` of a peer or remote flow changes when a failover or a reconnect binds it
      again; the owner's status lists it under the new id.
    """

    @property
    def flow_id(self) -> str:
        """The id the owner knows the flow by (``FlowStatus.flow`` in ``queue_status``)."""

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` messages of the flow's partitions, in sequence order per
        partition, at most ``max_delivered_unacked_per_flow`` unacked (rule `max-unacked`).
        Returns once one is available, or [] after ``timeout`` seconds (0: never waits).
        ``Flow.receive`` checked both arguments. Raises ``FlowClosed`` once unbound,
        ``CorruptRecord``."""

    def ack_async(self, msgs: Iterable[Message], commit_here: bool = False) -> WriteHandle | None:
        """Ack ``msgs`` in one write, taken whole or not at all: acked messages are never
        delivered again, at once. Returns the write's handle, whose ``result()`` returns once
        it is durable, or None when there was nothing to write (all acked already). Raises
        ``FlowFenced``, ``InvalidAck`` (from here or from ``result()``, see above).
        ``commit_here``: the caller is about to wait for the write; an endpoint whose process
        writes it may commit it in the calling thread when no commit is under way."""

    def ack_through(self, partition: int, seq: int) -> WriteHandle | None:
        """Ack every message of ``partition`` up to ``seq``, delivered or not; a handle like
        ``ack_async``'s. Raises ``FlowFenced`` when the flow does not hold ``partition``."""

    def nack(self, msg: Message, delay: float | None = None) -> list[int]:
        """Give ``msg`` back: it and every later unacked message of its partition are delivered
        again, in order, marked redelivered (rule `partition-order`); only ``msg``'s delivery
        count grows. Its partition waits ``delay`` seconds first (None: the queue's redelivery
        delay rule; ``Flow.nack`` checked it). Under ``ordering="key"`` only ``msg``'s key
        comes back and waits. Returns, once the delivery count is durable, the seqs of the
        partition given back ([] for a message not in flight to this flow, ignored). Raises
        ``FlowFenced``, ``InvalidAck``."""

    def reject(self, msg: Message, headers: dict | None = None) -> None:
        """``msg`` is dead at once: removed from the queue and appended to its dead message
        queue in one commit (rule `dead-messages`), ``headers`` added to the dead copy's; the
        rest of its partition flows on. A message not in flight to this flow is ignored.
        Durable when it returns. Raises ``FlowFenced``, ``InvalidAck``."""

    def unbind(self, *, leave: bool = False) -> None:
        """Leave the queue: ``closed()`` turns True, ``partitions()`` empty, ``unacked()`` 0,
        and the unacked messages go to whoever takes the partitions, marked redelivered. Calling
        it again does nothing; it raises nothing for a flow that is already unbound.
        ``leave``: for good (rule `leave`): the partitions go to the other flows at once (or
        to the next to bind), no ghost waiting out the rebalance delay for this one."""

    def partitions(self) -> frozenset[int]:
        """The partitions the flow holds now (empty on a standby, and once unbound)."""

    def events(self) -> list[FlowChangeUpdate]:
        """The FlowChangeUpdate events since the last call, oldest first."""

    def unacked(self) -> int:
        """Messages received and neither acked nor nacked yet; a refused ack leaves them
        counted. 0 once unbound."""

    def closed(self) -> bool:
        """Whether the flow was unbound (for any reason: see ``FlowClosed``)."""

    def closed_reason(self) -> str | None:
        """Why the flow was unbound; None while it is bound."""

    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None:
        """Call ``callback(update)`` on every later FlowChangeUpdate (None: stop)."""


class PollWatch:
    """When a flow's application last called receive, ack, nack or reject, for the rule
    `max-poll-interval`: a flow that holds unacked messages and made no such call for that long
    has a handler that hangs, and is unbound so that its messages go to other consumers. A
    receive that is waiting counts as a call for as long as it waits. Each endpoint keeps one
    and checks it from its own background thread (the owner's ticker, a peer's control link, a
    client's heartbeat)."""

    __slots__ = ("last", "receiving")

    def __init__(self, now: float) -> None:
        self.last = now
        self.receiving = 0

    def touch(self, now: float) -> None:
        self.last = now

    def hung(self, now: float, interval: float, unacked: int) -> str | None:
        """Why the flow must be unbound now, or None."""
        idle = now - self.last
        if not interval or not unacked or self.receiving or idle < interval:
            return None
        return (f"it did not receive, ack or nack for {idle:.0f} s while holding {unacked} "
                f"unacked message(s) (max_poll_interval {interval:g} s): its handler may hang; "
                f"its messages go to other consumers")


class Flow:
    def __init__(self, endpoint: FlowEndpoint, queue: str, name: str | None,
                 skip_corrupt: bool = False) -> None:
        self._endpoint = endpoint
        self.flow_id = endpoint.flow_id     # the id it was bound under (see FlowEndpoint)
        self.queue = queue
        self.name = name
        self.skip_corrupt = skip_corrupt
        # (partition, seq) -> delivery count of what it received and did not settle yet: a
        # transaction finds the flow that received a message here (``BoundFlows``)
        self._receipts: dict[tuple[int, int], int] = {}
        # (partition, seq) given back by nacks since the last receive of ``messages``: copies
        # of them it received before are skipped (they come again, in order)
        self._given_back: set[tuple[int, int]] = set()

    # ------------------------------------------------------------------ transactions
    def endpoint(self) -> FlowEndpoint:
        """Where the flow is bound (a transaction commits through it)."""
        return self._endpoint

    def received_copy(self, msg: Message) -> bool:
        """Whether this flow received ``msg`` (this delivery of it) and has not acked, nacked
        or rejected it through itself."""
        return self._receipts.get((msg[1], msg[2])) == msg[8]

    def settled(self, msgs: Iterable[Message]) -> None:
        """``msgs`` were acked, nacked or rejected (by a transaction, or by this flow)."""
        pop = self._receipts.pop
        for m in msgs:
            pop((m[1], m[2]), None)

    # ------------------------------------------------------------------ state
    @property
    def partitions(self) -> frozenset[int]:
        """The partitions assigned to this flow now: keep it as the hint for a rebind (rule `bind-hint`). On
        an exclusive queue the active flow holds ``{PARENT}``, the parent queue's log."""
        return self._endpoint.partitions()

    @property
    def active(self) -> bool:
        """True while the flow holds partitions; a standby (rule `standby-flows`) is inactive."""
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
        seconds (real time) passed; ``timeout=0`` never blocks. A timeout longer than ten years
        (``math.inf`` too) waits ten years: for ever, in practice. Bounded by
        ``max_delivered_unacked_per_flow`` (rule `max-unacked`). A waiting receive sleeps: it wakes for new
        messages, a change of its partitions or a due timer, and looks for other processes'
        publishes every 20 ms at the cost of one read of the store's version.
        """
        if isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1:
            raise InvalidConfig(f"max_messages must be an integer >= 1, not {max_messages!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or math.isnan(timeout) or timeout < 0:
            raise InvalidConfig(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        msgs = self._endpoint.receive(max_messages, min(timeout, MAX_SECONDS))
        if msgs:
            receipts = self._receipts
            if len(receipts) > MAX_RECEIPTS:    # given back unsettled (a handoff, a nack
                for key in list(receipts)[:len(receipts) // 2]:     # of an earlier one)
                    del receipts[key]
            receipts.update(zip(map(_ID, msgs), map(_COUNT, msgs), strict=True))
        return msgs

    def messages(self, batch: int = 100, stop: threading.Event | None = None,
                 poll: float = 0.2) -> Iterator[Message]:
        """Iterate over messages until the flow is unbound or ``stop`` is set. The caller acks.
        A message given back by a nack of an earlier one (its partition's, or its key's) in
        the same batch is skipped: it comes again, in order."""
        while not self.closed and not (stop is not None and stop.is_set()):
            self._given_back.clear()    # what comes now came after every nack so far
            try:
                msgs = self.receive(batch, timeout=poll)
            except FlowClosed:
                return
            for msg in msgs:
                if (msg.partition, msg.seq) not in self._given_back:
                    yield msg

    def __iter__(self) -> Iterator[Message]:
        """``for msg in flow:`` receives until the flow is unbound (``messages``); ack, nack
        or reject each message in the loop's body."""
        return self.messages()

    def run(self, handler: Callable[[Message], None], stop: threading.Event | None = None,
            batch: int = 100) -> None:
        """Callback style: call ``handler(msg)`` for each message and ack it once the handler
        returned; a handler that raises gets the message nacked (redelivered, in order, after
        the queue's redelivery delay) and the loop goes on with the next message. With
        ``max_redelivery`` set, a message whose handler keeps raising ends in the dead message
        queue. Returns once the flow is unbound or ``stop`` is set. For retries with backoff,
        a dead message queue by default and handlers that run concurrently, use
        ``partq.Worker``."""
        for msg in self.messages(batch, stop):
            try:
                handler(msg)
            except Exception:
                log.warning("queue %r: handler raised on partition %d seq %d; the message is "
                            "nacked", self.queue, msg.partition, msg.seq, exc_info=True)
                settle: Callable[[Message], object] = self.nack
            else:
                settle = self.ack
            try:
                settle(msg)
            except FlowFenced:
                pass       # the partition moved: its new flow gets the message again

    def ack(self, msg: Message) -> None:
        """Acknowledge one message; durable when this returns."""
        self.ack_many((msg,))

    def ack_many(self, msgs: Iterable[Message]) -> None:
        """Acknowledge messages in one commit; durable when this returns."""
        self.ack_many_async(msgs, commit_here=True).result()

    def ack_many_async(self, msgs: Iterable[Message], *, commit_here: bool = False) -> Pending:
        """Acknowledge messages in one commit without waiting for it: the acks take effect for
        delivery at once (nothing acked is delivered again), and are durable once the returned
        ``Pending.result()`` returns. A consumer can receive and process its next batch while
        the previous batch's acks are committed; until ``result()`` returns, a crash may bring
        those messages back (redelivered), as for an ack not yet made. ``commit_here``: the
        caller waits for the result at once (``ack_many`` does): when no commit is under way
        the acks commit in the calling thread before this returns, saving the hand-off to the
        writer thread and back."""
        msgs = received(msgs)
        self.settled(msgs)
        return Pending(self._endpoint.ack_async(msgs, commit_here))

    def ack_through(self, partition: int, seq: int) -> Pending:
        """Acknowledge every message of ``partition`` (one this flow holds) up to ``seq``, in
        one commit, whether it was received through this flow or read from the log directly
        (a consumer of ranges, such as Spark's stream). Fenced like ``ack_many`` (rule `fencing`): raises
        ``FlowFenced`` when the flow does not hold the partition. Durable once ``result()``
        returns."""
        for name, value, high in (("partition", partition, U32), ("seq", seq, U64)):
            if type(value) is not int or not 0 <= value <= high:
                raise InvalidAck(f"ack_through takes a {name} that is an integer from 0 to "
                                 f"{high}, not {value!r}")
        return Pending(self._endpoint.ack_through(partition, seq))

    def nack(self, msg: Message, delay: float | None = None) -> list[int]:
        """Return ``msg`` for redelivery (with every later unacked message of its partition:
        rule `partition-order`; under ``ordering="key"`` of its key only, rule `key-ordering`).
        Returns the seqs of its partition that come back. Its delivery count grows by one.
        ``delay``: seconds before it comes back, its partition (or key) waiting meanwhile;
        None for the queue's rule (``redelivery_delay``, growing by
        ``redelivery_delay_multiplier`` with each redelivery up to ``redelivery_delay_max``; 0
        means at once)."""
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float))
                                  or not math.isfinite(delay) or not 0 <= delay <= MAX_SECONDS):
            raise InvalidConfig(f"delay must be a number of seconds from 0 to {MAX_SECONDS:g} "
                                f"or None, not {delay!r}")
        got = received((msg,))
        self.settled(got)
        back = self._endpoint.nack(got[0], delay)
        self._given_back.update((msg.partition, s) for s in back)
        return back

    def reject(self, msg: Message, headers: dict | None = None) -> None:
        """The message cannot be processed, ever: it is dead at once, whatever
        ``max_redelivery`` says, and goes to the queue's dead message queue with
        ``dead_reason="rejected"`` (discarded and counted without one), ``headers`` (say,
        why it failed) added to its own. The rest of its partition flows on. Durable when this
        returns."""
        if headers is not None:
            if type(headers) is not dict:
                raise InvalidMessage(f"headers must be a dict or None, not "
                                     f"{type(headers).__name__}")
            try:
                check_headers(headers)
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidMessage(f"headers cannot be stored: {exc}") from None
        got = received((msg,))
        self.settled(got)
        self._endpoint.reject(got[0], headers or None)

    def unbind(self, leave: bool = False) -> None:
        """Leave the queue. Unacked messages go to whoever takes the partitions, marked
        redelivered. A named flow that binds again within the rebalance delay gets them back.
        ``leave=True``: it will not come back; its partitions go to the other flows at once
        (or to the next flow to bind), without the rebalance delay (``partq.Worker``'s stop)."""
        self._endpoint.unbind(leave=leave)

    def __enter__(self) -> Flow:
        return self

    def __exit__(self, *exc) -> None:
        self.unbind()

    def __repr__(self) -> str:
        return (f"<Flow {self.name or self.flow_id} of {self.queue!r} "
                f"partitions={sorted(self.partitions)}{' closed' if self.closed else ''}>")


class BoundFlows:
    """The flows a broker or client bound (weakly held): a transaction finds here the flow
    that received a message."""

    def __init__(self) -> None:
        self._flows: weakref.WeakSet[Flow] = weakref.WeakSet()

    def add(self, flow: Flow) -> Flow:
        self._flows.add(flow)
        return flow

    def receiver_of(self, msg: Message) -> Flow | None:
        """The flow that received ``msg`` (this delivery of it: the same delivery count), and
        has not settled it; None when none of them did."""
        for flow in list(self._flows):
            if flow.queue == msg[0] and flow.received_copy(msg):
                return flow
        return None


def received(msgs: Iterable[Message]) -> list[Message]:
    """``msgs`` as a list, each a ``Message`` (as ``receive`` returned it); ``InvalidAck``
    names the first that is not."""
    if isinstance(msgs, (str, bytes)) or not hasattr(msgs, "__iter__"):
        raise InvalidAck(f"acks take an iterable of messages, not {type(msgs).__name__}")
    msgs = msgs if type(msgs) is list else list(msgs)
    if set(map(type, msgs)) - {Message}:
        for m in msgs:
            if not isinstance(m, Message):
                raise InvalidAck(f"acks, nacks and rejects take messages a flow received "
                                 f"(partq.Message), not {type(m).__name__}")
    return msgs
