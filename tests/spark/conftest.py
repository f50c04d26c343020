"""The ``spark`` fixture: one real local-mode SparkSession shared by the Spark tests of a run.

Starting a JVM and Spark's Python workers costs about ten seconds, so the session is made once
for the tests of this folder and stopped when the run leaves it (after its last test), not at
the end of the whole run; a later Spark test would start another one.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from spark_helpers import require_spark  # tests/spark is on sys.path: pyproject.toml's pythonpath

HERE = Path(__file__).resolve().parent
_shared: dict = {}


def _start():
    from pyspark.sql import SparkSession

    import partq.spark

    # Python workers must run this interpreter (the one with partq installed), not `python3`.
    _shared["saved"] = os.environ.get("PYSPARK_PYTHON")
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
    _shared["spark"] = session
    return session


def _stop() -> None:
    session = _shared.pop("spark", None)
    if session is None:
        return
    session.stop()
    saved = _shared.pop("saved", None)
    if saved is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = saved


@pytest.fixture
def spark():
    require_spark()
    session = _shared.get("spark") or _start()
    yield session
    for query in session.streams.active:     # a test's streaming query never outlives it
        query.stop()


@pytest.hookimpl(trylast=True)        # after the test's own fixtures are torn down
def pytest_runtest_teardown(item, nextitem) -> None:
    if nextitem is None or HERE not in Path(nextitem.path).resolve().parents:
        _stop()
