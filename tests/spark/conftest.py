"""Fixtures for the Spark writer tests: one real local-mode SparkSession per test module."""
from __future__ import annotations

import os
import sys

import pytest
from spark_helpers import require_spark  # tests/spark is on sys.path: pyproject.toml's pythonpath


@pytest.fixture(scope="module")
def spark():
    require_spark()
    from pyspark.sql import SparkSession

    import partq.spark

    # Python workers must run this interpreter (the one with partq installed), not `python3`.
    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder
               .master("local[2,3]")                     # 2 threads, a task may fail 3 times
               .appName("partq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.default.parallelism", "4")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("OFF")
    partq.spark.register(session)
    yield session
    session.stop()
    if saved is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = saved
