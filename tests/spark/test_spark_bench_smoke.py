"""bench/spark_ingest.py runs and prints its JSON lines (shape only: no timing assertions)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_helpers import require_spark

BENCH = Path(__file__).resolve().parents[2] / "bench" / "spark_ingest.py"


def test_spark_ingest_quick_prints_side_by_side_json(tmp_path):
    require_spark()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--keep", str(tmp_path / "bench")],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert lines, done.stderr[-3000:]
    for line in lines:
        assert set(line) == {"name", "unit", "value", "peer", "peer_value", "ratio"}
        assert isinstance(line["name"], str) and isinstance(line["peer"], str)
        assert line["unit"] == "rows/s"
        assert line["value"] > 0 and line["peer_value"] > 0
        assert line["ratio"] == pytest.approx(line["value"] / line["peer_value"], rel=0.01)
    assert [line["name"] for line in lines] == ["spark_ingest_keyed_256B"]
