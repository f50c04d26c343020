"""Checking the keys of the log against what they must be, for ``partq verify``: a damaged key
(a flipped bit) moves its chunk elsewhere in the log, or names a range its value does not hold,
and reading the log by sequence then finds a gap where the chunk was (``Reader.records``
reports each missing sequence as a damaged record). This check names the keys themselves.

What must hold, for each partition that exists: its chunks follow one another without gap or
overlap, each key is the last sequence its value holds, no key reaches the partition's head,
and every sequence from the ack floor up to the head is in a chunk. A log key of no existing
partition is damage too (deleting a queue or a partition deletes its chunks in the same
commit). Reads short snapshots, ``BATCH`` chunks each, like every other check of ``verify``.
"""
from __future__ import annotations

from dataclasses import dataclass

from partq.storage.errors import CorruptStore
from partq.storage.txn import QID, Reader

BATCH = 1000                # chunks checked in one read snapshot
Span = tuple[int, int] | None
Entry = tuple[bytes, Span]
_UNKNOWN = (-1, -1)         # the bounds of a partition whose ack state is damaged


@dataclass(frozen=True)
class LogFault:
    """A damaged log key: the key, the queue id and partition it names (None when it is not
    a log key at all), and what is wrong."""
    key: bytes
    qid: int | None
    partition: int | None
    reason: str


def check_log(store, qid: int | None = None) -> list[LogFault]:
    """Every damaged key of the log of queue id ``qid`` (None: of the whole log)."""
    if qid is None:
        start, end = b"", b"\xff" * 17
    else:
        start, end = QID.pack(qid), QID.pack(qid) + b"\xff" * 13
    faults: list[LogFault] = []
    while True:
        with store.read() as r:
            before, entries = r.chunk_spans(start, end, BATCH + 1)
            more = len(entries) > BATCH
            _Batch(r, faults).check(before, entries, more)
        if not more:
            return faults
        start = entries[-1][0]


class _Batch:
    """The checks of one snapshot's entries (each with the one before it and after it)."""

    def __init__(self, r: Reader, faults: list[LogFault]) -> None:
        self.r, self.faults = r, faults
        self.bounds: dict[bytes, tuple[int, int] | None] = {}

    def check(self, before: Entry | None, entries: list[Entry], more: bool) -> None:
        last = len(entries) - 1
        for i in range(last if more else last + 1):
            prev = entries[i - 1] if i else before
            nxt = entries[i + 1] if i < last else None
            self.entry(entries[i], prev, nxt)

    def fault(self, key: bytes, reason: str) -> None:
        qid, partition = ((int.from_bytes(key[:4], "big"), int.from_bytes(key[4:8], "big"))
                          if len(key) == 16 else (None, None))
        self.faults.append(LogFault(key, qid, partition, reason))

    def floor_and_head(self, prefix: bytes) -> tuple[int, int] | None:
        """The partition's ack floor and head; None when it does not exist, ``_UNKNOWN`` when
        its ack state is damaged (which ``verify`` reports on its own)."""
        if prefix not in self.bounds:
            qid, partition = int.from_bytes(prefix[:4], "big"), int.from_bytes(prefix[4:], "big")
            try:
                found = (self.r.ack_state(qid, partition).floor, self.r.head(qid, partition)) \
                    if self.r.has_partition(qid, partition) else None
            except CorruptStore:
                found = _UNKNOWN
            self.bounds[prefix] = found
        return self.bounds[prefix]

    def entry(self, entry: Entry, prev: Entry | None, nxt: Entry | None) -> None:
        key, span = entry
        if len(key) != 16:
            self.fault(key, f"a key of {len(key)} bytes in the log, whose keys are 16")
            return
        if prev is not None and prev[0] >= key:
            self.fault(key, f"it sorts at or before the key before it ({prev[0].hex()}): the "
                            f"page holding them is damaged")
        bounds = self.floor_and_head(key[:8])
        if bounds is None:
            self.fault(key, "it belongs to no partition of any queue")
            return
        if bounds is _UNKNOWN:
            return
        floor, head = bounds
        last = int.from_bytes(key[8:], "big")
        if span is None:
            self.fault(key, "its value is not a chunk of records")
            return
        first, n = span
        if first + n - 1 != last:
            self.fault(key, f"it names seq {last} as its chunk's last, and its value holds seqs "
                            f"{first}..{first + n - 1}")
            return
        if last >= head:
            self.fault(key, f"it names seq {last}, at or past the partition's head {head}")
        after = _sound_last(prev, key[:8])
        if after is None:       # the first chunk, or the one before it is damaged
            expected = floor if prev is None or prev[0][:8] != key[:8] else first
        else:
            expected = after + 1
        if first > max(expected, floor) and floor < head:
            self.fault(key, f"seqs {max(expected, floor)}..{first - 1} before it are in no chunk")
        elif after is not None and first < expected:
            self.fault(key, f"its seqs {first}..{expected - 1} are in the chunk before it too")
        if (nxt is None or nxt[0][:8] != key[:8]) and last < head - 1:
            self.fault(key, f"seqs {max(last + 1, floor)}..{head - 1} after it, up to the "
                            f"partition's head, are in no chunk")


def _sound_last(entry: Entry | None, prefix: bytes) -> int | None:
    """The last seq of ``entry``'s chunk when it is of the partition of ``prefix`` and its key
    matches its value; None otherwise."""
    if entry is None or entry[0][:8] != prefix or entry[1] is None or len(entry[0]) != 16:
        return None
    first, n = entry[1]
    last = int.from_bytes(entry[0][8:], "big")
    return last if first + n - 1 == last else None

