"""The one write of a transaction: its publishes checked and placed, the parts of its flows
(``partq.delivery.txn_parts``) checked and written, and its id stored (``ids``), in one
LMDB write transaction, which a group commit may share with other writes.

Order inside the write: the id first (a retry of a committed transaction stops there), every
check of every part (a flow that lost a partition, a message acked meanwhile: ``FlowFenced``),
then the publishes' gates (ingress, lowered limits, quotas), and only then any write. So a
transaction that is refused has written nothing, but for the count of a quota refusal
(``quota_refused``, counted in the same commit as for every publish path: the write returns
the ``QueueFull`` instead of raising it, and the caller raises it once that count is durable).

Quotas (rule `quota`): the messages a transaction publishes to one queue are checked together,
as one ``publish_many``; over a quota the whole transaction is refused with ``QueueFull``,
whatever the queue's ``reject_msg_to_sender`` (a discard would lose the output of messages the
transaction acks, as for a checkpointed ``publish_many``). Ingress disabled refuses it with
``IngressDisabled`` for the same reason.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from partq.config import QueueConfig
from partq.errors import IngressDisabled
from partq.publish import quota
from partq.publish.encode import Encoded, over_limits
from partq.storage import crashpoints
from partq.storage.txn import mark_ttl_seen
from partq.transactions import ids


class Publish(NamedTuple):
    """The messages a transaction publishes to one queue, encoded with ``config``."""
    queue: str
    config: QueueConfig
    items: Encoded
    ttl: bool                   # some carry a TTL


def make_write(publisher, publishes: list[Publish], txn_id: tuple[str, str] | None = None
               ) -> Callable[[list], Callable]:
    """``make_op(parts)`` for ``Dispatcher.commit_transaction``."""
    def make_op(parts: list) -> Callable:
        def op(w):
            if txn_id is not None and ids.committed(w, *txn_id):
                raise ids.AlreadyCommitted(f"transaction {txn_id[1]} committed before")
            for part in parts:
                for check in part.checks:
                    check(w)
            admitted = []
            for pub in publishes:
                config = publisher.config_in(w, pub.queue)
                refusal = _gate(publisher, w, config, pub)
                if refusal is not None:
                    return refusal
                admitted.append((config, pub))
            for part in parts:
                for write in part.writes:
                    write(w)
            if crashpoints.ENABLED:
                crashpoints.hit("in_transaction")
            for config, pub in admitted:
                if pub.ttl:
                    mark_ttl_seen(w, config.qid)
                publisher.append_admitted(w, config, pub.items)
            if txn_id is not None:
                ids.remember(w, *txn_id)
            return None
        return op
    return make_op


def _gate(publisher, w, config: QueueConfig, pub: Publish):
    """The ``QueueFull`` (counted) that refuses ``pub``, or None; raises ``IngressDisabled``
    and the ``InvalidMessage`` of a message over limits lowered since it was encoded."""
    if not config.ingress_enabled:
        raise IngressDisabled(f"queue {config.name!r} has ingress disabled: a transaction "
                              f"publishing to it is refused whole; enable ingress and run it "
                              f"again")
    if config is not pub.config and publisher.configs.lowered(config, pub.config):
        for _, record in pub.items:
            invalid = over_limits(config, record)
            if invalid is not None:
                raise invalid
    if not (config.max_depth or config.max_bytes):
        return None
    full = quota.check(w, config, len(pub.items), quota.record_bytes(config, pub.items))
    if full is not None:
        quota.count_refused(w, config.qid, len(pub.items))
    return full
