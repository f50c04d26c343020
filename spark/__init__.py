"""partq.spark: Spark reads a queue, consumes it as a stream, and writes into it.

    from partq.spark import register
    register(spark)                      # registers the "partq" Python data source
    df = spark.read.format("partq").option("path", "/data/partq").option("queue", "orders").load()
    stream = (spark.readStream.format("partq").option("path", "/data/partq")
              .option("queue", "orders").load())
    (df.write.format("partq")
       .option("path", "/data/partq").option("queue", "orders")
       .option("keyColumn", "customer").option("payloadColumn", "body")
       .mode("append").save())

Needs the ``spark`` extra (``pip install 'partq[spark]'``: pyspark>=4.0, pyarrow, pandas). The
options and guarantees of each direction: docs/spark.md, and ``partq.spark.batch`` (rule
`spark-read`), ``partq.spark.stream`` (rule `spark-stream`) and ``partq.spark.writer`` (rule
`spark-exactly-once`).
"""
from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("partq.spark needs PySpark 4.0 or later: pip install 'partq[spark]'") from exc

from partq.spark.source import PartqDataSource, PartqFilteringDataSource, register
from partq.spark.writer import PartqCommitMessage, PartqWriter

__all__ = ["PartqCommitMessage", "PartqDataSource", "PartqFilteringDataSource", "PartqWriter",
           "register"]
