"""bench/partitioner.py --quick: JSON shape, outputs, and the qualitative claims the README makes.

The bench runs in simulated time (a ManualClock, consumer speeds in messages per step, seeded
arrivals and partitioners), so its figures are the same on every machine; the thresholds below
still leave wide margins (measured with seeds 1-8: batch-sticky skew 4.3-7.3x, uniform spread
<= 1.3%, adaptive max backlog 11-19% of uniform's, adaptive throughput +9%).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_env, check_bench_lines

REPO = Path(__file__).resolve().parents[2]
STRATEGIES = ("random", "batch_sticky", "uniform_sticky", "adaptive_sticky")
PER_PARTITION = ("records", "bytes", "batches", "records_per_batch")
PER_STRATEGY = ("fast_mean_records", "slow_vs_fast_records", "bytes_spread", "slow_backlog_max",
                "slow_backlog_final", "consumed_per_s")
COMPARISONS = {
    "adaptive_vs_uniform_slow_backlog_max": "uniform_sticky_slow_backlog_max",
    "adaptive_vs_uniform_slow_backlog_final": "uniform_sticky_slow_backlog_final",
    "adaptive_vs_uniform_consumed_per_s": "uniform_sticky_consumed_per_s",
    "adaptive_vs_random_consumed_per_s": "random_consumed_per_s",
    "batch_sticky_vs_uniform_slow_records": "uniform_sticky_p0_records",
}
EXPECTED = ({"offered_per_s", "batch_sticky_producer_blocked_max",
             "batch_sticky_producer_blocked_final"} | set(COMPARISONS)
            | {f"{s}_p{p}_{m}" for s in STRATEGIES for p in range(3) for m in PER_PARTITION}
            | {f"{s}_{m}" for s in STRATEGIES for m in PER_STRATEGY})


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-partitioner")
    scratch, out = tmp / "scratch", tmp / "out"
    scratch.mkdir()
    env = bench_env(REPO, scratch)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "partitioner.py"), "--quick",
                           "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc, scratch, out


@pytest.fixture(scope="module")
def results(quick_run):
    proc, _, _ = quick_run
    # counts and backlogs may be 0; ratios are of the printed figures
    return check_bench_lines(proc.stdout.splitlines(), positive=False)


def test_every_result_is_printed_once_with_its_peer(results):
    assert set(results) == EXPECTED
    for name, peer in COMPARISONS.items():
        assert results[name]["peer"] == peer


def test_outputs_written_and_scratch_removed(quick_run, results):
    proc, scratch, out = quick_run
    jsonl = (out / "partitioner.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in jsonl] == [json.loads(x) for x in proc.stdout.splitlines()]
    if importlib.util.find_spec("matplotlib") is not None:
        png = out / "partitioner.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(scratch.iterdir()) == [], "the bench left broker directories behind"


def test_seed_style_tables_on_stderr(quick_run):
    err = quick_run[0].stderr
    header = "Partition  TotalBatches  TotalBytes TotalRecords  BytesPerBatch  RecordsPerBatch"
    assert err.count(header) == 2
    assert "batch_sticky (partition 0 slow)" in err and "uniform_sticky (partition 0 slow)" in err


def test_records_add_up(results):
    offered = results["offered_per_s"]["value"]
    for s in STRATEGIES:
        for p in range(3):
            r = results[f"{s}_p{p}_records"]["value"]
            assert results[f"{s}_p{p}_bytes"]["value"] == r * 1024
            b = results[f"{s}_p{p}_batches"]["value"]
            assert b > 0 and results[f"{s}_p{p}_records_per_batch"]["value"] == pytest.approx(r / b, abs=1e-3)
        # nobody consumes more than was offered
        assert results[f"{s}_consumed_per_s"]["value"] <= offered + 1e-6


def test_batch_creation_sticky_skews_records_to_the_slow_partition(results):
    # KIP-794's table: the slow partition gets several times the records of a fast one ...
    assert results["batch_sticky_slow_vs_fast_records"]["ratio"] > 2.5
    # ... because its batches are full while the fast partitions send small ones ...
    slow_rpb = results["batch_sticky_p0_records_per_batch"]["value"]
    fast_rpb = max(results[f"batch_sticky_p{p}_records_per_batch"]["value"] for p in (1, 2))
    assert slow_rpb > 12 and slow_rpb > 4 * fast_rpb
    # ... with about as many batches per partition (within a factor of 2 here).
    batches = [results[f"batch_sticky_p{p}_batches"]["value"] for p in range(3)]
    assert max(batches) < 2 * min(batches)


def test_uniform_sticky_spreads_bytes_evenly(results):
    assert results["uniform_sticky_bytes_spread"]["value"] < 0.05
    assert 0.9 < results["uniform_sticky_slow_vs_fast_records"]["ratio"] < 1.1


def test_adaptive_sticky_keeps_the_slow_backlog_down_without_losing_throughput(results):
    assert results["adaptive_vs_uniform_slow_backlog_max"]["ratio"] < 0.5
    assert results["adaptive_sticky_slow_backlog_max"]["value"] < \
        results["uniform_sticky_slow_backlog_max"]["value"]
    assert results["adaptive_vs_uniform_consumed_per_s"]["ratio"] >= 0.99
    # it sends the slow partition less than its even share
    assert results["adaptive_sticky_slow_vs_fast_records"]["ratio"] < 1.0
