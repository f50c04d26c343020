"""The "partq" Spark Python data source: read a queue, consume it as a stream, write into it.

    spark.read.format("partq").option("path", DIR).option("queue", Q).load()        # rule `spark-read`
    spark.readStream.format("partq").option("path", DIR).option("queue", Q).load()  # rule `spark-stream`
    df.write.format("partq").option("path", DIR).option("queue", Q).save()         # rule `spark-exactly-once`

``path`` is a directory on the host every executor runs on (Spark local mode, one machine:
LMDB does not work over network filesystems); ``.option("address", "HOST:PORT")`` with
``token``/``tokenFile`` goes through ``partq serve`` instead (rule `spark-remote`). The options of each
direction are in docs/spark.md and in ``partq.spark.batch``, ``.stream`` and ``.writer``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import BinaryType, CharType, StringType, StructType, VarcharType

from partq.errors import InvalidConfig
from partq.jobs.staging import DEFAULT_BATCH_ROWS, new_job_id
from partq.spark import options as opts
from partq.spark.access import RemoteJobs, ensure_local_queue, open_jobs
from partq.spark.batch import PartqBatchReader, PartqFilteringReader
from partq.spark.ranges import DEFAULT_SPLIT_ROWS
from partq.spark.rows import SCHEMA_DDL
from partq.spark.stream import PartqStreamReader
from partq.spark.writer import PartqWriter

__all__ = ["PartqDataSource", "PartqFilteringDataSource", "register"]

_STRING_TYPES = (StringType, VarcharType, CharType)
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark, pushdown: bool | None = None) -> None:
    """Register the "partq" data source with a SparkSession.

    ``pushdown``: whether batch reads take filters on partition, seq and key (None: when the
    session's ``spark.sql.python.filterPushdown.enabled`` is true now). Spark refuses a reader
    that takes filters while that setting is off, so register again after changing it.

    The Python workers must import partq: run Spark's workers with the interpreter that has it
    (``PYSPARK_PYTHON``, default ``python3`` on the PATH). Spark 4 looks Python data sources up
    in the JVM thread's active session; a query from another Python thread than the one that
    registered may report DATA_SOURCE_NOT_FOUND until that thread sets it:
    ``spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)``.
    """
    if pushdown is None:
        pushdown = str(spark.conf.get(PUSHDOWN_CONF, "false")).lower() == "true"
    check_workers_python(spark)
    spark.dataSource.register(PartqFilteringDataSource if pushdown else PartqDataSource)


def check_workers_python(spark) -> None:
    """In local mode, check that the interpreter Spark starts its Python workers with can
    import partq, so that a missing ``PYSPARK_PYTHON`` is one line here rather than a worker's
    traceback on the first query. (On a cluster the workers run elsewhere: not checked.)"""
    master = str(spark.sparkContext.master)
    if not master.startswith("local"):
        return
    python = (spark.conf.get("spark.pyspark.python", None) or os.environ.get("PYSPARK_PYTHON")
              or "python3")
    if os.path.realpath(shutil.which(python) or python) == os.path.realpath(sys.executable):
        return
    try:
        done = subprocess.run([python, "-c", "import partq.spark"], capture_output=True,
                              timeout=60)
        fine = done.returncode == 0
    except (OSError, subprocess.SubprocessError):
        fine = False
    if not fine:
        raise InvalidConfig(f"Spark starts its Python workers with {python!r}, which cannot "
                            f"import partq; set PYSPARK_PYTHON={sys.executable} (the "
                            f"interpreter of this session) before creating the SparkSession")


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


class PartqDataSource(DataSource):
    """The "partq" format: see the module documentation."""

    @classmethod
    def name(cls) -> str:
        return "partq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def _reader_options(self) -> tuple[opts.Where, int]:
        return (opts.where(self.options),
                opts.int_option(self.options, "splitRows", DEFAULT_SPLIT_ROWS) or DEFAULT_SPLIT_ROWS)

    def reader(self, schema: StructType) -> PartqBatchReader:
        opts.check_known(self.options, opts.READ, "spark.read")
        where, split_rows = self._reader_options()
        return PartqBatchReader(where, opts.bool_option(self.options, "parent", False), split_rows)

    def streamReader(self, schema: StructType) -> PartqStreamReader:
        opts.check_known(self.options, opts.STREAM, "spark.readStream")
        where, split_rows = self._reader_options()
        consumer = self.options.get("consumer") or None
        return PartqStreamReader(where, consumer,
                                 opts.int_option(self.options, "maxMessagesPerTrigger", None),
                                 opts.bool_option(self.options, "failOnDataLoss", True), split_rows)

    def writer(self, schema: StructType, overwrite: bool) -> PartqWriter:
        """Runs on the driver: check the options against the schema, make sure the queue exists
        (creating it when ``partitions`` is given), finish any commit an earlier job left
        unfinished, and create the job id."""
        options = self.options
        opts.check_known(options, opts.WRITE, "df.write")
        if overwrite:
            raise InvalidConfig("the partq data source only appends: use .mode('append')")
        where = opts.where(options)
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
        batch_rows = opts.int_option(options, "batchSize", DEFAULT_BATCH_ROWS) or DEFAULT_BATCH_ROWS
        partitions = opts.int_option(options, "partitions", None)
        if where.address is None:
            ensure_local_queue(where.path, where.queue, partitions)
        else:
            with RemoteJobs(where) as remote:
                remote.ensure_queue(partitions)
        with open_jobs(where) as jobs:
            jobs.resume(batch_rows)          # a commit an earlier job's driver did not finish
        return PartqWriter(where=where, job_id=new_job_id(), key_index=key_index,
                           payload_index=payload_index, payload_is_string=payload_is_string,
                           payload_name=None if payload_index is None else schema.fieldNames()[payload_index],
                           batch_rows=batch_rows)


class PartqFilteringDataSource(PartqDataSource):
    """The "partq" format whose batch reader takes pushed-down filters (``register``)."""

    def reader(self, schema: StructType) -> PartqBatchReader:
        opts.check_known(self.options, opts.READ, "spark.read")
        where, split_rows = self._reader_options()
        return PartqFilteringReader(where, opts.bool_option(self.options, "parent", False),
                                    split_rows)
