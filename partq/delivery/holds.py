"""Online scaling keeps per-key order (rule `online-scaling`): the cut-over record and the holds it implies.

A partition count change moves keys: after it, key k goes to ``crc32c(k) % new`` where its
earlier messages sit in ``crc32c(k) % old``. An online scaling (ingress on) records, in the same
commit that switches the key mapping, each old partition's last sequence: the *cut-over*. Then
a message published after the cut-over whose key belonged to old partition p (and now lives in
another partition) is not delivered until p has been acked up to its cut-over sequence. A
partition an online scale-down removes is retired: still delivered, and deleted once drained, so
its keys wait for it as any other's. Keys whose old partition has
drained flow at once; unkeyed messages are never held. A held message stops its partition there
(the partition's order is kept), so the hold is visible as that partition's status.

Worked example (4 -> 6, cut-over at partition heads [10, 7, 12, 9]): key "a" hashes to 13, so it
was in 13 % 4 = 1 and is now in 13 % 6 = 1: same partition, never held. Key "b" hashes to 22: it
was in 22 % 4 = 2 and is now in 22 % 6 = 4. A "b" message published after the cut-over lands in
partition 4 and waits there until partition 2's ack floor passes 12 (every "b" message of the
old mapping acked), then flows; messages of partition 4 behind it wait with it.

Once every old partition has drained past its cut-over the record is deleted by the delivery
owner and nothing is checked any more. Record (queue meta ``cutover``), msgpack::

    {"from": old count, "to": new count, "cut": [last seq of old partition p, ...], "time_ns"}
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from partq.core.key_hash import crc32c_of
from partq.storage.encoding import record_fields

CUTOVER = b"cutover"


@dataclass(frozen=True)
class Cutover:
    from_partitions: int
    to_partitions: int
    cut: list[int]              # last sequence of each old partition at the cut-over
    time_ns: int

    def encode(self) -> bytes:
        return msgpack.packb({"from": self.from_partitions, "to": self.to_partitions,
                              "cut": self.cut, "time_ns": self.time_ns})

    @classmethod
    def decode(cls, raw: bytes) -> Cutover:
        d = msgpack.unpackb(raw, raw=False)
        return cls(d["from"], d["to"], list(d["cut"]), d["time_ns"])


def read_cutover(reader, qid: int) -> Cutover | None:
    raw = reader.queue_meta(qid, CUTOVER)
    return None if raw is None else Cutover.decode(raw)


def write_cutover(w, qid: int, old: int, new: int, time_ns: int) -> None:
    """In the commit that switches the key mapping: record every old partition's last seq."""
    cut = [w.head(qid, p) - 1 for p in range(old)]
    w.put_queue_meta(qid, CUTOVER, Cutover(old, new, cut, time_ns).encode())


def clear_cutover(w, qid: int) -> None:
    if w.queue_meta(qid, CUTOVER) is not None:
        w.put_queue_meta(qid, CUTOVER, None)


class Holds:
    """The holds of one cut-over as of one read snapshot (a collect, a status)."""

    def __init__(self, cutover: Cutover, reader, qid: int) -> None:
        self.cutover = cutover
        self._reader, self._qid = reader, qid
        self._drained: dict[int, bool] = {}

    def remaining(self, p: int) -> int:
        """Messages of old partition ``p`` (up to its cut-over) not acked yet; 0 once drained
        or removed."""
        c = self.cutover
        if not self._reader.has_partition(self._qid, p):
            return 0                  # retired by a scale-down and removed once drained
        floor = self._reader.ack_state(self._qid, p).floor
        return max(0, c.cut[p] + 1 - floor)

    def drained(self, p: int) -> bool:
        done = self._drained.get(p)
        if done is None:
            done = self._drained[p] = self.remaining(p) == 0
        return done

    def all_drained(self) -> bool:
        return all(self.drained(p) for p in range(self.cutover.from_partitions))

    def gate(self, q: int) -> Callable[[int, str | None], int | None] | None:
        """For storage partition ``q``: ``blocked(seq, key)`` gives the old partition a message
        waits for, or None when it may go; None when nothing of ``q`` can be held."""
        c = self.cutover
        if q >= c.to_partitions:
            return None
        threshold = c.cut[q] if q < c.from_partitions else -1
        old_n = c.from_partitions

        def blocked(seq: int, key: str | None) -> int | None:
            if key is None or seq <= threshold:
                return None
            p = crc32c_of(key.encode()) % old_n
            if p == q or self.drained(p):
                return None
            return p
        return blocked


def hold_report(reader, qid: int, cutover: Cutover, index: list[int],
                scan_limit: int = 20_000) -> dict:
    """What ``queue show`` says about a cut-over: per old partition its cut-over sequence, the
    messages before it still to be acked (``remaining``) and the messages published after it
    whose key moved from it and wait for it (``held``). ``held`` counts by reading the keys of
    unacked messages after the cut-over, at most ``scan_limit`` records in all; past that the
    counts are lower bounds (``held_exact`` false)."""
    holds = Holds(cutover, reader, qid)
    held = [0] * cutover.from_partitions
    budget = scan_limit
    for q in index:
        gate = holds.gate(q)
        if gate is None or budget <= 0:
            continue
        ack = reader.ack_state(qid, q)
        start = max(ack.floor, cutover.cut[q] + 1 if q < cutover.from_partitions else 0)
        while budget > 0:
            batch = reader.records(qid, q, start, min(budget, 4096))
            if not batch:
                break
            for seq, raw in batch:
                start = seq + 1
                budget -= 1
                fields = record_fields(raw)
                if fields is None or seq in ack.above:
                    continue
                p = gate(seq, fields[1])
                if p is not None:
                    held[p] += 1
    return {"from_partitions": cutover.from_partitions, "to_partitions": cutover.to_partitions,
            "time_ns": cutover.time_ns, "held_exact": budget > 0,
            "old_partitions": [{"partition": p, "cut_seq": cutover.cut[p],
                                "remaining": holds.remaining(p), "held": held[p]}
                               for p in range(cutover.from_partitions)]}
