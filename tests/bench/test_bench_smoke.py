"""bench/publish.py runs and prints well-formed JSON lines (no timing is asserted)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_env, check_bench_lines

REPO = Path(__file__).resolve().parents[2]

EXPECTED = {
    "raw_lmdb_put_batch_1", "raw_lmdb_put_batch_32", "raw_lmdb_put_batch_100",
    "raw_lmdb_put_batch_1000", "partq_publish_1_thread", "partq_publish_32_threads",
    "partq_publish_32_threads_msgs_per_commit", "partq_publish_many_batch_100",
    "partq_publish_many_batch_1000", "partq_publish_32_vs_1_threads", "load_average_at_start",
    "raw_lmdb_group_commit_32_threads", "partq_publish_32_threads_vs_raw_lmdb_group_commit_32",
    "partq_publish_async_1_thread_window_64", "raw_lmdb_same_work_batch_1000",
    "partq_publish_many_batch_1000_vs_raw_lmdb_same_work",
}


def run_quick(script: str, tmp_path, timeout: float = 120) -> str:
    """Run ``bench/SCRIPT.py --quick`` in the benchmarks' environment; it must succeed and leave
    no scratch directory behind. Returns what it printed."""
    proc = subprocess.run([sys.executable, str(REPO / "bench" / f"{script}.py"), "--quick"],
                          cwd=REPO, env=bench_env(REPO, tmp_path), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"
    return proc.stdout


def test_publish_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("publish", tmp_path)
    check_bench_lines(stdout.splitlines(), EXPECTED, ratio_from="measured")


def test_encode_cost_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("encode_cost", tmp_path)
    check_bench_lines(stdout.splitlines(),
                      {"encode_batch_1000", "decode_record", "record_fields",
                       "raw_lmdb_put_batch_1000", "partq_publish_many_preencoded_1000",
                       "partq_publish_many_batch_1000", "load_average_at_start",
                       "raw_lmdb_same_work_batch_1000",
                       "partq_publish_many_batch_1000_vs_raw_lmdb_same_work"},
                      ratio_from="measured")


def test_online_scaling_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("online_scaling", tmp_path)
    check_bench_lines(stdout.splitlines(),
                      {"no_scaling_consume_rate", "no_scaling_publish_rate",
                       "online_scale_4_to_8_consume_rate", "online_scale_4_to_8_publish_rate",
                       "online_scale_4_to_8_check_switched_off_after",
                       "offline_scale_4_to_8_consume_rate", "offline_scale_4_to_8_publish_rate",
                       "offline_scale_4_to_8_ingress_off"}, ratio_from="printed")


def test_memory_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("memory", tmp_path, timeout=60)
    lines = check_bench_lines(stdout.splitlines(),
                              {"load_average_at_start", "memory_broker_backlog",
                               "memory_serve_idle_clients"})
    assert lines["memory_broker_backlog"]["depth"] == lines["memory_broker_backlog"]["messages"]
    assert lines["memory_serve_idle_clients"]["clients"] == 50
    for name in ("memory_broker_backlog", "memory_serve_idle_clients"):
        assert lines[name]["unit"] == "MiB" and lines[name]["target"] == 200.0
        assert lines[name]["target_is"] == "max"


def test_report_collects_lines_and_writes_the_table(tmp_path):
    """bench/report.py --collect tags each line with its script (and a missing script with a
    skipped line); the render shows figures, ratios, targets and skips, never a made-up figure."""
    script = tmp_path / "publish.py"
    script.write_text(
        "import json\n"
        "print(json.dumps({'name': 'load_average_at_start', 'unit': 'runnable processes', "
        "'value': 1.5, 'cpus': 2, 'date': '2026-01-01 00:00:00 UTC'}))\n"
        "print(json.dumps({'name': 'partq_publish_many_batch_1000_vs_raw_lmdb_same_work', "
        "'unit': 'msgs/s', 'value': 90.0, 'peer': 'raw_lmdb_same_work_batch_1000', "
        "'peer_value': 100.0, 'ratio': 0.9, 'ratio_min': 0.8, 'ratio_max': 1.0, 'pairs': 7, "
        "'target': 0.85}))\n")
    into = tmp_path / "run.jsonl"
    report = str(REPO / "bench" / "report.py")
    for s in (str(script), str(tmp_path / "spark_read.py")):
        proc = subprocess.run([sys.executable, report, "--collect", s, "--into", str(into)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in into.read_text().splitlines()]
    assert [d["script"] for d in lines] == ["publish", "publish", "spark_read"]
    assert lines[-1]["value"] is None and "not built" in lines[-1]["skipped"]
    proc = subprocess.run([sys.executable, report, "--results", str(into), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "README.md").read_text()
    assert "| what | partq | peer | ratio (min-max of pairs) | target | result |" in md
    assert "0.9x (0.8-1)" in md and ">= 0.85x | met" in md
    assert "spark_read.py is not built yet" in md and "2 CPUs" in md


def test_hostile_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("hostile", tmp_path, timeout=300)
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert [d["name"] for d in lines] == ["serve_rss_peak_under_attack",
                                          "serve_rss_after_clients_left",
                                          "legit_worst_publish_latency_under_attack"]
    for d in lines:
        assert d["attacked_round"]["errors"] == 0 and d["calm_round"]["errors"] == 0
        assert d["peer_value"] > 0 and d["value"] > 0


def test_takeover_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("takeover", tmp_path, timeout=180)
    check_bench_lines(stdout.splitlines(),
                      {"owner_failover_after_sigkill",
                       "owner_takeover_after_sigstop_consumer_timeout_1s",
                       "publish_worst_latency_1s_nobody_stopped",
                       "publish_worst_latency_consumer_stopped_1s"}, ratio_from="measured")


def test_tls_soak_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("tls_soak", tmp_path)
    lines = [json.loads(x) for x in stdout.splitlines()]
    check_bench_lines(stdout.splitlines(), {"load_average_at_start", "tls_soak_lost_connections",
                                            "tls_soak_rounds_per_s"}, ratio_from="measured",
                      positive=False, peers_in_run=False)
    lost = next(x for x in lines if x["name"] == "tls_soak_lost_connections")
    assert lost["value"] == 0 and lost["requests_failed"] == 0, lost


def test_startup_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("startup", tmp_path)
    lines = check_bench_lines(stdout.splitlines(),
                              {"load_average_at_start", "python_bare", "python_import_click",
                               "partq_version", "partq_help", "import_partq",
                               "python_lmdb_msgpack_crc32c_click_one_put",
                               "python_lean_crc32c_one_put", "partq_publish",
                               "partq_publish_vs_lean_peer"},
                              ratio_from="measured", peers_in_run=True)
    for name, target in (("partq_version", 1.5), ("partq_publish", 2.0)):
        assert lines[name]["target"] == target and lines[name]["target_is"] == "ratio_max"


def test_transactions_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("transactions", tmp_path)
    check_bench_lines(stdout.splitlines(),
                      {"load_average_at_start", "partq_transaction_100_acks_100_publishes"},
                      ratio_from="measured", peers_in_run=False)


def test_console_bench_quick_prints_json_lines(tmp_path):
    stdout = run_quick("console", tmp_path)
    lines = check_bench_lines(stdout.splitlines(),
                              {"load_average_at_start", "partq_stats_json_30_queues",
                               "console_overview_30_queues", "console_open_cpu_30_queues",
                               "console_open_cpu_30_queues_partq_console"},
                              ratio_from="measured", positive=False)
    overview = lines["console_overview_30_queues"]
    assert overview["target"] == 1000.0 and overview["queues"] == 30
    assert lines["console_open_cpu_30_queues"]["polls"] >= 1
def test_worker_bench_quick_prints_json_lines_and_says_skipped_without_redis(tmp_path):
    """bench/worker.py --quick with a PATH that has no redis-server: dramatiq's and Celery's
    lines say why they have no figure; partq's (and huey's, when installed) are measured."""
    venv_bin = str(Path(sys.executable).parent)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "worker.py"), "--quick"],
                          cwd=REPO, env=bench_env(REPO, tmp_path, path=venv_bin),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"
    names = {"load_average_at_start", "worker_noop_8", "worker_sleep5ms_8",
             "worker_sleep5ms_8_vs_ideal"} | {
        f"worker_{label}_8_vs_{peer}" for label in ("noop", "sleep5ms")
        for peer in ("dramatiq_redis", "celery_redis", "huey_sqlite")}
    lines = check_bench_lines(proc.stdout.splitlines(), names, skips=True, peers_in_run=False,
                              ratio_from="measured")
    for peer in ("dramatiq_redis", "celery_redis"):
        assert "redis-server" in lines[f"worker_noop_8_vs_{peer}"]["peer_skipped"]
    assert lines["worker_sleep5ms_8_vs_ideal"]["target"] == 0.9
@pytest.mark.parametrize("with_redis", [True, False])
def test_dramatiq_on_partq_bench_quick_prints_json_lines(tmp_path, with_redis):
    """Without redis-server on PATH the Redis side is skipped, with its reason, never a number."""
    pytest.importorskip("dramatiq")
    if with_redis and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here")
    env = bench_env(REPO, tmp_path, None if with_redis else os.path.dirname(sys.executable))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "dramatiq_on_partq.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"
    lines = check_bench_lines(proc.stdout.splitlines(),
                              {"load_average_at_start", "dramatiq_partq_msgs_per_s",
                               "dramatiq_partq_keyed_msgs_per_s"},
                              skips=True, peers_in_run=False, ratio_from="measured")
    line = lines["dramatiq_partq_msgs_per_s"]
    assert line["target"] == 1.0 and "appendfsync always" in line["durability"]
    if with_redis:
        assert line["peer_value"] > 0 and line["ratio"] > 0
    else:
        assert line["peer_value"] is None and "redis-server" in line["peer_skipped"]


@pytest.mark.parametrize("with_redis", [True, False])
def test_celery_on_partq_bench_quick_prints_json_lines(tmp_path, with_redis):
    """bench/celery_on_partq.py --quick: partq's figures measured; without redis-server on PATH
    the Redis side says skipped, with its reason, never a number."""
    pytest.importorskip("celery")
    if with_redis and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here")
    env = bench_env(REPO, tmp_path, None if with_redis else os.path.dirname(sys.executable))
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "celery_on_partq.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"
    lines = check_bench_lines(proc.stdout.splitlines(),
                              {"load_average_at_start", "celery_partq_noop_8",
                               "celery_partq_sleep5ms_8"},
                              skips=True, peers_in_run=False, ratio_from="measured")
    for name in ("celery_partq_noop_8", "celery_partq_sleep5ms_8"):
        line = lines[name]
        assert line["target"] == 1.0 and line["value"] > 0
        assert "appendfsync always" in line["durability"] and "acks_late" in line["durability"]
        if with_redis:
            assert line["peer_value"] > 0 and line["ratio"] > 0
        else:
            assert line["peer_value"] is None and "redis-server" in line["peer_skipped"]
