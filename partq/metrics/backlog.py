"""Backlog bytes per partition: the bytes of log chunks a partition still stores (its unacked
records, and acked ones that share a chunk with an unacked one, until that chunk goes).

Walking a partition's log at every scrape would cost O(backlog). Chunks never change once
written and go only from the front (truncation below the ack floor), so this keeps, per
partition, the (last seq, size) of the chunks it has seen: a scrape drops the chunks wholly
below the floor and reads only the chunks appended since the last scrape. The first scrape of a
partition reads all its chunks; memory is 16 bytes per stored chunk.

Thread-safety: one ``BacklogBytes`` serves one scrape at a time (the collector holds a lock).
"""
from __future__ import annotations

from array import array

from partq.storage.encoding import unpack_u64
from partq.storage.writer import QUEUE_BYTES


class _Chunks:
    __slots__ = ("lasts", "sizes", "first", "total", "next_seq")

    def __init__(self, floor: int) -> None:
        self.lasts = array("q")      # last seq of each chunk, ascending
        self.sizes = array("q")      # its stored bytes
        self.first = 0               # index of the first chunk not yet truncated
        self.total = 0               # bytes of chunks[first:]
        self.next_seq = floor        # chunks holding seqs below this were read already


class BacklogBytes:
    def __init__(self) -> None:
        self._parts: dict[tuple[int, int], _Chunks] = {}

    def measure(self, r, qid: int, partition: int, floor: int) -> int:
        """Stored log bytes of the partition, as of read snapshot ``r``, whose ack floor is
        ``floor``."""
        key = (qid, partition)
        st = self._parts.get(key)
        if st is None:
            st = self._parts[key] = _Chunks(floor)
        lasts, sizes = st.lasts, st.sizes
        while st.first < len(lasts) and lasts[st.first] < floor:     # truncated since
            st.total -= sizes[st.first]
            st.first += 1
        if st.first > 1024 and st.first * 2 > len(lasts):
            del lasts[:st.first]
            del sizes[:st.first]
            st.first = 0
        for last, size in r.chunk_sizes(qid, partition, max(st.next_seq, floor)):
            lasts.append(last)
            sizes.append(size)
            st.total += size
            st.next_seq = last + 1
        return st.total

    def keep_only(self, seen: set[tuple[int, int]]) -> None:
        """Forget partitions not measured in the last scrape (deleted queues and partitions)."""
        for key in [k for k in self._parts if k not in seen]:
            del self._parts[key]


def stored_bytes(r, qid: int, backlog: dict[int, int]) -> int:
    """Bytes of queue ``qid``'s stored log: the counter a queue with ``max_bytes`` keeps (what
    its quota checks; one read), else ``backlog``, the bytes ``BacklogBytes`` just measured per
    partition (no read: ``partq.publish.quota.stored_bytes`` would scan every chunk of such a
    queue)."""
    raw = r.queue_meta(qid, QUEUE_BYTES)
    return sum(backlog.values()) if raw is None else unpack_u64(raw)
