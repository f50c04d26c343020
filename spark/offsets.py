"""The stream's offsets (rule `spark-stream`) and the arithmetic on them, without Spark or I/O.

An offset is a JSON object (Spark stores it in the query's checkpoint, in ``offsets/``)::

    {"queue": "orders", "qid": 3, "consumer": "spark-1f0c...", "seqs": {"0": 120, "1": 98},
     "unacked": true}

``seqs``: per log (a partition, or ``PARENT`` for an exclusive queue's parent log), the next
sequence to read: a micro-batch from offset A to offset B reads, in each log, the messages
``A[p] <= seq < B[p]`` that are not acked (a log missing from A reads from 0: everything not
acked). ``qid`` tells a queue deleted and created again under the same name apart.
``consumer``: the flow name the stream holds its partitions under, chosen once when the query
starts and kept in its checkpoint, so a restarted query is the same consumer (rule `named-flows`).
``unacked``: the micro-batch that ends here read messages, which Spark commits (and partq
acks) only when it plans the next micro-batch; so the next one is planned even with no new
message (an empty micro-batch), and a stream that goes idle leaves nothing unacked.

Offsets are built with their keys in one order: Spark compares them as JSON text.
"""
from __future__ import annotations

from collections.abc import Mapping


def make(queue: str, qid: int, consumer: str, seqs: Mapping[int, int], unacked: bool) -> dict:
    return {"queue": queue, "qid": qid, "consumer": consumer,
            "seqs": {str(p): int(seqs[p]) for p in sorted(seqs)}, "unacked": unacked}


def seqs_of(offset: Mapping) -> dict[int, int]:
    return {int(p): int(s) for p, s in offset["seqs"].items()}


def share(available: Mapping[int, int], limit: int | None) -> dict[int, int]:
    """How many messages each log gives to a micro-batch of at most ``limit`` (None: all):
    in proportion to what each has available, the remainder to the largest fractions.

    Worked example: available {0: 10, 1: 30}, limit 8: shares 2 and 6 (10*8/40, 30*8/40)."""
    total = sum(available.values())
    if limit is None or total <= limit:
        return dict(available)
    shares = {p: n * limit // total for p, n in available.items()}
    left = limit - sum(shares.values())
    for p in sorted(available, key=lambda p: (-(available[p] * limit % total), p)):
        if left <= 0:
            break
        if shares[p] < available[p]:
            shares[p] += 1
            left -= 1
    return shares


def plan_end(start: Mapping[int, int], floors: Mapping[int, int], heads: Mapping[int, int],
             held: frozenset[int], limit: int | None, at_least: int = 0) -> dict[int, int]:
    """The end of the next micro-batch: each log the stream holds moves from its start (or its
    ack floor, when messages before it were acked by someone else) towards its head (capped by
    the caller, e.g. at an available-now target), all of them together by at most ``limit``
    messages, and not at all when fewer than ``at_least`` are there; logs it does not hold stay
    where they are. ``start`` may lack new logs (they start at 0, i.e. at their floor) and hold
    logs that are gone (they are dropped)."""
    base = {p: max(start.get(p, 0), floors[p]) for p in heads}
    available = {p: heads[p] - base[p] for p in heads if p in held and heads[p] > base[p]}
    if sum(available.values()) < at_least:
        available = {}
    taken = share(available, limit)
    return {p: base[p] + taken[p] if p in taken else start.get(p, floors[p]) for p in heads}


def ranges(start: Mapping[int, int], end: Mapping[int, int], split: int,
           floors: Mapping[int, int]) -> list[tuple[int, int, int]]:
    """(log, from, to) ranges of the micro-batch from ``start`` to ``end``, each at most
    ``split`` sequences long, in log order, from each log's ack floor at the latest (what lies
    below it is acked: nothing to read)."""
    out = []
    for p in sorted(end):
        lo, hi = max(start.get(p, 0), floors.get(p, 0)), end[p]
        while lo < hi:
            out.append((p, lo, min(hi, lo + split)))
            lo += split
    return out
