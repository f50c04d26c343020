"""bench/peers.py --quick runs and prints well-formed JSON lines (no timing is asserted).

A peer that is missing here (redis-server is not on every machine; persist-queue, litequeue and
the redis client come with the ``bench`` extra) must appear as a line with a ``skipped`` reason,
never with a number, so the test passes with and without them.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import BENCH_KEYS, BENCH_PEER_KEYS, bench_env, check_bench_lines

REPO = Path(__file__).resolve().parents[2]
KEYS = BENCH_KEYS | BENCH_PEER_KEYS
PEERS = {"raw_lmdb_put_batch_1", "raw_lmdb_put_batch_32", "raw_lmdb_put_batch_100",
         "raw_lmdb_put_batch_1000", "raw_lmdb_partitioned_put_batch_1000", "persistqueue_put",
         "litequeue_put", "redis_xadd",
         "redis_xadd_pipeline_100", "redis_xreadgroup_xack_100", "persistqueue_get_ack",
         "litequeue_pop_done", "raw_lmdb_group_commit_1_thread", "raw_lmdb_group_commit_32_threads",
         "raw_lmdb_group_commit_32_vs_1_threads", "raw_lmdb_same_work_batch_1000",
         "load_average_at_start"}
PARTQ = {"partq_publish_1_thread", "partq_publish_1_thread_vs_persistqueue_put",
         "partq_publish_1_thread_vs_litequeue_put", "partq_publish_1_thread_vs_redis_xadd",
         "partq_publish_32_threads", "partq_publish_32_vs_1_threads",
         "partq_publish_32_threads_vs_raw_lmdb_group_commit_32",
         "partq_publish_async_1_thread_window_64",
         "partq_publish_many_batch_100", "partq_publish_many_batch_100_vs_redis_xadd_pipeline_100",
         "partq_publish_many_batch_1000",
         "partq_publish_many_batch_1000_vs_redis_xadd_pipeline_100",
         "partq_publish_many_batch_1000_vs_raw_lmdb_same_layout",
         "partq_publish_many_batch_1000_vs_raw_lmdb_same_work",
         "partq_receive_ack_many_1_flow", "partq_receive_ack_many_1_flow_vs_persistqueue_get_ack",
         "partq_receive_ack_many_1_flow_vs_litequeue_pop_done", "partq_receive_ack_many_4_flows",
         "partq_receive_ack_many_4_flows_vs_persistqueue_get_ack",
         "partq_receive_ack_many_4_flows_vs_litequeue_pop_done",
         "partq_receive_ack_many_4_vs_1_flows", "partq_receive_ack_many_async_1_flow",
         "partq_receive_ack_many_async_4_flows",
         "partq_receive_ack_many_async_1_flow_vs_persistqueue_get_ack", "partq_open_10k_msgs",
         "partq_open_50k_msgs"}
REDIS = {"redis_xadd", "redis_xadd_pipeline_100", "redis_xreadgroup_xack_100"}


def _have_redis() -> bool:
    return shutil.which("redis-server") is not None and importlib.util.find_spec("redis") is not None


def run_quick(tmp: Path, path_env: str | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    scratch, out, cache = tmp / "scratch", tmp / "out", tmp / "cache"
    scratch.mkdir()
    env = bench_env(REPO, scratch, path_env)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "peers.py"), "--quick",
                           "--out", str(out), "--cache", str(cache)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert list(scratch.iterdir()) == [], "the bench left scratch directories behind"
    return proc, out


def parse(proc: subprocess.CompletedProcess) -> dict[str, dict]:
    """Every line has all of KEYS; a peer that was not measured is a ``skipped`` reason, never
    a number, and the lines comparing with it repeat the reason as ``peer_skipped``."""
    return check_bench_lines(proc.stdout.splitlines(), keys=KEYS, skips=True)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    proc, out = run_quick(tmp_path_factory.mktemp("bench-peers"))
    return proc, out, parse(proc)


def test_every_line_parses_with_its_keys(quick):
    _, _, results = quick
    assert set(results) == PEERS | PARTQ
    for name in PARTQ:
        assert results[name].get("skipped") is None, results[name]  # partq itself always runs
    for name in PEERS - REDIS:
        if name.startswith("raw_lmdb"):
            assert results[name].get("skipped") is None


def test_redis_runs_or_says_why(quick):
    _, _, results = quick
    for name in REDIS:
        if _have_redis():
            assert results[name].get("skipped") is None, results[name]
        else:
            assert "redis" in results[name]["skipped"].lower(), results[name]


def test_outputs_written(quick):
    proc, out, _ = quick
    jsonl = (out / "peers.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in jsonl] == [json.loads(x) for x in proc.stdout.splitlines()]
    md = (out / "peers.md").read_text()
    assert "| metric | partq | peer | peer value | ratio |" in md and "## Targets" in md
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "peers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_redis_server_the_redis_lines_are_skipped(tmp_path):
    """PATH without redis-server: the bench still runs, and says why the Redis lines are empty."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    python_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in [python_dir, str(bindir), "/usr/local/bin", "/bin"]
                           if not (Path(p) / "redis-server").exists())
    proc, _ = run_quick(tmp_path, path_env=path)
    results = parse(proc)
    assert set(results) == PEERS | PARTQ
    for name in REDIS:
        assert "redis-server" in results[name]["skipped"], results[name]
    for name in ("partq_publish_1_thread_vs_redis_xadd", "partq_receive_ack_many_1_flow",
                 "partq_receive_ack_many_4_flows"):
        assert "redis-server" in results[name]["peer_skipped"], results[name]
        assert results[name]["value"] > 0  # partq's own figure is still real
    # a comparison between two partq figures is unaffected
    assert results["partq_receive_ack_many_4_vs_1_flows"]["ratio"] > 0
