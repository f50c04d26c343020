"""Spark ingestion throughput: ``df.write.format("partq")`` beside ``Broker.publish_many``.

Writes N keyed rows of 256-byte payloads (default 1,000,000) with Spark in local[2] mode through
the "partq" data source (stage per task attempt, one commit per job, rule `spark-exactly-once`), and the same
rows from one Python process with ``publish_many`` in batches of 1000, each into a fresh partq directory.
Prints one JSON object per line::

    {"name": "spark_ingest_keyed_256B", "unit": "rows/s", "value": ..., "peer":
     "publish_many_batch1000", "peer_value": ..., "ratio": value / peer_value}

The Spark figure is the wall time of ``save()`` after a warm-up job (JVM and Python workers
already started): row generation in the JVM, Arrow transfer, encoding and staging in the tasks,
and the driver's commit. The peer's rows are generated before its clock starts.

Two lines of context split the writer's own work without Spark, the same rows in one Python
process: ``stage_keyed_{PAYLOAD_BYTES}B_in_process`` (``partq.jobs.staging.Stager`` as the tasks
use it, two task attempts of half the rows each, in turn) and ``commit_job_keyed_{PAYLOAD_BYTES}B``
(the driver's ``commit_job`` of those attempts: it runs after every task ended, so its time
adds to the tasks').

    python bench/spark_ingest.py [--rows N] [--quick] [--partitions P] [--keep DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import partq

QUEUE = "ingest"
PAYLOAD_BYTES = 256
KEYS = 10_000
PEER_BATCH = 1000


def spark_session(master: str):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(master).appName("partq-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "2g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def frame(spark, rows: int, tasks: int):
    """Row i: key ``customer-{i % KEYS}``, payload the 64 hex digits of sha256(str(i)), four
    times (256 bytes); ``python_rows`` builds the same rows."""
    from pyspark.sql import functions as F
    return (spark.range(0, rows, 1, tasks)
            .select(F.concat(F.lit("customer-"), (F.col("id") % KEYS).cast("string")).alias("key"),
                    F.repeat(F.sha2(F.col("id").cast("string"), 256), 4).cast("binary").alias("body")))


def python_rows(rows: int) -> list[tuple[bytes, str]]:
    return [((hashlib.sha256(str(i).encode()).hexdigest() * 4).encode(), f"customer-{i % KEYS}")
            for i in range(rows)]


def spark_write(spark, df, path: str, partitions: int) -> None:
    (df.write.format("partq").option("path", path).option("queue", QUEUE)
       .option("partitions", str(partitions)).option("keyColumn", "key")
       .option("payloadColumn", "body").mode("append").save())


def depth(path: str, queue: str = QUEUE) -> int:
    with partq.Broker.open(path, create=False, auto_tick=False) as broker:
        return broker.queue_status(queue).depth


def arguments(quick_rows: int, quick_help: str, argv=None,
              tasks: bool = True) -> argparse.Namespace:
    """The options both Spark benchmarks take (``--quick`` sets ``rows`` to ``quick_rows``)."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--partitions", type=int, default=8, help="queue partitions")
    if tasks:
        parser.add_argument("--tasks", type=int, default=2, help="Spark partitions of the DataFrame")
    parser.add_argument("--keep", metavar="DIR", help="work under DIR and keep it")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = quick_rows
    return args


@contextmanager
def work_dir(prefix: str, keep: str | None) -> Iterator[str]:
    """``keep`` (made if missing), or a temporary directory removed afterwards."""
    base = keep or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(base, exist_ok=True)
    try:
        yield base
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


def stage_and_commit(path: str, items: list[tuple[bytes, str]],
                     partitions: int) -> tuple[float, float]:
    """Seconds to stage ``items`` as two task attempts would (one after the other, in this
    process), and seconds of the job's commit."""
    from partq.jobs.staging import DEFAULT_BATCH_ROWS, Stager, commit_job, new_job_id
    half, attempts = (len(items) + 1) // 2, []
    with partq.Broker.open(path, auto_tick=False) as broker:
        broker.create_queue(QUEUE, partitions=partitions)
        job = new_job_id()
        start = time.perf_counter()
        for task in range(2):
            stager = Stager(broker, QUEUE, job, task, 100 + task, DEFAULT_BATCH_ROWS)
            part = items[task * half:(task + 1) * half]
            for i in range(0, len(part), 10_000):
                stager.add_items(part[i:i + 10_000])
            attempts.append((task, 100 + task, stager.close()))
        staged = time.perf_counter()
        commit_job(broker, QUEUE, job, attempts)
        committed = time.perf_counter()
        if broker.queue_status(QUEUE).depth != len(items):
            raise SystemExit(f"the staged job published {broker.queue_status(QUEUE).depth} rows, "
                             f"expected {len(items)}")
    return staged - start, committed - staged


def main(argv=None) -> int:
    args = arguments(20_000, "20,000 rows (a smoke run)", argv)
    rows = args.rows
    with work_dir("partq-spark-bench-", args.keep) as base:
        from partq.spark import register
        spark = spark_session("local[2]")
        register(spark)
        spark_write(spark, frame(spark, 1000, args.tasks), os.path.join(base, "warmup"), args.partitions)

        spark_path = os.path.join(base, "spark")
        df = frame(spark, rows, args.tasks)
        start = time.perf_counter()
        spark_write(spark, df, spark_path, args.partitions)
        spark_seconds = time.perf_counter() - start
        spark.stop()
        if depth(spark_path) != rows:
            raise SystemExit(f"spark wrote {depth(spark_path)} rows, expected {rows}")

        peer_path = os.path.join(base, "publish_many")
        items = python_rows(rows)
        with partq.Broker.open(peer_path, auto_tick=False) as broker:
            broker.create_queue(QUEUE, partitions=args.partitions)
            start = time.perf_counter()
            for i in range(0, rows, PEER_BATCH):
                broker.publish_many(QUEUE, items[i:i + PEER_BATCH])
            peer_seconds = time.perf_counter() - start
        if depth(peer_path) != rows:
            raise SystemExit(f"publish_many wrote {depth(peer_path)} rows, expected {rows}")

        stage_seconds, commit_seconds = stage_and_commit(os.path.join(base, "staged"), items,
                                                         args.partitions)
        for name, seconds in ((f"stage_keyed_{PAYLOAD_BYTES}B_in_process", stage_seconds),
                              (f"commit_job_keyed_{PAYLOAD_BYTES}B", commit_seconds)):
            print(json.dumps({"name": name, "unit": "rows/s", "value": round(rows / seconds, 1),
                              "seconds": round(seconds, 3)}), flush=True)
        value, peer_value = rows / spark_seconds, rows / peer_seconds
        print(json.dumps({"name": f"spark_ingest_keyed_{PAYLOAD_BYTES}B", "unit": "rows/s",
                          "value": round(value, 1), "peer": f"publish_many_batch{PEER_BATCH}",
                          "peer_value": round(peer_value, 1), "ratio": round(value / peer_value, 3)}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
