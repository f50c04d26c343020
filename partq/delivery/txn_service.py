"""The delivery side of a transaction's commit (``partq.transactions``): the parts of the flows
it names (``txn_parts``), one write made of them, and what changes in memory once it is
durable. ``Dispatcher`` provides the lock, the store, the clock and the submissions.

Locks: a flow of another process of the host (``PeerFlow``) takes its part under its group's
lock and lets go (its acks are fenced in the write by their epochs, as its plain acks are). The
flows this process delivers take theirs under the dispatcher's lock, which the commit holds
until the write is durable: between the checks and the commit no delivery of this process
changes (no handoff can complete, no message be handed out again), and nothing changes in
memory before the commit, so a refused or failed commit leaves nothing to undo. Holding it
through a commit is safe because no commit waits for it (no write operation, commit hook or
callback takes it). The block of a transaction holds no lock: it only buffers.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from partq.delivery.local_endpoint import LocalEndpoint
from partq.delivery.peers.peer_flow import PeerFlow
from partq.delivery.queue_delivery import QueueDelivery
from partq.delivery.txn_parts import Entry, TxnPart, local_part
from partq.errors import InvalidAck, PartqError
from partq.pending import WriteHandle


class TxnService:
    """``commit_transaction``; ``Dispatcher`` provides the rest."""

    store: Any
    clock: Any
    _lock: threading.RLock

    def _submit(self, ops: list, qd: QueueDelivery | None = None) -> WriteHandle | None:
        raise NotImplementedError

    def notify(self) -> None:
        raise NotImplementedError

    def commit_transaction(self, entries: list[tuple[object, Entry]],
                           make_op: Callable[[list[TxnPart]], Callable]) -> object:
        """Commit one transaction: ``entries`` are ``(flow endpoint, Entry)``, every endpoint
        a flow of this process (a ``LocalEndpoint`` of this dispatcher or a ``PeerFlow``);
        ``make_op(parts)`` gives the one write (it runs every part's checks, then its own,
        then every part's writes). Returns what the write returned; raises what refused it,
        nothing done."""
        local: dict[int, tuple[QueueDelivery, Any, list[Entry]]] = {}
        peers: dict[int, tuple[PeerFlow, list[Entry]]] = {}
        for endpoint, entry in entries:
            if isinstance(endpoint, PeerFlow) and endpoint.local_endpoint() is not None:
                endpoint = endpoint.local_endpoint()
            if isinstance(endpoint, PeerFlow):
                peers.setdefault(id(endpoint), (endpoint, []))[1].append(entry)
            elif isinstance(endpoint, LocalEndpoint) and endpoint.delivered_by()[0] is self:
                _, qd, state = endpoint.delivered_by()
                local.setdefault(id(state), (qd, state, []))[2].append(entry)
            else:
                raise InvalidAck(f"a transaction takes messages received by the flows of its "
                                 f"broker (or client), not by {type(endpoint).__name__}")
        parts: list[TxnPart] = []
        try:
            for flow, group in peers.values():
                parts.append(flow.transaction_part(group))
            if not local:
                return self._write(parts, make_op, {})
            with self._lock:
                now, now_ns = self.clock.now(), self.clock.wall_ns()
                owners: dict[int, QueueDelivery] = {}
                for qd, state, group in local.values():
                    parts.append(local_part(qd, state, group, now, now_ns))
                    owners[len(parts) - 1] = qd
                return self._write(parts, make_op, owners)
        finally:
            self.notify()

    def _write(self, parts: list[TxnPart], make_op: Callable,
               owners: dict[int, QueueDelivery]) -> object:
        """Commit the write of ``parts``, then apply each part in memory (``owners``: the
        queue delivery of each local part, whose follow-up writes are queued under its
        guard)."""
        try:
            result = self.store.submit(make_op(parts), wait=True).result()
            if isinstance(result, PartqError):
                raise result
        except BaseException:
            for part in parts:
                for undo in part.failed:
                    undo()
            raise
        for i, part in enumerate(parts):
            ops = [op for after in part.after for op in after()]
            if ops:
                try:
                    self._submit(ops, owners.get(i))
                except PartqError:
                    pass        # the transaction is durable; these follow from it again
        return result
