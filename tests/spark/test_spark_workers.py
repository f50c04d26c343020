"""``partq.spark.register`` checks, in local mode, that Spark's Python workers can import partq."""
from __future__ import annotations

import sys

import pytest

import partq
import partq.spark


def test_register_says_when_the_workers_python_cannot_import_partq(spark, monkeypatch, tmp_path):
    """Without PYSPARK_PYTHON, Spark's workers run `python3`, which may not have partq: a
    41-line worker traceback on the first query, before this check."""
    bare = tmp_path / "bare-python"
    bare.write_text("#!/bin/sh\nexec /usr/bin/python3 -I \"$@\"\n")   # isolated: no partq
    bare.chmod(0o755)
    monkeypatch.setenv("PYSPARK_PYTHON", str(bare))
    with pytest.raises(partq.InvalidConfig, match="cannot import partq; set PYSPARK_PYTHON="):
        partq.spark.register(spark)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    partq.spark.register(spark)                    # the interpreter with partq: fine
