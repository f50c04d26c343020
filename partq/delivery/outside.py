"""Acks from outside delivery: an operator acks one message, or moves it to the dead message
queue, by queue, partition and sequence (``Broker.ack_message``, ``Broker.kill_message``; the
way to unblock a partition held by a message nobody can process without writing code).

Such a write also counts one "outside write" for the queue in the store. Whoever delivers the
queue's partitions (the owner, or a process whose flows the owner assigned them) reads that count
before it delivers, and on a change takes the partitions' ack state again: nothing acked from
outside is delivered afterwards, and what a flow held of it stops counting against its credit."""
from __future__ import annotations

from collections.abc import Callable

from partq.config import QueueConfig
from partq.delivery.dead_letter import dead_op, rejected
from partq.errors import PartitionNotFound
from partq.storage.encoding import pack_u64, unpack_u64

OUTSIDE = b"outside"        # queue meta: writes of ack state made outside delivery


def outside_count(reader, qid: int) -> int:
    raw = reader.queue_meta(qid, OUTSIDE)
    return 0 if raw is None else unpack_u64(raw)


def count_outside(w, qid: int) -> None:
    w.put_queue_meta(qid, OUTSIDE, pack_u64(outside_count(w, qid) + 1))


def _check(w, config: QueueConfig, partition: int, seq: int) -> bool:
    """Whether ``seq`` of ``partition`` exists and is not acked (``PartitionNotFound`` when
    the partition does not exist; False for a seq acked already)."""
    if not w.has_partition(config.qid, partition):
        have = ", ".join(str(p) for p in w.partitions(config.qid)) or "none"
        raise PartitionNotFound(f"queue {config.name!r} has no partition {partition} (it has: "
                                f"{have})")
    if seq >= w.head(config.qid, partition):
        raise PartitionNotFound(f"queue {config.name!r} partition {partition} has no seq {seq} "
                                f"yet (next: {w.head(config.qid, partition)})")
    return not w.ack_state(config.qid, partition).is_acked(seq)


def ack_op(config_in: Callable, queue: str, partition: int, seq: int) -> Callable:
    """The write that acks one message; returns whether it was unacked."""
    def op(w) -> bool:
        config = config_in(w, queue)
        if not _check(w, config, partition, seq):
            return False
        w.ack(config.qid, partition, [seq])
        count_outside(w, config.qid)
        return True
    return op


def kill_op(config_in: Callable, queue: str, partition: int, seq: int, now_ns: int) -> Callable:
    """The write that makes one message dead (``dead_reason`` "rejected"): to the dead message
    queue, or discarded and counted without one; returns whether it was unacked."""
    def op(w) -> bool:
        config = config_in(w, queue)
        if not _check(w, config, partition, seq):
            return False
        failures = w.ack_state(config.qid, partition).failed(seq)
        dead_op(queue, config.qid, [rejected(partition, seq, failures)], now_ns)(w)
        if not w.ack_state(config.qid, partition).is_acked(seq):
            w.ack(config.qid, partition, [seq])   # a damaged record: nothing to copy, it goes
        count_outside(w, config.qid)
        return True
    return op
