"""Spark reading a queue: ``spark.read.format("partq")`` and ``spark.readStream.format("partq")``
beside one process receiving and acking the same messages.

Publishes N keyed messages of 256-byte payloads (default 1,000,000) into a queue of 8
partitions, twice (one directory for Spark, one for the peer), then measures, in local[2] mode
after a warm-up of both (JVM and Python workers started; not with ``--quick``):

* ``spark_batch_read_256B``: a batch read of the whole queue into Spark's ``noop`` sink (every
  column of every row materialised; nothing consumed);
* ``spark_stream_read_256B``: an available-now streaming query with a checkpoint into the
  ``noop`` sink, from start to end: it consumes the queue, and its last commit acks everything
  (the queue is checked empty after it);

each beside ``receive_ack_many_100``: one process binding a flow and looping ``receive(100)`` +
``ack_many`` over the same messages until all are acked. Prints one JSON object per line::

    {"name": "spark_stream_read_256B", "unit": "rows/s", "value": ..., "peer":
     "receive_ack_many_100", "peer_value": ..., "ratio": value / peer_value}

Targets (issue 17): the stream reads at least 300k rows/s on local[2].

    python bench/spark_read.py [--rows N] [--quick] [--partitions P] [--keep DIR]
"""
from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from spark_ingest import (  # noqa: E402
    PAYLOAD_BYTES,
    arguments,
    depth,
    python_rows,
    spark_session,
    work_dir,
)

import partq  # noqa: E402

QUEUE = "read"
PEER = "receive_ack_many_100"
PUBLISH_BATCH = 10_000


def fill(path: str, rows: int, partitions: int) -> None:
    """A fresh directory with ``rows`` messages: key ``customer-{i % KEYS}``, 256-byte payload."""
    items = python_rows(rows)
    with partq.Broker.open(path, auto_tick=False) as broker:
        broker.create_queue(QUEUE, partitions=partitions)
        for i in range(0, rows, PUBLISH_BATCH):
            broker.publish_many(QUEUE, items[i:i + PUBLISH_BATCH])


def batch_read(spark, path: str) -> float:
    """Seconds to read the whole queue into the noop sink."""
    start = time.perf_counter()
    (spark.read.format("partq").option("path", path).option("queue", QUEUE).load()
     .write.format("noop").mode("overwrite").save())
    return time.perf_counter() - start


def stream_read(spark, path: str, checkpoint: str) -> float:
    """Seconds for an available-now query to consume the whole queue into the noop sink."""
    start = time.perf_counter()
    query = (spark.readStream.format("partq").option("path", path).option("queue", QUEUE).load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - start
    if query.exception() is not None:
        raise SystemExit(f"the streaming query failed: {query.exception()}")
    return seconds


def receive_ack(path: str, rows: int) -> float:
    """Seconds for one process to receive(100) + ack_many every message."""
    with partq.Broker.open(path) as broker:
        flow = broker.bind(QUEUE, name="bench")
        got = 0
        start = time.perf_counter()
        while got < rows:
            msgs = flow.receive(100, timeout=1.0)
            if not msgs:
                raise SystemExit(f"receive gave nothing after {got} of {rows} messages")
            flow.ack_many(msgs)
            got += len(msgs)
        seconds = time.perf_counter() - start
        flow.unbind()
    return seconds


def line(name: str, rows: int, seconds: float, peer_seconds: float) -> str:
    value, peer_value = rows / seconds, rows / peer_seconds
    return json.dumps({"name": name, "unit": "rows/s", "value": round(value, 1), "peer": PEER,
                       "peer_value": round(peer_value, 1), "ratio": round(value / peer_value, 3)})


def run(spark, base: str, rows: int, partitions: int, warm_up: bool = True) -> list[str]:
    """Measure in ``spark`` (a session with the "partq" source registered), under ``base``;
    return the JSON lines."""
    spark_path, peer_path, warm_path = (os.path.join(base, n) for n in ("spark", "peer", "warmup"))
    for path, n in ((spark_path, rows), (peer_path, rows)):
        fill(path, n, partitions)
    if warm_up:
        fill(warm_path, 2_000, partitions)
        batch_read(spark, warm_path)
        stream_read(spark, warm_path, os.path.join(base, "warmup-checkpoint"))

    batch_seconds = batch_read(spark, spark_path)
    if depth(spark_path, QUEUE) != rows:
        raise SystemExit("the batch read changed the queue")
    stream_seconds = stream_read(spark, spark_path, os.path.join(base, "checkpoint"))
    if depth(spark_path, QUEUE) != 0:
        raise SystemExit(f"the stream left {depth(spark_path, QUEUE)} of {rows} messages unacked")

    peer_seconds = receive_ack(peer_path, rows)
    if depth(peer_path, QUEUE) != 0:
        raise SystemExit(f"the peer left {depth(peer_path, QUEUE)} messages unacked")
    return [line(f"spark_batch_read_{PAYLOAD_BYTES}B", rows, batch_seconds, peer_seconds),
            line(f"spark_stream_read_{PAYLOAD_BYTES}B", rows, stream_seconds, peer_seconds)]


def main(argv=None) -> int:
    args = arguments(10_000, "10,000 rows and no warm-up (a smoke run: the figures mean little)",
                     argv, tasks=False)
    with work_dir("partq-spark-read-bench-", args.keep) as base:
        from partq.spark import register
        spark = spark_session("local[2]")
        register(spark)
        try:
            lines = run(spark, base, args.rows, args.partitions, warm_up=not args.quick)
        finally:
            spark.stop()
        for text in lines:
            print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
