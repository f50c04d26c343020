"""``Client.transaction()``: a transaction through ``partq serve`` (rule `transactions`),
buffered in the block and sent at its end as one ``transaction`` request under an id of its
own (``partq.remote.txn_request``). When the connection drops before the answer, the client
sends it again under the same id once it is connected again: a transaction that had committed
is answered "committed", never applied twice; one that had not is refused with ``FlowFenced``
(its flows were bound again: their messages come again, marked redelivered), nothing done."""
from __future__ import annotations

import os
import time

from partq.errors import ServerUnavailable
from partq.remote.answers import items_of
from partq.remote.endpoint import RemoteEndpoint
from partq.transactions import Transaction


class ClientTransaction(Transaction):
    def __init__(self, client) -> None:
        super().__init__(client.bound_flows)
        self._client = client
        self.txn_id = os.urandom(12).hex()

    def _commit(self) -> None:
        receivers = self.receivers()
        rows: dict[str, list] = {"acked": [], "nacked": [], "rejected": []}
        for flow, entry in receivers:
            row = [flow.endpoint().flow_id, entry.msg.partition, entry.msg.seq]
            rows[entry.verb].append(row + [entry.delay] if entry.verb == "nacked" else row)
        frame = {"op": "transaction", "txn": self.txn_id, "acks": rows["acked"],
                 "nacks": rows["nacked"], "rejects": rows["rejected"],
                 "publishes": [[queue, items_of(items), ttl]
                               for queue, items, ttl in self.publishes()]}
        reply = self._send(frame)
        flows = reply.get("flows") or {}
        for flow, entry in receivers:
            flow.settled([entry.msg])
            endpoint = flow.endpoint()
            if isinstance(endpoint, RemoteEndpoint):
                endpoint.transaction_settled(entry.msg, entry.verb, flows.get(endpoint.flow_id))

    def _send(self, frame: dict) -> dict:
        """The answer, sending ``frame`` again while the connection drops before it (for up
        to the client's ``reconnect_timeout``)."""
        client = self._client
        deadline = time.monotonic() + client.reconnect_timeout
        while True:
            try:
                return client.call(frame)
            except ServerUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
