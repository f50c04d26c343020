"""Dead messages (rule `dead-messages`): a message that expired, was delivered ``1 +
max_redelivery`` times, or was rejected is removed from its queue and, in the same transaction,
appended to the queue's dead message queue with the reason in its headers. Without a dead message
queue (none set, none of that name, or one whose ingress is off) it is discarded and counted.

Counts, kept per queue in the store (so they survive restarts and reach a DR-standby with the
change log): dead messages by reason, and dead messages discarded.

A consumer may still hold a copy of a message that died (a delivery that came back unacked, or
was given back by a nack of an earlier message, and expired or passed its limit when it was
handed out again; an operator's kill): its ack must not return as if it had taken the message.
Each partition keeps the seqs of its last ``RECENT_DEAD`` dead messages in the store
(``recent_dead``), written in the killing transaction; the delivery cursors remember their own
kills from the moment they decide them (``Cursor.note_dead``). An ack of such a message is
refused with ``FlowFenced``. A message that died before the last ``RECENT_DEAD`` of its
partition is forgotten: an ack of it then does nothing and raises nothing, as for any message
acked already."""
from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import NamedTuple

import msgpack

from partq.config import QueueConfig
from partq.core.key_hash import crc32c_of
from partq.storage.encoding import (
    PARENT,
    decode_meta,
    encode_record,
    pack_u64,
    record_fields,
    unpack_u64,
)

log = logging.getLogger("partq.delivery")

REASONS = ("max_redelivery", "expired", "rejected")
_DISCARDED = b"dead/discarded"
RECENT_DEAD = 1024          # dead seqs remembered per partition (an ack of one is refused)
_rng = random.Random()


class DeadMessage(NamedTuple):
    partition: int      # storage partition of the queue it dies in
    seq: int
    key: str | None
    headers: dict | None
    payload: bytes | None   # None: read key, headers and payload from the log (a reject)
    reason: str         # one of REASONS
    deliveries: int     # times it was delivered
    extra: dict | None = None   # headers the rejecting consumer adds (why it failed)


def rejected(partition: int, seq: int, deliveries: int,
             headers: dict | None = None) -> DeadMessage:
    """A message a consumer rejected; what it holds is read from the log when it dies, not
    taken from the consumer. ``headers``: the consumer's own, added to the dead copy's (the
    worker's ``exception_type`` and ``exception_message``)."""
    return DeadMessage(partition, seq, None, None, None, "rejected", deliveries, headers)


def dead_headers(queue: str, d: DeadMessage) -> dict:
    """The headers of the copy in the dead message queue: the message's own, plus why and
    where from (and what the rejecting consumer added)."""
    headers = dict(d.headers or {})
    headers.update(d.extra or {})
    headers.update(dead_reason=d.reason, origin_queue=queue, origin_partition=d.partition,
                   origin_seq=d.seq, delivery_count=d.deliveries)
    return headers


def _add(w, qid: int, name: bytes, n: int) -> None:
    raw = w.queue_meta(qid, name)
    w.put_queue_meta(qid, name, pack_u64((0 if raw is None else unpack_u64(raw)) + n))


def dead_counts(reader, qid: int) -> dict[str, int]:
    """Dead messages of the queue by reason, and ``discarded``: those that had no dead message
    queue to go to."""
    out = {}
    for reason in (*REASONS, "discarded"):
        raw = reader.queue_meta(qid, b"dead/" + reason.encode())
        out[reason] = 0 if raw is None else unpack_u64(raw)
    return out


def _recent_key(partition: int) -> bytes:
    return b"recent-dead/%d" % partition


def recent_dead(reader, qid: int, partition: int) -> frozenset[int]:
    """The seqs of the last ``RECENT_DEAD`` messages of the partition that died."""
    raw = reader.queue_meta(qid, _recent_key(partition))
    return frozenset(msgpack.unpackb(raw)) if raw is not None else frozenset()


def recent_dead_of(reader, qid: int) -> Callable[[int], frozenset[int]]:
    """``recent_dead`` of the queue's partitions in ``reader``, each read once."""
    seen: dict[int, frozenset[int]] = {}

    def of(partition: int) -> frozenset[int]:
        if partition not in seen:
            seen[partition] = recent_dead(reader, qid, partition)
        return seen[partition]
    return of


def _remember(w, qid: int, partition: int, seqs: list[int]) -> None:
    raw = w.queue_meta(qid, _recent_key(partition))
    kept = (msgpack.unpackb(raw) if raw is not None else []) + seqs
    w.put_queue_meta(qid, _recent_key(partition), msgpack.packb(kept[-RECENT_DEAD:]))


def dead_op(queue: str, qid: int, dead: list[DeadMessage], now_ns: int,
            holds: Callable | None = None) -> Callable:
    """The write that kills ``dead``: each message not acked yet (a second attempt finds it
    acked and does nothing) is acked in its queue and appended to the dead message queue, in
    this one transaction. ``holds(w, partition)``: whether the caller may still ack there (a
    flow of another process that lost the partition kills nothing)."""
    def op(w) -> None:
        raw = w.queue(queue)
        if raw is None or raw["qid"] != qid:
            return          # deleted meanwhile
        config = QueueConfig.from_dict(raw)
        fresh: dict[int, list[DeadMessage]] = {}
        seen = set()
        for d in dead:
            if (d.partition, d.seq) in seen or not w.has_partition(qid, d.partition):
                continue
            if w.ack_state(qid, d.partition).is_acked(d.seq):
                continue
            if holds is not None and not holds(w, d.partition):
                continue
            stored = _from_log(w, qid, d) if d.payload is None else d
            if stored is None:
                continue
            seen.add((d.partition, d.seq))
            fresh.setdefault(d.partition, []).append(stored)
        if not fresh:
            return
        for p, ds in fresh.items():
            w.ack(qid, p, [d.seq for d in ds])
            _remember(w, qid, p, [d.seq for d in ds])
        kills = [d for ds in fresh.values() for d in ds]
        for reason in REASONS:
            n = sum(1 for d in kills if d.reason == reason)
            if n:
                _add(w, qid, b"dead/" + reason.encode(), n)
        target = _target(w, config)
        if target is None:
            _add(w, qid, _DISCARDED, len(kills))
            log.warning("queue %r: %d dead message(s) discarded (%s): %s", queue, len(kills),
                        ", ".join(sorted({d.reason for d in kills})),
                        "no dead message queue is set" if not config.dead_message_queue else
                        f"dead message queue {config.dead_message_queue!r} does not exist or "
                        f"has ingress off")
            return
        by_p: dict[int, list[bytes]] = {}
        for d in kills:
            record = encode_record(now_ns, d.key, dead_headers(queue, d), d.payload or b"")
            by_p.setdefault(_place(target, d.key), []).append(record)
        for p, records in by_p.items():
            w.append(target.qid, p, records)
    return op


def _from_log(w, qid: int, d: DeadMessage) -> DeadMessage | None:
    """``d`` with its key, headers and payload as stored (None when its record is damaged: a
    corrupt record is not killed here but stops delivery as ``CorruptRecord`` says)."""
    for seq, raw in w.records(qid, d.partition, d.seq, 1):
        fields = record_fields(raw) if seq == d.seq else None
        if fields is not None:
            return d._replace(key=fields[1], headers=fields[2], payload=fields[3])
    return None


def _target(w, config: QueueConfig) -> QueueConfig | None:
    """The dead message queue, if it exists and takes messages now."""
    if not config.dead_message_queue:
        return None
    raw = w.queue_raw(config.dead_message_queue)
    if raw is None:
        return None
    target = QueueConfig.from_dict(decode_meta(raw, config.dead_message_queue))
    return target if target.ingress_enabled else None


def _place(target: QueueConfig, key: str | None) -> int:
    """A dead message's partition in the dead message queue: by its key's hash as a publish
    (rule `key-hash`); unkeyed ones anywhere."""
    if not target.partitioned:
        return PARENT
    if key is not None:
        return crc32c_of(key.encode()) % target.partitions
    return _rng.randrange(target.partitions)
