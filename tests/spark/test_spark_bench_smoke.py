"""bench/spark_ingest.py runs and prints its JSON lines (shape only: no timing assertions)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import BENCH_KEYS, BENCH_PEER_KEYS, check_bench_lines
from spark_helpers import require_spark

BENCH = Path(__file__).resolve().parents[2] / "bench" / "spark_ingest.py"


def test_spark_ingest_quick_prints_side_by_side_json(tmp_path):
    require_spark()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--keep", str(tmp_path / "bench")],
                          capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    # the peer (publish_many on the same rows) is measured by the bench, not printed as a line
    lines = check_bench_lines([line for line in done.stdout.splitlines() if line.strip()],
                              {"spark_ingest_keyed_256B"}, keys=BENCH_KEYS | BENCH_PEER_KEYS,
                              only_keys=True, peers_in_run=False, ratio_from="measured")
    for line in lines.values():
        assert isinstance(line["peer"], str) and line["unit"] == "rows/s", line
