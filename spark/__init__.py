"""partq.spark: write Spark DataFrames into a partq queue, exactly once per job (S28).

    from partq.spark import register
    register(spark)                      # registers the "partq" Python data source
    (df.write.format("partq")
       .option("path", "/data/partq").option("queue", "orders")
       .option("keyColumn", "customer").option("payloadColumn", "body")
       .mode("append").save())

Needs the ``spark`` extra (``pip install 'partq[spark]'``: pyspark>=4.0, pyarrow, pandas). See
``partq.spark.source`` for the options and the exactly-once protocol.
"""
from __future__ import annotations

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("partq.spark needs PySpark 4.0 or later: pip install 'partq[spark]'") from exc

from partq.spark.source import PartqCommitMessage, PartqDataSource, PartqWriter, register

__all__ = ["PartqCommitMessage", "PartqDataSource", "PartqWriter", "register"]
