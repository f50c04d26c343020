"""bench/publish.py runs and prints well-formed JSON lines (no timing is asserted)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import check_bench_lines

REPO = Path(__file__).resolve().parents[1]

EXPECTED = {
    "raw_lmdb_put_batch_1", "raw_lmdb_put_batch_32", "raw_lmdb_put_batch_100",
    "raw_lmdb_put_batch_1000", "partq_publish_1_thread", "partq_publish_32_threads",
    "partq_publish_32_threads_msgs_per_commit", "partq_publish_many_batch_100",
    "partq_publish_many_batch_1000", "partq_publish_32_vs_1_threads",
}


def test_publish_bench_quick_prints_json_lines(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)  # the bench's scratch directories, and proof it removes them
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "publish.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    check_bench_lines(proc.stdout.splitlines(), EXPECTED, ratio_from="measured")
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"


def test_encode_cost_bench_quick_prints_json_lines(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "encode_cost.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    check_bench_lines(proc.stdout.splitlines(),
                      {"encode_batch_1000", "decode_record", "record_fields",
                       "raw_lmdb_put_batch_1000", "partq_publish_many_preencoded_1000",
                       "partq_publish_many_batch_1000"}, ratio_from="measured")
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"


def test_online_scaling_bench_quick_prints_json_lines(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "online_scaling.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    check_bench_lines(proc.stdout.splitlines(),
                      {"no_scaling_consume_rate", "no_scaling_publish_rate",
                       "online_scale_4_to_8_consume_rate", "online_scale_4_to_8_publish_rate",
                       "online_scale_4_to_8_check_switched_off_after",
                       "offline_scale_4_to_8_consume_rate", "offline_scale_4_to_8_publish_rate",
                       "offline_scale_4_to_8_ingress_off"}, ratio_from="printed")
    assert list(tmp_path.iterdir()) == [], "the bench left scratch directories behind"
