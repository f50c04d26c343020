"""Browsing a queue's stored messages without consuming them: which logs a queue has, which of
them a selection picks, and the records of each, read from short snapshots of the store.

Nothing here binds a flow or writes, so it changes no delivery state and works while other
processes publish, consume or own delivery. The upper bound of each log is its head when the
browse starts, so a busy publisher cannot keep it running. A record that fails its checksum is
yielded as corrupt with the reason, never skipped silently (rule `checksums`).

A queue's logs are its partitions and, once it has been exclusive (non-partitioned), its parent
queue's log: storage partition ``partq.PARENT`` (4294967295).
"""
from __future__ import annotations

import time
from collections.abc import Iterator

from partq.config import QueueConfig
from partq.errors import CorruptRecord, InvalidConfig, PartitionNotFound, queue_not_found
from partq.storage import decode_record
from partq.storage.encoding import PARENT, AckState

READ_BATCH = 1000     # records per read snapshot


def load_config(reader, queue: str) -> QueueConfig:
    """The configuration of ``queue`` as the read snapshot ``reader`` sees it; raises
    ``QueueNotFound`` when there is no such queue."""
    raw = reader.queue(queue)
    if raw is None:
        raise queue_not_found(queue, reader.queues(), "list the queues with `partq queue list`")
    return QueueConfig.from_dict(raw)


def log_partitions(reader, config: QueueConfig) -> list[int]:
    """The logs of a queue that may hold records, in the order commands walk them: the
    partitions that exist (a scaling in progress included; none while the queue is exclusive,
    and none that a scale-down or a change to exclusive dropped), then ``PARENT`` if the parent
    queue's log exists (the queue is, or once was, exclusive)."""
    count = max(config.partitions, config.scaling_from, config.scaling_to)
    logs = [p for p in range(count) if reader.has_partition(config.qid, p)]
    if reader.has_partition(config.qid, PARENT):
        logs.append(PARENT)
    return logs


def select_logs(logs: list[int], queue: str, partition: int | None, parent: bool) -> list[int]:
    """The logs ``partition`` / ``parent`` pick out of ``logs`` (all of them with neither).
    ``partition=PARENT`` (4294967295, as ``--json`` prints it) means ``parent=True``. Raises
    ``PartitionNotFound`` when the queue has no such log."""
    if parent or partition == PARENT:
        if PARENT not in logs:
            raise PartitionNotFound(f"queue {queue!r} has no parent-queue log (it was never "
                                    f"exclusive); leave out --parent to use its partitions")
        return [PARENT]
    if partition is None:
        return logs
    if partition not in logs:
        raise PartitionNotFound(f"{describe_logs(logs, queue)}; there is no partition {partition}")
    return [partition]


def describe_logs(logs: list[int], queue: str) -> str:
    """One clause naming the logs: "queue 'q' has partitions 0 to 3 and a parent-queue log
    (--parent)"."""
    numbered = [p for p in logs if p != PARENT]
    has_parent = PARENT in logs
    if not numbered:
        return (f"queue {queue!r} has no partitions"
                + (", only its parent-queue log (--parent)" if has_parent else ""))
    spans, start = [], numbered[0]
    for i, prev in enumerate(numbered):
        nxt = numbered[i + 1] if i + 1 < len(numbered) else None
        if nxt is None or nxt != prev + 1:       # a span ends at prev
            spans.append(str(start) if start == prev else f"{start} to {prev}")
            if nxt is not None:
                start = nxt
    text = (f"queue {queue!r} has partition{'s' if len(numbered) != 1 else ''} "
            f"{', '.join(spans)}")
    return text + (" and a parent-queue log (--parent)" if has_parent else "")


def check_range(from_seq: int | None, to_seq: int | None) -> None:
    """Raise ``InvalidConfig`` unless ``from_seq`` (None: 0) >= 0 and ``to_seq`` (None: the
    newest) is not below it."""
    if from_seq is not None and from_seq < 0:
        raise InvalidConfig("--from-seq must be 0 or more")
    if to_seq is not None and to_seq < (from_seq or 0):
        raise InvalidConfig("--to-seq must not be below --from-seq")


def check_browse(partition: int | None, parent: bool, from_seq: int, to_seq: int | None,
                 limit: int) -> None:
    """Raise ``InvalidConfig`` when a ``browse`` selection is inconsistent (call it before
    opening the store to refuse a bad request early; ``browse`` checks it too)."""
    if parent and partition is not None and partition != PARENT:
        raise InvalidConfig("pass either --parent or --partition, not both")
    if limit < 0:
        raise InvalidConfig("--limit must be 0 (no limit) or more")
    check_range(from_seq, to_seq)


def scan(store, config: QueueConfig, partition: int, start: int, end: int,
         batch: int = READ_BATCH) -> Iterator[tuple[int, bytes, AckState]]:
    """Yield ``(seq, raw, ack)`` for records of one partition with start <= seq <= end, each
    batch from its own short read snapshot (``ack``: the partition's ``AckState`` in it).
    Records below the ack floor are not shown: they are truncated, or about to be with the rest
    of their chunk (acks meanwhile included)."""
    pos = start
    while pos <= end:
        with store.read() as r:
            ack = r.ack_state(config.qid, partition)
            pos = max(pos, ack.floor)
            if pos > end:
                return
            records = r.records(config.qid, partition, pos, min(batch, end - pos + 1))
        if not records:
            return
        for seq, raw in records:
            if seq > end:
                return
            yield seq, raw, ack
        pos = records[-1][0] + 1


def browse(store, queue: str, partition: int | None = None, parent: bool = False,
           from_seq: int = 0, to_seq: int | None = None, key: str | None = None,
           limit: int = 100) -> Iterator[dict]:
    """The stored messages of ``queue`` (acked ones not yet truncated included), in partition
    order, as an iterator of dicts: ``queue, partition, seq, key, publish_time_ns, size, acked,
    headers, payload`` (bytes), and its lifecycle (``lifecycle``): ``delivery_count``,
    ``redelivered``, ``next_retry``, ``dead_reason``; a record that fails its checksum is
    ``queue, partition, seq, corrupt (True), error, acked, size`` (and is yielded whatever
    ``key`` asks).

    ``partition`` or ``parent`` picks one log (default: every partition, then the parent queue's
    log); ``from_seq``/``to_seq`` bound the sequences (default: up to each log's head now);
    ``key`` keeps the messages of that key; ``limit`` (0: none) caps how many are yielded.
    The queue and selection are checked at the call (``QueueNotFound``, ``PartitionNotFound``,
    ``InvalidConfig``); the records are read as the iterator is consumed, batch by batch, so
    keep ``store`` open until then."""
    check_browse(partition, parent, from_seq, to_seq, limit)
    with store.read() as r:
        config = load_config(r, queue)
        logs = select_logs(log_partitions(r, config), queue, partition, parent)
        heads = {p: r.head(config.qid, p) for p in logs}
    return _browse(store, config, logs, heads, from_seq, to_seq, key, limit)


def _browse(store, config: QueueConfig, logs: list[int], heads: dict[int, int], from_seq: int,
            to_seq: int | None, key: str | None, limit: int) -> Iterator[dict]:
    if limit == 0:
        limit = -1      # no limit: shown never reaches it
    shown = 0
    now_ns = time.time_ns()
    for p in logs:
        end = heads[p] - 1 if to_seq is None else min(to_seq, heads[p] - 1)
        for seq, raw, ack in scan(store, config, p, from_seq, end):
            row = _row(config.name, p, seq, raw, ack.is_acked(seq), key)
            if row is not None and not row.get("corrupt"):
                row.update(lifecycle(ack, seq, row["headers"], now_ns))
            if row is not None:
                yield row
                shown += 1
                if shown == limit:
                    return


def lifecycle(ack: AckState, seq: int, headers: dict | None, now_ns: int) -> dict:
    """Where a stored message stands in its lifecycle, from its partition's ack state:
    ``delivery_count``, the count its current or next delivery carries (1 plus the times it
    came back unacked; None once acked); ``redelivered``, whether it came back unacked at least
    once (a message given back only to keep order behind another one's nack is not counted:
    False); ``next_retry``, the wall time (s) a nack's delay ends (None: no delay pending);
    ``dead_reason``, the reason a message of a dead message queue died (its ``dead_reason``
    header; None elsewhere)."""
    acked = ack.is_acked(seq)
    failed = 0 if acked else ack.failed(seq)
    until = None if acked else ack.retry_at_ns(seq)
    reason = (headers or {}).get("dead_reason")
    return {"delivery_count": None if acked else failed + 1, "redelivered": failed > 0,
            "next_retry": until / 1e9 if until is not None and until > now_ns else None,
            "dead_reason": reason if isinstance(reason, str) else None}


def _row(queue: str, p: int, seq: int, raw: bytes, acked: bool, key: str | None) -> dict | None:
    try:
        rec = decode_record(raw, queue, p, seq)
    except CorruptRecord as exc:
        return {"queue": queue, "partition": p, "seq": seq, "corrupt": True, "error": exc.reason,
                "acked": acked, "size": len(raw)}
    if key is not None and rec.key != key:
        return None
    return {"queue": queue, "partition": p, "seq": seq, "key": rec.key,
            "publish_time_ns": rec.publish_time_ns, "size": len(rec.payload), "acked": acked,
            "headers": rec.headers, "payload": rec.payload}
