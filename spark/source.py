"""The "partq" Spark Python data source: ``df.write.format("partq")`` (S28).

Options (case-insensitive, as Spark passes them):

==============  ========  ===================================================================
option          default   meaning
==============  ========  ===================================================================
path            required  the partq directory; it must be on a local filesystem of the host
                          every executor runs on (Spark local mode or one machine: LMDB does
                          not work over network filesystems)
queue           required  the queue to publish into
keyColumn       (none)    a string column holding each message's key (S1: partition
                          ``crc32c(key) % partitions``); a null key publishes that row unkeyed.
                          Without it every row is unkeyed (S2). Other types are refused: cast
                          them, e.g. ``df.withColumn("id", F.col("id").cast("string"))``
payloadColumn   (none)    a binary or string column (strings are utf-8 encoded) holding the
                          payload; a null payload fails the task. Without it the whole row is
                          msgpack-encoded as a map of column name to value (structs and maps as
                          maps, arrays as arrays, binary as bin, timestamps and dates as ISO-8601
                          strings, decimals as strings)
batchSize       10000     rows per staging transaction in each task
partitions      (none)    create the queue with this many partitions if it does not exist (and
                          the directory if missing); without it a missing queue is an error.
                          An existing queue keeps its partition count.
==============  ========  ===================================================================

Only ``mode("append")`` is supported.

Exactly once per job: the driver creates a job id when Spark asks for the writer. Every task
attempt encodes its rows and stages them under (job id, task partition, task attempt id) in the
partq directory, ``batchSize`` rows per transaction; staged rows are invisible to consumers. Its
commit message carries (task partition, attempt id, row count). When every task succeeded,
Spark calls ``commit`` on the driver, which publishes the staged rows of exactly the attempts
Spark accepted, in one transaction (``partq.staging.commit_job``), drops the rest (failed and
speculative attempts), and marks the job committed. When the job fails, ``abort`` drops every
staged row of the job (``partq.staging.abort_job``). Messages of one key keep their order within
one Spark partition; across Spark partitions there is no order (repartition by the key column to
get per-key order overall).

The broker is opened inside each Python worker call (``write``, ``commit``, ``abort``, and the
driver's planning step) and closed before it returns: LMDB environments never cross ``fork()``,
and the writer object Spark pickles to executors holds only plain values.
"""
from __future__ import annotations

import datetime
import decimal
import os
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, CharType, StringType, StructType, VarcharType

from partq.broker import Broker
from partq.errors import (
    InvalidConfig,
    InvalidMessage,
    NotAPartqStore,
    PartqError,
    QueueExists,
    QueueNotFound,
)
from partq.staging import DEFAULT_BATCH_ROWS, Stager, abort_job, commit_job, new_job_id

__all__ = ["PartqDataSource", "PartqWriter", "PartqCommitMessage", "register"]

_STRING_TYPES = (StringType, VarcharType, CharType)
_OPTION_NAMES = ("path", "queue", "keyColumn", "payloadColumn", "batchSize", "partitions")
_OPTIONS = {name.lower() for name in _OPTION_NAMES}


def register(spark) -> None:
    """Register the "partq" data source with a SparkSession.

    The Python workers must import partq: run Spark's workers with the interpreter that has it
    (``PYSPARK_PYTHON``, default ``python3`` on the PATH). Spark 4 looks Python data sources up
    in the JVM thread's active session; a write from another Python thread than the one that
    registered may report DATA_SOURCE_NOT_FOUND until that thread sets it:
    ``spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)``.
    """
    spark.dataSource.register(PartqDataSource)


@dataclass(frozen=True)
class PartqCommitMessage(WriterCommitMessage):
    """What a successful task attempt reports to the driver."""
    task_partition: int
    attempt_id: int          # TaskContext.taskAttemptId(): unique within the Spark application
    attempt_number: int      # TaskContext.attemptNumber(): 0 for the first try (for logs)
    rows: int


def _find_column(schema: StructType, option: str, name: str):
    names = schema.fieldNames()
    if name in names:
        index = names.index(name)
    else:
        matches = [i for i, n in enumerate(names) if n.lower() == name.lower()]
        if len(matches) != 1:
            raise InvalidConfig(f"{option} {name!r} is not a column of the DataFrame (columns: "
                                f"{', '.join(names)}); pass one of them")
        index = matches[0]
    return index, schema.fields[index]


def _int_option(options, name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = 0
    if value < 1:
        raise InvalidConfig(f"option {name} must be a positive integer, not {raw!r}")
    return value


class PartqDataSource(DataSource):
    """``df.write.format("partq")``: see the module documentation for the options."""

    @classmethod
    def name(cls) -> str:
        return "partq"

    def writer(self, schema: StructType, overwrite: bool) -> PartqWriter:
        """Runs on the driver: check the options against the schema, make sure the queue exists
        (creating it when ``partitions`` is given), and create the job id."""
        options = self.options
        unknown = sorted(k for k in options if k.lower() not in _OPTIONS)
        if unknown:
            raise InvalidConfig(f"unknown option(s) {', '.join(unknown)} for the partq data source; "
                                f"known: {', '.join(_OPTION_NAMES)}")
        if overwrite:
            raise InvalidConfig("the partq data source only appends: use .mode('append')")
        path, queue = options.get("path"), options.get("queue")
        if not path:
            raise InvalidConfig("option path is missing: .option('path', '/dir/of/partq/store')")
        if not queue:
            raise InvalidConfig("option queue is missing: .option('queue', 'name-of-queue')")
        key_index = payload_index = None
        payload_is_string = False
        if options.get("keyColumn"):
            key_index, field = _find_column(schema, "keyColumn", options["keyColumn"])
            if not isinstance(field.dataType, _STRING_TYPES):
                raise InvalidConfig(
                    f"keyColumn {field.name!r} has type {field.dataType.simpleString()}; partq keys "
                    f"are strings: cast it, e.g. df.withColumn({field.name!r}, "
                    f"F.col({field.name!r}).cast('string'))")
        if options.get("payloadColumn"):
            payload_index, field = _find_column(schema, "payloadColumn", options["payloadColumn"])
            if not isinstance(field.dataType, (BinaryType, *_STRING_TYPES)):
                raise InvalidConfig(
                    f"payloadColumn {field.name!r} has type {field.dataType.simpleString()}; it must "
                    f"be binary or string: cast or serialize it (e.g. F.to_json), or drop "
                    f"payloadColumn to send whole rows as msgpack maps")
            payload_is_string = not isinstance(field.dataType, BinaryType)
        batch_rows = _int_option(options, "batchSize", DEFAULT_BATCH_ROWS) or DEFAULT_BATCH_ROWS
        partitions = _int_option(options, "partitions", None)
        path = os.path.abspath(path)
        _ensure_queue(path, queue, partitions)
        return PartqWriter(path=path, queue=queue, job_id=new_job_id(), key_index=key_index,
                           payload_index=payload_index, payload_is_string=payload_is_string,
                           payload_name=None if payload_index is None else schema.fieldNames()[payload_index],
                           batch_rows=batch_rows)


def _ensure_queue(path: str, queue: str, partitions: int | None) -> None:
    try:
        broker = Broker.open(path, create=partitions is not None, auto_tick=False)
    except NotAPartqStore as exc:
        raise NotAPartqStore(f"{exc} (or pass .option('partitions', N) to create the store and "
                             f"the queue)") from None
    try:
        try:
            broker.queue_config(queue)
        except QueueNotFound:
            if partitions is None:
                raise QueueNotFound(f"no queue named {queue!r} in {path}; create it first or pass "
                                    f".option('partitions', N) to create it") from None
            try:
                broker.create_queue(queue, partitions=partitions)
            except QueueExists:
                pass    # created concurrently by another writer: use it
    finally:
        broker.close()


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
    path: str
    queue: str
    job_id: str
    key_index: int | None
    payload_index: int | None
    payload_is_string: bool
    payload_name: str | None
    batch_rows: int

    def write(self, iterator: Iterator) -> PartqCommitMessage:
        """Runs in a task: stage this attempt's rows, return what was staged."""
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is None:
            raise PartqError("PartqWriter.write runs inside a Spark task (it needs the task's "
                             "context); write with df.write.format('partq') instead of calling it")
        task_partition, attempt_id = ctx.partitionId(), ctx.taskAttemptId()
        broker = Broker.open(self.path, create=False, auto_tick=False)
        try:
            stager = Stager(broker, self.queue, self.job_id, task_partition, attempt_id, self.batch_rows)
            for batch in iterator:
                payloads, keys = self._columns(batch, task_partition)
                stager.add_many(payloads, keys)
            rows = stager.close()
        finally:
            broker.close()
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
        """Runs on the driver once every task succeeded: publish the job in one transaction."""
        if any(m is None for m in messages):
            raise PartqError(f"commit of partq job {self.job_id} was given a failed task; the job "
                             f"is aborted instead")
        broker = Broker.open(self.path, create=False, auto_tick=False)
        try:
            commit_job(broker, self.queue, self.job_id,
                       [(m.task_partition, m.attempt_id, m.rows) for m in messages])
        finally:
            broker.close()

    def abort(self, messages) -> None:
        """Runs on the driver when the job failed: drop every row staged for it."""
        broker = Broker.open(self.path, create=False, auto_tick=False)
        try:
            abort_job(broker, self.job_id)
        finally:
            broker.close()
