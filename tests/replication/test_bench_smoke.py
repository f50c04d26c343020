"""bench/replication.py --quick runs and prints the documented JSON lines (shape only: the
figures themselves depend on the machine)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "replication.py"
KEYS = {"name", "unit", "value", "peer", "peer_value", "ratio"}


@pytest.mark.timeout(180)
def test_bench_replication_quick_prints_json_lines():
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--seconds", "0.3"],
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    assert rows, "no output"
    names = set()
    for row in rows:
        assert set(row) == KEYS, row
        assert isinstance(row["name"], str) and isinstance(row["unit"], str)
        assert isinstance(row["value"], (int, float)) and row["value"] >= 0
        if row["peer"] is None:
            assert row["peer_value"] is None and row["ratio"] is None
        else:
            assert isinstance(row["peer"], str) and isinstance(row["peer_value"], (int, float))
            assert row["ratio"] is None or isinstance(row["ratio"], (int, float))
        names.add(row["name"])
    for workload in ("publish_many_b100", "publish_single_8t"):
        for mode in ("no_standby", "async_standby", "sync_standby"):
            assert f"{workload}.{mode}" in names
    for series in ("messages", "seconds"):
        for stat in ("max", "mean"):
            assert f"replication_lag.async.{series}_{stat}" in names
    assert all(r["unit"] == "msgs/s" for r in rows if r["name"].startswith("publish"))
