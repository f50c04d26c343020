"""What holds a partition up, read from the store alone (the poison view of ``queue_status``,
``partq queue show``, ``partq stats`` and the metrics): works in any process, whoever runs
delivery.

A partition is *stuck* when one of its unacked messages came back unacked at least once (its
nack, a handoff that timed out, a lost consumer, a restart: ``AckState.failures``) or waits out
a nack's delay (``AckState.delays``). The lowest such message blocks it: under
``ordering="partition"`` every later message waits behind it, under ``"key"`` the later
messages of its key. That is the message an operator kills or acks (``partq message kill``) when
nobody can process it.

Worked example: a handler nacks seq 0 of partition 0 four times with a 16 s delay; the store
then says failures {0: 4} and delays {0: now + 16 s}, so the partition is stuck on seq 0, whose
next delivery carries delivery_count 5, due at that wall time."""
from __future__ import annotations

from partq.status import Blocked
from partq.storage.encoding import record_fields


def blocking(r, qid: int, sp: int, ack, head: int, now_ns: int) -> Blocked | None:
    """The message that blocks storage partition ``sp`` in read snapshot ``r`` (``ack`` its
    ack state, ``head`` its next sequence), or None when it is not stuck."""
    retrying = [s for s in ack.retried_seqs() if s < head]
    if not retrying:
        return None
    seq = min(retrying)
    fields = _fields(r, qid, sp, seq)
    until = ack.retry_at_ns(seq)
    return Blocked(
        partition=sp, seq=seq, key=None if fields is None else fields[1],
        delivery_count=ack.failed(seq) + 1,
        next_retry=until / 1e9 if until is not None and until > now_ns else None,
        publish_time_ns=None if fields is None else fields[0],
        behind=_behind(ack, seq, head))


def oldest_unacked_ns(r, qid: int, sp: int, ack, head: int) -> int | None:
    """When the oldest unacked message of ``sp`` was published, wall ns (None: none, or its
    record is damaged)."""
    if ack.floor >= head:
        return None
    fields = _fields(r, qid, sp, ack.floor)
    return None if fields is None else fields[0]


def _behind(ack, seq: int, head: int) -> int:
    """Unacked messages after ``seq`` in its partition (those waiting behind it under
    ``ordering="partition"``)."""
    return max(0, head - seq - 1 - sum(1 for s in ack.above if s > seq))


def _fields(r, qid: int, sp: int, seq: int) -> list | None:
    got = r.records(qid, sp, seq, 1)
    if not got or got[0][0] != seq:
        return None
    return record_fields(got[0][1])
