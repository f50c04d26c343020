"""``df.write.format("partq")``: DataFrame rows into a queue, exactly once per job (rule
`spark-exactly-once`).

The driver creates a job id when Spark asks for the writer. Every task attempt encodes its rows
and stages them under (job id, task partition, task attempt id), ``batchSize`` rows per
transaction, keyed rows already placed in their partition (``partq.jobs.staging``); staged rows are
invisible to consumers. Its commit message carries (task partition, attempt id, row count).
When every task succeeded, Spark calls ``commit`` on the driver, which publishes the staged
rows of exactly the attempts Spark accepted and drops the rest (failed and speculative
attempts), in transactions of ``batchSize`` rows, so other publishers never wait for more than
one batch (``partq.jobs.commit``). When the job fails, ``abort`` drops every staged row of the
job. Messages of one key keep their order within one Spark partition; across Spark partitions
there is no order (repartition by the key column to get per-key order overall).

With ``path``, each Python worker call (``write``, ``commit``, ``abort``, and the driver's
planning step) opens the directory and closes it before it returns: LMDB environments never
cross ``fork()``. With ``address`` (rule `spark-remote`) the same calls go to ``partq serve``, which stages
and commits on the server. The writer object Spark pickles to executors holds only plain values.
"""
from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from partq.errors import InvalidMessage, PartqError
from partq.spark.access import open_jobs
from partq.spark.options import Where


@dataclass(frozen=True)
class PartqCommitMessage(WriterCommitMessage):
    """What a successful task attempt reports to the driver."""
    task_partition: int
    attempt_id: int          # TaskContext.taskAttemptId(): unique within the Spark application
    attempt_number: int      # TaskContext.attemptNumber(): 0 for the first try (for logs)
    rows: int


def _msgpack_default(value):
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"cannot msgpack-encode a {type(value).__name__}")


def _has_map(t) -> bool:
    import pyarrow as pa
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    return False


def _map_fixer(t):
    """A function turning Arrow's list-of-pairs form of map values (inside ``t``) into dicts."""
    import pyarrow as pa
    if pa.types.is_map(t):
        fix_key, fix_item = _map_fixer(t.key_type), _map_fixer(t.item_type)

        def fix_map(v):
            if v is None:
                return None
            pairs = [(fix_key(k), fix_item(x)) for k, x in v]
            try:
                return dict(pairs)
            except TypeError:       # unhashable keys (structs, arrays): keep the pairs
                return pairs
        return fix_map
    if pa.types.is_struct(t) and _has_map(t):
        fields = [(t.field(i).name, _map_fixer(t.field(i).type)) for i in range(t.num_fields)]
        return lambda v: None if v is None else {**v, **{n: f(v[n]) for n, f in fields}}
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _has_map(t.value_type):
        fix = _map_fixer(t.value_type)
        return lambda v: None if v is None else [fix(x) for x in v]
    return lambda v: v


@dataclass(frozen=True)
class PartqWriter(DataSourceArrowWriter):
    """Pickled to every task: plain values only (no broker, no LMDB handle)."""
    where: Where
    job_id: str
    key_index: int | None
    payload_index: int | None
    payload_is_string: bool
    payload_name: str | None
    batch_rows: int

    @property
    def path(self) -> str | None:
        return self.where.path

    @property
    def queue(self) -> str:
        return self.where.queue

    def write(self, iterator: Iterator) -> PartqCommitMessage:
        """Runs in a task: stage this attempt's rows, return what was staged."""
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is None:
            raise PartqError("PartqWriter.write runs inside a Spark task (it needs the task's "
                             "context); write with df.write.format('partq') instead of calling it")
        task_partition, attempt_id = ctx.partitionId(), ctx.taskAttemptId()
        with open_jobs(self.where) as jobs:
            stager = jobs.stager(self.job_id, task_partition, attempt_id, self.batch_rows)
            for batch in iterator:
                payloads, keys = self._columns(batch, task_partition)
                stager.add_many(payloads, keys)
            rows = stager.close()
        return PartqCommitMessage(task_partition, attempt_id, ctx.attemptNumber(), rows)

    def _columns(self, batch, task_partition: int):
        import pyarrow as pa
        keys = None
        if self.key_index is not None:
            keys = batch.column(self.key_index).to_pylist()
        if self.payload_index is None:
            packb = msgpack.Packer(use_bin_type=True, default=_msgpack_default).pack
            rows = batch.to_pylist()
            fixes = [(f.name, _map_fixer(f.type)) for f in batch.schema if _has_map(f.type)]
            for row in rows:
                for name, fix in fixes:
                    row[name] = fix(row[name])
            try:
                return [packb(row) for row in rows], keys
            except TypeError as exc:
                raise InvalidMessage(f"a row cannot be msgpack-encoded ({exc}); select a "
                                     f"payloadColumn or convert that column first") from None
        column = batch.column(self.payload_index)
        if column.null_count:
            raise InvalidMessage(f"payloadColumn {self.payload_name!r} is null in a row of Spark "
                                 f"partition {task_partition}; filter out or coalesce null payloads")
        if self.payload_is_string:
            large = pa.types.is_large_string(column.type)
            column = column.cast(pa.large_binary() if large else pa.binary())
        return column.to_pylist(), keys

    def commit(self, messages) -> None:
        """Runs on the driver once every task succeeded: publish the job, a batch per
        transaction."""
        if any(m is None for m in messages):
            raise PartqError(f"commit of partq job {self.job_id} was given a failed task; the job "
                             f"is aborted instead")
        with open_jobs(self.where) as jobs:
            jobs.commit(self.job_id, [(m.task_partition, m.attempt_id, m.rows) for m in messages],
                        self.batch_rows)

    def abort(self, messages) -> None:
        """Runs on the driver when the job failed: drop every row staged for it."""
        with open_jobs(self.where) as jobs:
            jobs.abort(self.job_id)
