"""bench/replication.py --quick runs and prints the documented JSON lines (shape only: the
figures themselves depend on the machine)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BENCH_KEYS, check_bench_lines

BENCH = Path(__file__).resolve().parents[2] / "bench" / "replication.py"


@pytest.mark.timeout(180)
def test_bench_replication_quick_prints_json_lines():
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--seconds", "0.3"],
                         capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    # the machine's load first (bench/method.py), then the results; lags may be 0; the async
    # lag's peer (the sync lag) is not a line of its own; ratios are of the unrounded figures
    rows = check_bench_lines([line for line in out.stdout.splitlines() if line.strip()],
                             keys=BENCH_KEYS, positive=False, peers_in_run=False,
                             ratio_from="measured")
    assert next(iter(rows)) == "load_average_at_start"
    for name, row in rows.items():
        if name.startswith("publish") and name.split(".")[1] != "no_standby":
            assert row["pairs"] == 1 and row["peer"].startswith(name.split(".")[0]), row
    names = set(rows)
    for workload in ("publish_many_b100", "publish_single_8t"):
        for mode in ("no_standby", "async_standby", "sync_standby"):
            assert f"{workload}.{mode}" in names
    for series in ("messages", "seconds"):
        for stat in ("max", "mean"):
            assert f"replication_lag.async.{series}_{stat}" in names
    assert all(r["unit"] == "msgs/s" for r in rows.values() if r["name"].startswith("publish"))
