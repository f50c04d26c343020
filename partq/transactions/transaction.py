"""``Transaction``: acks, nacks and rejects of received messages and publishes to any queues,
buffered in the block and committed together at its end, in one write, or not at all (rule
`transactions`).

    with broker.transaction() as tx:        # or client.transaction() through partq serve
        for msg in flow.receive(100):
            tx.publish("out", transform(msg.payload), key=msg.key)
            tx.ack(msg)

The block takes no lock and writes nothing: its calls check their arguments and buffer. At the
block's end the transaction commits (``commit``); an exception in the block aborts it (nothing
is done; the messages stay unacked with their flows). A refused commit raises, nothing done:
``FlowFenced`` when a flow no longer holds a message's partition (or the message was acked,
nacked or rejected already), ``QueueFull`` over a quota, ``IngressDisabled``, and the errors of
any write. A message may appear once in a transaction (ack, nack or reject).
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from partq.clock import MAX_SECONDS
from partq.delivery.txn_parts import Entry
from partq.errors import FlowFenced, InvalidAck, InvalidConfig
from partq.flow import BoundFlows, Flow, received
from partq.message import Message
from partq.publish.encode import check_batch, check_types, encode, expiry, replayable
from partq.transactions.write import Publish, make_write


class Transaction:
    """What a transaction buffers; ``_commit`` (the broker's or the client's) makes it so."""

    def __init__(self, flows: BoundFlows) -> None:
        self._flows = flows
        self._entries: list[Entry] = []
        self._ids: set[tuple[str, int, int]] = set()
        self._publishes: list[tuple[str, list, float | None]] = []
        self._taken: list[tuple[Flow, Entry]] = []     # with their flow named (``take``)
        self.state = "open"     # then "committed" or "aborted"

    # ------------------------------------------------------------------ the block
    def ack(self, msg: Message) -> None:
        """Ack ``msg`` (received by a flow of this broker or client) at the commit."""
        self._add("acked", msg)

    def nack(self, msg: Message, delay: float | None = None) -> None:
        """Give ``msg`` back at the commit, as ``Flow.nack``."""
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float))
                                  or not math.isfinite(delay) or not 0 <= delay <= MAX_SECONDS):
            raise InvalidConfig(f"delay must be a number of seconds from 0 to {MAX_SECONDS:g} "
                                f"or None, not {delay!r}")
        self._add("nacked", msg, delay)

    def reject(self, msg: Message) -> None:
        """Make ``msg`` dead at the commit, as ``Flow.reject``."""
        self._add("rejected", msg)

    def publish(self, queue: str, payload: bytes, key: str | None = None,
                headers: dict | None = None, ttl: float | None = None) -> None:
        """Publish one message at the commit, as ``publish``."""
        self._check_open()
        check_types(payload, key, headers)
        self._publishes.append((queue, [(payload, key, headers)], ttl))

    def publish_many(self, queue: str, items: Iterable) -> None:
        """Publish a batch at the commit, as ``publish_many``."""
        self._check_open()
        check_batch(items)
        self._publishes.append((queue, list(replayable(items)), None))

    def _add(self, verb: str, msg: Message, delay: float | None = None) -> None:
        self._check_open()
        msg = received((msg,))[0]
        ident = (msg.queue, msg.partition, msg.seq)
        if ident in self._ids:
            raise InvalidAck(f"{msg.queue} partition {msg.partition} seq {msg.seq} is in this "
                             f"transaction already (a message is acked, nacked or rejected once)")
        self._ids.add(ident)
        self._entries.append(Entry(verb, msg, delay))

    def take(self, flow: Flow, entry: Entry) -> None:
        """Add ``entry``, of a message ``flow`` received (``partq serve`` names the flow of each
        message its client's transaction names)."""
        self._check_open()
        self._taken.append((flow, entry))

    def _check_open(self) -> None:
        if self.state != "open":
            raise InvalidConfig(f"this transaction is {self.state}: begin another")

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.state = "aborted"
            return
        self.commit()

    # ------------------------------------------------------------------ the commit
    def commit(self) -> None:
        """Commit what the block buffered (``with`` does it at the block's end); durable when
        this returns. Raises what refused it, nothing done."""
        self._check_open()
        try:
            self._commit()
        except BaseException:
            self.state = "aborted"
            raise
        self.state = "committed"

    def _commit(self) -> None:
        raise NotImplementedError

    def entries(self) -> list[Entry]:
        """What the block acked, nacked and rejected, in order."""
        return list(self._entries)

    def publishes(self) -> list[tuple[str, list, float | None]]:
        """What the block published: ``(queue, items, ttl)`` per call, in order."""
        return list(self._publishes)

    def receivers(self) -> list[tuple[Flow, Entry]]:
        """Each entry with the flow that received its message; ``FlowFenced`` for messages no
        flow of this broker or client holds (settled already, or never received here)."""
        out, orphans = list(self._taken), []
        for entry in self._entries:
            flow = self._flows.receiver_of(entry.msg)
            if flow is None:
                orphans.append(entry.msg)
            else:
                out.append((flow, entry))
        if orphans:
            where = ", ".join(f"{m.queue}/{m.partition}/{m.seq}" for m in orphans[:5])
            raise FlowFenced(f"{len(orphans)} message(s) of this transaction are in flight to no "
                             f"flow of this broker or client (acked, nacked or rejected "
                             f"already, given back, or received elsewhere: queue/partition/seq "
                             f"{where}): nothing of the transaction was done", orphans)
        return out

    def encoded(self, publisher) -> list[Publish]:
        """The publishes, encoded and checked (``InvalidMessage``), one ``Publish`` per queue
        in the order each was first named."""
        now = publisher.clock.wall_ns()
        by_queue: dict[str, list[Publish]] = {}
        for queue, items, ttl in self._publishes:
            expires = expiry(now, ttl)
            config, enc = publisher.configs.encoded(
                queue, lambda config, items=items, expires=expires: encode(config, items, now,
                                                                             expires))
            by_queue.setdefault(queue, []).append(Publish(queue, config, enc, expires is not None))
        return [Publish(q, pubs[-1].config, [i for p in pubs for i in p.items],
                        any(p.ttl for p in pubs)) for q, pubs in by_queue.items()]


class BrokerTransaction(Transaction):
    """``Broker.transaction()``: committed by this process, with its flows and peer flows."""

    def __init__(self, broker, txn_id: tuple[str, str] | None = None) -> None:
        super().__init__(broker.bound_flows)
        self._broker = broker
        self._txn_id = txn_id       # (client id, transaction id): stored with the commit

    def _commit(self) -> None:
        broker = self._broker
        publishes = self.encoded(broker.publisher)
        receivers = self.receivers()
        if not receivers and not publishes and self._txn_id is None:
            return
        broker.dispatcher.commit_transaction(
            [(flow.endpoint(), entry) for flow, entry in receivers],
            make_write(broker.publisher, publishes, self._txn_id))
        for flow, entry in receivers:
            flow.settled([entry.msg])

