"""The load view the unkeyed sticky partitioner adapts to (rules `adaptive`, `availability-timeout`),
sampled from storage.

Backlog of a partition = messages published and not yet acked = head - ack floor - acked above.
"Last accepted" is when the partition's ack state was last seen to move: acks are what a process
other than the delivery owner can observe, so a publish-only process adapts too. A sample is
reused for ``SAMPLE_INTERVAL`` seconds: reading every partition's state costs two gets each.
"""
from __future__ import annotations

from partq.core.partitioners import PartitionLoad

SAMPLE_INTERVAL = 0.05


class LoadSampler:
    """One per queue, used only by the group-commit thread (not thread-safe)."""

    def __init__(self) -> None:
        self._taken = float("-inf")
        self._load: PartitionLoad | None = None
        self._backlog: list[int] = []          # the sample's backlog, kept honest between samples
        self._progress: list[tuple[int, int]] = []
        self._accepted: list[float] = []

    def load(self, reader, qid: int, n: int, now: float) -> PartitionLoad:
        if self._load is not None and len(self._backlog) == n \
                and now - self._taken < SAMPLE_INTERVAL:
            return self._load
        if len(self._progress) != n:
            self._progress = [(-1, -1)] * n
            self._accepted = [now] * n
        backlog: list[int] = []
        for p in range(n):
            ack = reader.ack_state(qid, p)
            progress = (ack.floor, len(ack.above))
            if progress != self._progress[p]:
                self._progress[p] = progress
                self._accepted[p] = now
            backlog.append(max(0, ack.backlog(reader.head(qid, p))))
        self._taken = now
        self._backlog = backlog
        self._load = PartitionLoad(backlog, list(self._accepted))
        return self._load

    def note_appended(self, p: int, count: int) -> None:
        """Keep the cached backlog honest between samples (this process's own publishes)."""
        if p < len(self._backlog):
            self._backlog[p] += count
