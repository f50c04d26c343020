"""``partq copy-out`` to files: a re-run continues a large file by streaming it (memory stays far
below the file's size), ``--to-file -`` is standard output, ``--overwrite`` replaces a file, and a
full disk (the real ``/dev/full``) is one error line, in this process and in a real one."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest
from tools_helpers import ok, user_error

PROBE = """
import json, sys
def status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out
from partq.tools.cli import main
import partq.broker, partq.tools.copy_cmds  # the CLI loads a command's modules when it runs:
before = status()                           # loaded here, they are not counted as growth
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"before": before, "after": status(), "code": code}), file=sys.stderr)
"""

FILE_BYTES = 50 << 20


@pytest.fixture
def q(run, broker):
    ok(run("queue", "create", "q", "-p", "2"))
    broker.publish_many("q", [(b"p%d" % i, f"k{i}") for i in range(40)])
    return "q"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc")
def test_resuming_a_50_mb_file_streams_it(run, broker, tmp_path):
    """The re-run reads the 50 MB export to find where each partition stopped: its peak RSS
    grows by a small fraction of the file (it once loaded the file: 135 MB for 50 MB)."""
    ok(run("queue", "create", "big", "-p", "4"))
    payload = os.urandom(700)
    per_batch = 2000
    batches = FILE_BYTES // (per_batch * 1000) + 1          # ~1000 bytes per JSON line
    for b in range(batches):
        broker.publish_many("big", [(payload, f"k{b}-{i}") for i in range(per_batch)])
    out = tmp_path / "big.jsonl"
    ok(run("copy-out", "big", "--to-file", out, "--batch", "5000"))
    size = out.stat().st_size
    assert size >= FILE_BYTES, size
    broker.publish_many("big", [(payload, f"new{i}") for i in range(100)])
    proc = subprocess.run([sys.executable, "-c", PROBE, "--data", broker.path, "copy-out", "big",
                           "--to-file", str(out), "--json"], capture_output=True, text=True,
                          timeout=300)
    probe = json.loads(proc.stderr.strip().splitlines()[-1])
    assert probe["code"] == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["copied"] == 100 and doc["records_already_in_file"] == batches * per_batch
    grown = probe["after"]["VmHWM"] - probe["before"]["VmRSS"]
    assert grown < size // 10, (grown, size)                 # 5 MB of slack for 50 MB
    assert probe["after"]["VmHWM"] < size, probe             # the whole process, too


def test_to_file_dash_is_standard_output(run, q):
    result = ok(run("copy-out", q, "--to-file", "-"))
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(base64.b64decode(r["payload_b64"]) for r in records) == \
        sorted(b"p%d" % i for i in range(40))
    assert "copied 40 messages" in result.stderr          # the report moves to stderr
    as_json = ok(run("copy-out", q, "--to-file", "-", "--json"))
    assert len(as_json.stdout.splitlines()) == 40
    report = json.loads(as_json.stderr)
    assert report["to_file"] == "-" and report["copied"] == 40
    user_error(run("copy-out", q, "--to-file", "-", "--parent", "--move"), "standard output")


def test_overwrite_replaces_instead_of_continuing(run, broker, q, tmp_path):
    out = tmp_path / "o.jsonl"
    ok(run("copy-out", q, "--to-file", out))
    doc = json.loads(ok(run("copy-out", q, "--to-file", out, "--json")).stdout)
    assert (doc["copied"], doc["records_already_in_file"]) == (0, 40)
    out2 = tmp_path / "other.txt"
    out2.write_text("precious, not an export\n")
    user_error(run("copy-out", q, "--to-file", out2), "--overwrite")
    assert out2.read_text() == "precious, not an export\n"
    for target in (out, out2):
        doc = json.loads(ok(run("copy-out", q, "--to-file", target, "--overwrite",
                                "--json")).stdout)
        assert doc["overwritten"] is True and doc["copied"] == 40
        assert len(target.read_bytes().splitlines()) == 40
    user_error(run("copy-out", q, "--to-queue", "q2", "--overwrite"), "--to-file only")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("fmt", ["jsonl", "msgpack"])
def test_a_full_disk_is_one_error_line(run, q, fmt):
    user_error(run("copy-out", q, "--to-file", "/dev/full", "--format", fmt),
               "cannot write /dev/full: No space left on device", "free some disk space")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [
    ["copy-out", "q", "--to-file", "/dev/full"],
    ["copy-out", "q", "--to-file", "-"],              # standard output is /dev/full
    ["inspect", "q", "--json"],
    ["queue", "list"],
    ["consume", "q", "--max", "5", "--timeout", "5", "--json"],
])
def test_a_full_disk_in_a_real_process(partq_script, data, q, args):
    with open("/dev/full", "w") as full:
        proc = subprocess.run([partq_script, "--data", data, *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("Error: "), proc.stderr
    assert "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
