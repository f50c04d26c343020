"""A client's transaction through ``partq serve`` (rule `transactions`): the request

    transaction {txn, acks: [[flow, partition, seq], ...], nacks: [[flow, partition, seq,
                 delay], ...], rejects: [[flow, partition, seq], ...],
                 publishes: [[queue, items, ttl], ...]}
        -> committed {flows: {flow: {upto, back: [[partition, seq, [seqs given back]], ...]}}}

commits everything in one write of the server's broker, or nothing (the error's frame). Its id
``txn`` (with the client's id, the same on every connection of one client) is stored in that
write (``partq.transactions.ids``): a client whose answer was lost sends the transaction again
under the same id, and a transaction that committed is answered ``committed`` without being
applied again, by this server after a restart too (and by a promoted DR-standby). Within one
server a retry that comes while its first try is still committing waits for it.

While the write commits, the pumps of the flows it names push nothing (``Pump.held``): the
answer then says, per flow, the last deliver frame sent (``upto``) and what each nack gave
back, so the client drops exactly the copies a nack gives back, as for a plain nack."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from partq.delivery.txn_parts import Entry
from partq.errors import FlowFenced
from partq.message import Message
from partq.transactions import BrokerTransaction
from partq.transactions.ids import AlreadyCommitted, committed


class Running:
    """The transaction ids being committed by this server now: a retry waits for its first
    try."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ids: set[tuple[str, str]] = set()

    @contextmanager
    def only(self, key: tuple[str, str]) -> Iterator[None]:
        with self._cond:
            while key in self._ids:
                self._cond.wait()
            self._ids.add(key)
        try:
            yield
        finally:
            with self._cond:
                self._ids.discard(key)
                self._cond.notify_all()


def run_transaction(session, frame: dict) -> dict:
    """The answer to ``frame``, a checked transaction request of ``session``'s client; raises
    what refused it."""
    broker = session.broker
    key = (session.client_id or f"connection-{id(session)}", frame["txn"])
    with session.server.running.only(key):
        with broker.store.read() as r:
            if committed(r, *key):
                return {"op": "committed", "flows": {}}
        tx = BrokerTransaction(broker, key)
        pumps = {}
        for verb, rows in (("acked", frame["acks"]), ("nacked", frame["nacks"]),
                           ("rejected", frame["rejects"])):
            for row in rows:
                pump = session.flows.get(row[0])
                msg = Message(frame_queue(pump), row[1], row[2], None, b"", None, 0, False)
                if pump is None:
                    raise FlowFenced(f"flow {row[0]!r:.80} is no longer bound on this "
                                     f"connection (the client reconnected): nothing of the "
                                     f"transaction was done; its messages are redelivered",
                                     [msg])
                pumps[row[0]] = pump
                tx.take(pump.flow, Entry(verb, msg, row[3] if verb == "nacked" else None))
        for queue, items, ttl in frame["publishes"]:
            if ttl is None:
                tx.publish_many(queue, [tuple(item) for item in items])
            else:
                for payload, key, headers in items:
                    tx.publish(queue, payload, key, headers, ttl=ttl)
        with ExitStack() as stack:
            for fid in sorted(pumps):
                stack.enter_context(pumps[fid].held())
            try:
                tx.commit()
            except AlreadyCommitted:
                return {"op": "committed", "flows": {}}
            flows: dict[str, dict] = {fid: {"upto": pump.sent, "back": []}
                                      for fid, pump in pumps.items()}
            for flow, entry in tx.receivers():
                if entry.verb == "nacked":
                    flows[flow.flow_id]["back"].append([entry.msg.partition, entry.msg.seq,
                                                        entry.back])
        for pump in pumps.values():
            pump.wake()
        return {"op": "committed", "flows": flows}


def frame_queue(pump) -> str:
    return "" if pump is None else pump.flow.queue

