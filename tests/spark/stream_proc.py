"""A Structured Streaming query from a partq queue into a parquet sink, in its own process, for
the tests that kill it (tests/spark/test_spark_stream.py).

    python stream_proc.py DATA QUEUE CHECKPOINT SINK [--max N] [--available-now]

Runs until the query ends (``--available-now``: once everything there at its start is in the
sink) or the process is killed. Prints ``started`` once the query runs.
"""
from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("queue")
    parser.add_argument("checkpoint")
    parser.add_argument("sink")
    parser.add_argument("--max", type=int, help="maxMessagesPerTrigger")
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import partq.spark
    spark = (SparkSession.builder.master("local[2]").appName("partq-stream-proc")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", "1g")
             .config("spark.local.dir", os.path.join(os.path.dirname(args.sink), "spark-local"))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    partq.spark.register(spark)
    reader = spark.readStream.format("partq").option("path", args.data).option("queue", args.queue)
    if args.max:
        reader = reader.option("maxMessagesPerTrigger", str(args.max))
    writer = (reader.load().writeStream.format("parquet").option("path", args.sink)
              .option("checkpointLocation", args.checkpoint))
    writer = (writer.trigger(availableNow=True) if args.available_now
              else writer.trigger(processingTime="0 seconds"))
    query = writer.start()
    print("started", flush=True)
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
