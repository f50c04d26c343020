"""One Spark task of a read: a sequence range of one log of a queue, read into Arrow batches.

Both the batch reader and the stream plan their work as ``LogRange``s; a task opens the queue
(``spark.access``), reads the range in short snapshots (``partq.jobs.log_ranges.read_range``: acked
messages left out, a missing one an error) and turns each snapshot's records into one Arrow
batch (``spark.rows``). It binds nothing and writes nothing.
"""
from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql.datasource import InputPartition

from partq.spark.access import open_access
from partq.spark.options import Where
from partq.spark.rows import arrow_schema, to_batch

DEFAULT_SPLIT_ROWS = 1_000_000      # sequences per Spark task at most


class LogRange(InputPartition):
    """Messages ``start <= seq < end`` of log ``partition`` of queue id ``qid``. Plain values
    only: Spark pickles it to the task."""

    def __init__(self, qid: int, partition: int, start: int, end: int,
                 keys: frozenset[str] | None = None) -> None:
        super().__init__((partition, start, end))
        self.qid, self.partition, self.start, self.end, self.keys = qid, partition, start, end, keys

    def __repr__(self) -> str:
        return f"LogRange(partition={self.partition}, seqs {self.start}..{self.end - 1})"


def split(qid: int, partition: int, start: int, end: int, split_rows: int,
          keys: frozenset[str] | None = None) -> list[LogRange]:
    """``start..end`` as ranges of at most ``split_rows`` sequences."""
    return [LogRange(qid, partition, lo, min(end, lo + split_rows), keys)
            for lo in range(start, end, split_rows)]


def read_batches(where: Where, part: InputPartition) -> Iterator:
    """The Arrow batches of one task (nothing for Spark's placeholder partition, which it reads
    when a plan has no range at all)."""
    if not isinstance(part, LogRange):
        return
    schema = arrow_schema()
    cache: list = [None, 0, None]
    with open_access(where) as access:
        pos = part.start
        while pos < part.end:
            got = access.read(part.qid, part.partition, pos, part.end, cache)
            if got.records:
                batch = to_batch(where.queue, part.partition, got.records, schema, part.keys)
                if batch.num_rows:
                    yield batch
            pos = got.next
