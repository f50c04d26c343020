"""bench/spark_ingest.py and bench/spark_read.py run and print their JSON lines (shape only: no
timing assertions)."""
from __future__ import annotations

import importlib.util
import json
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
    # the peer (publish_many on the same rows) is measured by the bench, not printed as a line;
    # the writer's own work without Spark (staging, then the commit) is context, with no peer
    printed = [line for line in done.stdout.splitlines() if line.strip()]
    context = {"stage_keyed_256B_in_process", "commit_job_keyed_256B"}
    lines = check_bench_lines([line for line in printed if json.loads(line)["name"] not in context],
                              {"spark_ingest_keyed_256B"}, keys=BENCH_KEYS | BENCH_PEER_KEYS,
                              only_keys=True, peers_in_run=False, ratio_from="measured")
    for line in lines.values():
        assert isinstance(line["peer"], str) and line["unit"] == "rows/s", line
    split = check_bench_lines([line for line in printed if json.loads(line)["name"] in context],
                              context, keys=BENCH_KEYS | {"seconds"}, only_keys=True)
    for line in split.values():
        assert line["unit"] == "rows/s" and line["seconds"] > 0, line


READ_BENCH = BENCH.parent / "spark_read.py"


def test_spark_read_quick_prints_batch_and_stream_lines_beside_receive_and_ack(spark, tmp_path):
    """bench/spark_read.py's measuring step, in the tests' Spark session (a JVM less to start
    than running the script, which only adds argument parsing and its own session)."""
    spec = importlib.util.spec_from_file_location("spark_read_bench", READ_BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.run(spark, str(tmp_path / "bench"), rows=2_000, partitions=4, warm_up=False)
    lines = check_bench_lines(out, {"spark_batch_read_256B", "spark_stream_read_256B"},
                              keys=BENCH_KEYS | BENCH_PEER_KEYS, only_keys=True, peers_in_run=False,
                              ratio_from="measured")
    assert {line["peer"] for line in lines.values()} == {"receive_ack_many_100"}
    assert len({line["peer_value"] for line in lines.values()}) == 1     # one peer run for both
    assert all(line["unit"] == "rows/s" for line in lines.values())
