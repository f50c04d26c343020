"""Reading sequence ranges of a queue's logs, for consumers that read the log themselves (Spark's
batch reader and stream, locally or through ``partq serve``): which logs a queue has, with their
ack floors and heads, and the stored records of one range, read without binding a flow or
writing anything.

A range reads back the same records every time while nothing acks inside it: acked records are
left out (below the ack floor they may be truncated already, rule `truncation`; above it they are the ones
acked out of order), and a record missing for any other reason (its partition was dropped by a
scale-down, the queue deleted) is an error naming what happened, never a silent gap.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from partq.config import QueueConfig
from partq.errors import CorruptStore, InvalidConfig, PartitionNotFound, QueueNotFound
from partq.ops.browse import log_partitions
from partq.storage.encoding import PARENT

READ_RECORDS = 10_000       # records per read snapshot at most
READ_BYTES = 4 << 20        # ... and about this many bytes


@dataclass(frozen=True)
class LogState:
    """One log of a queue: messages ``floor`` to ``head - 1`` may be stored (the ones acked out
    of order among them are left out when read)."""
    partition: int
    floor: int
    head: int


@dataclass(frozen=True)
class QueueLogs:
    """A queue's identity and logs as one read snapshot saw them. ``partitions``: the count keys
    map to (rule `key-hash`); ``logs``: every partition that exists (a scaling in progress included), then
    the parent queue's log (``PARENT``) when it exists. ``gone``: (log, head) of each log asked
    about that no longer exists (a head outlives its log: the sequences it reached)."""
    queue: str
    qid: int
    partitioned: bool
    partitions: int
    logs: tuple[LogState, ...]
    gone: tuple[tuple[int, int], ...] = ()

    def log(self, partition: int) -> LogState | None:
        return next((s for s in self.logs if s.partition == partition), None)

    def as_doc(self) -> dict:
        return {"queue": self.queue, "qid": self.qid, "partitioned": self.partitioned,
                "partitions": self.partitions,
                "logs": [[s.partition, s.floor, s.head] for s in self.logs],
                "gone": [list(g) for g in self.gone]}

    @classmethod
    def from_doc(cls, doc: dict) -> QueueLogs:
        return cls(str(doc["queue"]), int(doc["qid"]), bool(doc["partitioned"]),
                   int(doc["partitions"]), tuple(LogState(*map(int, s)) for s in doc["logs"]),
                   tuple((int(p), int(h)) for p, h in doc.get("gone", ())))


def queue_logs(store, queue: str, known: Iterable[int] = ()) -> QueueLogs:
    """The logs of ``queue`` now; ``QueueNotFound`` when there is no such queue. ``known``: logs
    a caller read before, whose heads to report in ``gone`` if they no longer exist."""
    with store.read() as r:
        raw = r.queue(queue)
        if raw is None:
            raise QueueNotFound(f"no queue named {queue!r} in {store.path}; create it first "
                                f"(partq queue create {queue})")
        config = QueueConfig.from_dict(raw)
        logs = tuple(LogState(p, r.ack_state(config.qid, p).floor, r.head(config.qid, p))
                     for p in log_partitions(r, config))
        present = {s.partition for s in logs}
        gone = tuple((p, r.head(config.qid, p)) for p in sorted(set(known) - present))
    return QueueLogs(queue, config.qid, config.partitioned, config.partitions, logs, gone)


@dataclass(frozen=True)
class RangeRead:
    """What one ``read_range`` found: ``records`` (seq, raw record) in order, acked ones left
    out; ``next``: where the next read of the range starts (``end`` once it is done)."""
    records: list[tuple[int, bytes]]
    next: int


def read_range(store, queue: str, qid: int, partition: int, start: int, end: int,
               max_records: int = READ_RECORDS, max_bytes: int = READ_BYTES,
               cache: list | None = None) -> RangeRead:
    """The stored records of ``partition`` with ``start <= seq < end``, from one short read
    snapshot: at most ``max_records`` of them and about ``max_bytes``; call again from
    ``next`` until it reaches ``end``. ``cache``: ``[None, 0, None]`` kept by the caller
    across calls, so a log chunk read in several calls is decoded once.

    Raises ``QueueNotFound`` when the queue was deleted (or deleted and created again: another
    ``qid``), ``PartitionNotFound`` when the partition is gone (a scale-down dropped it with its
    messages), and ``CorruptStore`` when records the range needs are missing otherwise."""
    with store.read() as r:
        raw = r.queue(queue)
        if raw is None or raw.get("qid") != qid:
            raise QueueNotFound(f"queue {queue!r} was deleted{' and created again' if raw else ''} "
                                f"while it was being read; its messages from then are gone")
        if not r.has_partition(qid, partition):
            where = "parent-queue log" if partition == PARENT else f"partition {partition}"
            raise PartitionNotFound(f"the {where} of queue {queue!r} is gone (a scale-down or a "
                                    f"change of access type removed it with its messages) while "
                                    f"seqs {start} to {end - 1} were being read")
        head = r.head(qid, partition)
        if end > head:
            raise InvalidConfig(f"seqs up to {end - 1} of queue {queue!r} partition {partition} "
                                f"were asked for, but it has only {head}: plan ranges from its head")
        ack = r.ack_state(qid, partition)
        pos = max(start, ack.floor)
        if pos >= end:
            return RangeRead([], end)
        wanted = min(max_records, end - pos)
        found = r.records(qid, partition, pos, wanted, cache)
    out: list[tuple[int, bytes]] = []
    above, size = ack.above, 0
    for seq, record in found:
        if seq >= end:
            break
        if seq != pos:
            _check_acked(ack, pos, seq, queue, partition)
        pos = seq + 1
        if seq in above:
            continue
        out.append((seq, record))
        size += len(record)
        if size >= max_bytes:
            return RangeRead(out, pos)
    else:
        if len(found) == wanted:
            return RangeRead(out, pos)           # the snapshot's share: more may follow
    # the range holds no stored record from pos on (the log ends, or goes past end)
    _check_acked(ack, pos, end, queue, partition)
    return RangeRead(out, end)


def _check_acked(ack, lo: int, hi: int, queue: str, partition: int) -> None:
    """Records lo..hi-1 are not stored: fine when they are all acked (truncated), an error
    otherwise."""
    gone = (s for s in range(max(lo, ack.floor), hi) if s not in ack.above)
    first = next(gone, None)
    if first is not None:
        raise CorruptStore(f"queue {queue!r} partition {partition} is missing seq {first} (and "
                           f"maybe more up to {hi - 1}), which is not acked; run `partq verify`")
