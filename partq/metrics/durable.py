"""The counts of a queue that survive restarts, read from the store: nothing extra is written
for the hot paths.

* published: the heads of every partition the queue ever had (a head outlives a dropped
  partition, and sequences are never reused), the parent queue's log included;
* acked: published - backlog - removed, where the backlog is what the live logs hold unacked
  and ``removed`` (queue meta, written by ``Writer.drop_partition`` in the commit that drops a
  partition) counts what scale-downs and changes to exclusive deleted unacked;
* discarded: the publisher's durable counter (rule `ingress-egress`);
* rebalances and handoffs per outcome: written by ``partq.delivery.moves`` in the commit that
  stores the assignment they changed.

Every function takes a read snapshot (``Store.read()``) and a queue's config, and is O(partitions).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from partq.config import QueueConfig
from partq.delivery.moves import OUTCOMES, read_counts
from partq.publish.publisher import discarded_count
from partq.storage.encoding import unpack_u64
from partq.storage.txn import QUEUE_REMOVED


@dataclass(frozen=True)
class QueueCounts:
    published: int
    acked: int
    removed: int                 # dropped unacked with their partitions
    discarded: int
    rebalances: int
    handoffs: dict[str, int] = field(default_factory=dict)     # outcome -> count
    partition_published: dict[int, int] = field(default_factory=dict)   # live partitions' heads


def published_acked(r, qid: int, backlog: int) -> tuple[int, int]:
    """Messages of queue ``qid`` published and acked, given its ``backlog`` (what its live logs
    hold unacked, the parent queue's log included: a status's ``depth + parent_depth``)."""
    published = sum(r.heads(qid).values())
    return published, max(0, published - backlog - _removed(r, qid))


def _removed(r, qid: int) -> int:
    raw = r.queue_meta(qid, QUEUE_REMOVED)
    return 0 if raw is None else unpack_u64(raw)


def queue_counts(r, config: QueueConfig) -> QueueCounts:
    qid = config.qid
    heads = r.heads(qid)
    live = r.partitions(qid)
    backlog = sum(r.ack_state(qid, p).backlog(heads.get(p, 0)) for p in live)
    removed = _removed(r, qid)
    published = sum(heads.values())
    moves = read_counts(r, qid)
    return QueueCounts(
        published=published, acked=max(0, published - backlog - removed), removed=removed,
        discarded=discarded_count(r, qid), rebalances=moves.get("rebalances", 0),
        handoffs={o: moves.get("handoffs_" + o, 0) for o in OUTCOMES},
        partition_published={p: heads.get(p, 0) for p in live})
