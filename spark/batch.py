"""``spark.read.format("partq")``: a queue's messages at Spark scale, without consuming them (rule
`spark-read`).

Like ``partq inspect``, it binds no flow and writes nothing: it changes no delivery state, and
works while other processes publish, consume or own delivery. It reads each log from its ack
floor up to its head when the query is planned: the messages not acked yet, each once (acked
ones still stored, and those acked while the query runs, are left out). Without options it
reads every partition; ``.option("parent", "true")`` reads the parent queue's log instead (the
messages an exclusive period left stranded, rule `ingress-egress`). One Spark partition per log, split in
ranges of ``splitRows`` sequences for big ones.

Filters on ``partition`` (=, IN), ``seq`` (=, <, <=, >, >=) and ``key`` (=, IN) are pushed down
when the session allows Python data sources to take filters
(``spark.sql.python.filterPushdown.enabled``, see ``partq.spark.register``): they prune logs
and sequence ranges before any task runs, and key filters drop rows in the tasks; Spark does
not evaluate them again.
"""
from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from partq.errors import PartitionNotFound
from partq.ops.browse import describe_logs
from partq.spark.access import open_access
from partq.spark.options import Where
from partq.spark.ranges import read_batches, split
from partq.storage.encoding import PARENT


@dataclass
class Selection:
    """What pushed-down filters keep: logs (None: all), sequences ``lo <= seq < hi`` (None: no
    bound), keys (None: all)."""
    partitions: frozenset[int] | None = None
    lo: int = 0
    hi: int | None = None
    keys: frozenset[str] | None = None

    def take(self, f) -> bool:
        """Narrow the selection by filter ``f`` and say whether it is applied exactly."""
        column = f.attribute[0] if len(f.attribute) == 1 else None
        if column == "partition" and isinstance(f, (EqualTo, In)):
            found = _members(f, int)
            if found is None:
                return False
            self.partitions = found if self.partitions is None else self.partitions & found
            return True
        if column == "seq" and isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual,
                                              LessThan, LessThanOrEqual)):
            if type(f.value) is not int:
                return False
            v = f.value
            lo = {EqualTo: v, GreaterThan: v + 1, GreaterThanOrEqual: v}.get(type(f))
            hi = {EqualTo: v + 1, LessThan: v, LessThanOrEqual: v + 1}.get(type(f))
            if lo is not None:
                self.lo = max(self.lo, lo)
            if hi is not None:
                self.hi = hi if self.hi is None else min(self.hi, hi)
            return True
        if column == "key" and isinstance(f, (EqualTo, In)):
            keys = _members(f, str)
            if keys is None:
                return False
            self.keys = keys if self.keys is None else self.keys & keys
            return True
        return False


def _members(f, kind: type) -> frozenset | None:
    """The values an ``EqualTo`` or ``In`` filter allows, or None when one is not a ``kind``
    (such a filter is left to Spark)."""
    values = [f.value] if isinstance(f, EqualTo) else list(f.value)
    return frozenset(values) if all(type(v) is kind for v in values) else None


class PartqBatchReader(DataSourceReader):
    """Plain values only: Spark pickles it to the tasks."""

    def __init__(self, where: Where, parent: bool, split_rows: int) -> None:
        self.where, self.parent, self.split_rows = where, parent, split_rows
        self.selection = Selection()

    def partitions(self) -> list[InputPartition]:
        with open_access(self.where) as access:
            logs = access.logs()
        present = [s.partition for s in logs.logs]
        if self.parent:
            if PARENT not in present:
                raise PartitionNotFound(f"queue {logs.queue!r} has no parent-queue log (it was "
                                        f"never exclusive); leave out option parent")
            chosen = [logs.log(PARENT)]
        else:
            chosen = [s for s in logs.logs if s.partition != PARENT]
            if not chosen:
                raise PartitionNotFound(f"{describe_logs(present, logs.queue)}; read it with "
                                        f".option('parent', 'true')")
        sel = self.selection
        out: list[InputPartition] = []
        for log in chosen:
            if log is None or (sel.partitions is not None and log.partition not in sel.partitions):
                continue
            lo = max(log.floor, sel.lo)
            hi = log.head if sel.hi is None else min(log.head, sel.hi)
            out += split(logs.qid, log.partition, lo, hi, self.split_rows, sel.keys)
        return out

    def read(self, partition: InputPartition):
        return read_batches(self.where, partition)


class PartqFilteringReader(PartqBatchReader):
    """The batch reader that takes pushed-down filters (only when the session enables them:
    Spark refuses a reader that implements ``pushFilters`` otherwise)."""

    def pushFilters(self, filters):
        return [f for f in filters if not self.selection.take(f)]
