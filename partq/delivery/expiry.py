"""Expired messages of queues nobody consumes (rule `expiry`). Delivery kills an expired message
when it reaches it; a queue that no consumer reads would keep its expired messages forever, so
every ``SWEEP_INTERVAL`` seconds (``partq.broker``) a process with a ticker looks at the first ``SWEEP_LIMIT``
unacked messages of each partition of the queues that can have expired messages (``max_ttl``
set, or a publish with a TTL seen: ``QUEUE_TTL_SEEN``) and kills the expired ones, as delivery would
(dead message queue, reason ``expired``). The process delivering a queue sweeps it, past its
delivered marks (below them a message may be in a consumer's hands, and delivery decides); a
queue nobody delivers is swept whole by any process that writes.

Cost: per sweep and partition of such a queue, one read of at most ``SWEEP_LIMIT`` records (a
few chunks) and a commit when something expired. With ``max_ttl`` the oldest messages expire
first, so the head is where they are; a message with a short TTL behind unexpired ones waits
until delivery or the head reaches it (it is never delivered either way)."""
from __future__ import annotations

from collections.abc import Callable

from partq.config import QueueConfig
from partq.delivery.dead_letter import DeadMessage, dead_op
from partq.delivery.outside import count_outside
from partq.storage.encoding import record_fields
from partq.storage.txn import QUEUE_TTL_SEEN

SWEEP_LIMIT = 512


def expired_in(r, config: QueueConfig, now_ns: int, delivered: bool,
               limit: int = SWEEP_LIMIT) -> list[DeadMessage]:
    """The expired messages among the first ``limit`` unacked ones of each partition of
    ``config``'s queue in snapshot ``r`` (none when it cannot have any). ``delivered``: a
    process delivers the queue, so a message at or below a partition's delivered mark may be
    in a consumer's hands: it is left to delivery (a consumer may still ack it)."""
    qid = config.qid
    if not config.max_ttl and r.queue_meta(qid, QUEUE_TTL_SEEN) is None:
        return []
    max_ttl_ns = int(config.max_ttl * 1e9)
    out: list[DeadMessage] = []
    for p in r.partitions(qid):
        ack = r.ack_state(qid, p)
        seen, start = 0, max(ack.floor, ack.delivered_mark + 1) if delivered else ack.floor
        while seen < limit:
            batch = r.records(qid, p, start, limit - seen)
            if not batch:
                break
            for seq, raw in batch:
                start = seq + 1
                if ack.is_acked(seq):
                    continue
                seen += 1
                f = record_fields(raw)
                if f is None:
                    continue            # damaged: delivery stops there and says so
                if (len(f) == 5 and f[4] <= now_ns) or (max_ttl_ns and f[0] + max_ttl_ns <= now_ns):
                    out.append(DeadMessage(p, seq, f[1], f[2], f[3], "expired", ack.failed(seq)))
    return out


def sweep(store, configs: list[tuple[QueueConfig, Callable | None]], now_ns: int) -> int:
    """Kill the expired messages ``expired_in`` finds in ``configs``' queues; returns how many.
    With each queue: None when no process delivers it, else the guard of this process's
    delivery of it (``owner.guard``: the kill is refused once another process took it over).
    Whoever delivers a queue takes the acks in before its next delivery."""
    killed = 0
    for config, guard in configs:
        with store.read() as r:
            dead = expired_in(r, config, now_ns, guard is not None)
        if not dead:
            continue

        def op(w, config=config, dead=dead, guard=guard) -> None:
            if guard is not None:
                guard(w)
            dead_op(config.name, config.qid, dead, now_ns)(w)
            count_outside(w, config.qid)
        store.write(op)
        killed += len(dead)
    return killed
