"""``partq copy-in``: a copy-out export loaded back into a queue, each message exactly once across
re-runs, interruptions (SIGKILL included), continued exports, renamed files and either format."""
from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess

import msgpack
import pytest
from helpers import wait_until
from tools_helpers import ok, user_error

import partq


def _publish(broker, queue: str, n: int, start: int = 0) -> collections.Counter:
    items = []
    for i in range(start, start + n):
        headers = {"i": i, "raw": b"\x00\xff"} if i % 7 == 0 else None
        items.append((b"m%06d" % i + (b"\x00\xfe" if i % 5 == 0 else b""),
                      f"k{i % 13}" if i % 3 else None, headers))
    broker.publish_many(queue, items)
    return collections.Counter(_freeze(item) for item in items)


def _freeze(item) -> tuple:
    payload, key, headers = item
    return payload, key, json.dumps(headers, sort_keys=True, default=repr)


def _contents(broker, queue: str) -> collections.Counter:
    """Every message of ``queue`` as (payload, key, headers), without consuming it."""
    out: collections.Counter = collections.Counter()
    with broker.store.read() as r:
        raw = r.queue(queue)
    from partq.ops.browse import browse
    for row in browse(broker.store, queue, None, False, 0, None, None, 0):
        out[_freeze((row["payload"], row["key"], row["headers"]))] += 1
    assert raw is not None
    return out


@pytest.fixture
def src(run, broker):
    ok(run("queue", "create", "src", "-p", "3"))
    return _publish(broker, "src", 300)


@pytest.mark.parametrize("fmt", ["jsonl", "msgpack"])
def test_copy_in_restores_an_export_and_a_rerun_copies_nothing(run, broker, src, tmp_path, fmt):
    export = tmp_path / f"src.{fmt}"
    ok(run("copy-out", "src", "--to-file", export, "--format", fmt))
    ok(run("queue", "create", "dst", "-p", "2"))
    first = ok(run("copy-in", "dst", export))
    assert "published 300 messages" in first.stdout and "an export of queue 'src'" in first.stdout
    assert _contents(broker, "dst") == src               # payload, key and headers as exported
    again = json.loads(ok(run("copy-in", "dst", export, "--json")).stdout)
    assert (again["published"], again["skipped_already_copied"], again["records"]) == (0, 300, 300)
    assert again["format"] == fmt and again["source_queue"] == "src"
    assert sum(p["skipped"] for p in again["partitions"]) == 300
    assert broker.queue_status("dst").depth == 300


def test_the_same_export_renamed_or_in_the_other_format_is_the_same_export(run, broker, src,
                                                                          tmp_path):
    ok(run("copy-out", "src", "--to-file", tmp_path / "a.jsonl"))
    ok(run("copy-out", "src", "--to-file", tmp_path / "a.msgpack", "--format", "msgpack"))
    ok(run("queue", "create", "dst"))
    ok(run("copy-in", "dst", tmp_path / "a.jsonl"))
    shutil.move(tmp_path / "a.jsonl", tmp_path / "renamed.data")      # no telling suffix
    for path in (tmp_path / "renamed.data", tmp_path / "a.msgpack"):
        doc = json.loads(ok(run("copy-in", "dst", path, "--json")).stdout)
        assert doc["published"] == 0 and doc["skipped_already_copied"] == 300
    assert broker.queue_status("dst").depth == 300


def test_a_continued_export_adds_only_what_is_new(run, broker, src, tmp_path):
    export = tmp_path / "src.jsonl"
    ok(run("copy-out", "src", "--to-file", export))
    ok(run("queue", "create", "dst", "-p", "4"))
    ok(run("copy-in", "dst", export, "--batch", "7"))
    more = _publish(broker, "src", 120, start=300)
    ok(run("copy-out", "src", "--to-file", export))                   # continues the file
    doc = json.loads(ok(run("copy-in", "dst", export, "--batch", "50", "--json")).stdout)
    assert (doc["published"], doc["skipped_already_copied"]) == (120, 300)
    assert _contents(broker, "dst") == src + more


def test_a_prefix_then_the_whole_file_with_other_batches(run, broker, src, tmp_path):
    """An interrupted run (here: a prefix of the export) and a re-run with another --batch:
    every record once, whatever the batch boundaries were."""
    export = tmp_path / "src.jsonl"
    ok(run("copy-out", "src", "--to-file", export))
    lines = export.read_bytes().splitlines(keepends=True)
    prefix = tmp_path / "prefix.jsonl"
    prefix.write_bytes(b"".join(lines[:137]))
    ok(run("queue", "create", "dst", "-p", "2"))
    assert "published 137" in ok(run("copy-in", "dst", prefix, "--batch", "10")).stdout
    doc = json.loads(ok(run("copy-in", "dst", export, "--batch", "33", "--json")).stdout)
    assert (doc["published"], doc["skipped_already_copied"]) == (163, 137)
    assert _contents(broker, "dst") == src


def test_a_destination_created_again_loads_the_export_in_full(run, broker, src, tmp_path):
    export = tmp_path / "src.jsonl"
    ok(run("copy-out", "src", "--to-file", export))
    ok(run("queue", "create", "dst"))
    ok(run("copy-in", "dst", export))
    ok(run("queue", "delete", "dst", "--yes"))
    ok(run("queue", "create", "dst"))
    assert "published 300 messages" in ok(run("copy-in", "dst", export)).stdout


def test_copy_in_from_standard_input(run, broker, src, tmp_path):
    export = tmp_path / "src.jsonl"
    ok(run("copy-out", "src", "--to-file", export))
    ok(run("queue", "create", "dst"))
    doc = json.loads(ok(run("copy-in", "dst", "-", "--json", input=export.read_text())).stdout)
    assert doc["from_file"] == "-" and doc["published"] == 300 and doc["format"] == "jsonl"
    # stdout of copy-out piped into copy-in: the export of `--to-file -`
    piped = ok(run("copy-out", "src", "--to-file", "-"))
    ok(run("queue", "create", "dst2"))
    assert "published 300" in ok(run("copy-in", "dst2", "-", input=piped.stdout)).stdout


@pytest.mark.parametrize("fmt", ["jsonl", "msgpack"])
def test_a_torn_last_record_is_left_out_and_reported(run, broker, src, tmp_path, fmt):
    export = tmp_path / f"src.{fmt}"
    ok(run("copy-out", "src", "--to-file", export, "--format", fmt))
    whole = export.read_bytes()
    export.write_bytes(whole[:-5])
    ok(run("queue", "create", "dst"))
    result = ok(run("copy-in", "dst", export, "--json"))
    doc = json.loads(result.stdout)
    assert doc["published"] == 299 and doc["torn_bytes"] > 0
    assert "torn record" in result.stderr
    export.write_bytes(whole)                       # the copy-out completed it
    doc = json.loads(ok(run("copy-in", "dst", export, "--json")).stdout)
    assert (doc["published"], doc["torn_bytes"]) == (1, 0)
    assert _contents(broker, "dst") == src


def _rec(queue="src", qid=1, partition=0, seq=0, payload="eA==") -> dict:
    return {"queue": queue, "queue_id": qid, "partition": partition, "seq": seq, "key": None,
            "publish_time_ns": 1, "headers": None, "payload_b64": payload}


@pytest.mark.parametrize("records,fragments", [
    ([{"payload": "hello"}], ["line 1", "not a copy-out record", "partq publish"]),
    ([_rec(), "not json"], ["line 2", "not JSON"]),
    ([_rec(), _rec(queue="other", seq=1)], ["record 2", "of queue 'other'", "one copy-out export"]),
    ([_rec(seq=5), _rec(seq=3)], ["record 2", "seq 3 follows seq 5"]),
    ([_rec(payload="***")], ["line 1", "payload_b64 is not base64"]),
    ([{**_rec(), "seq": -1}], ["line 1", "integers >= 0"]),
])
def test_files_that_are_not_exports_are_refused(run, broker, tmp_path, records, fragments):
    ok(run("queue", "create", "dst"))
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    user_error(run("copy-in", "dst", path), *fragments)


def test_bad_msgpack_and_a_closed_destination(run, broker, src, tmp_path):
    ok(run("queue", "create", "dst"))
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(msgpack.packb([1, 2, 3]))
    user_error(run("copy-in", "dst", bad), "record 1", "not a copy-out record")
    export = tmp_path / "src.jsonl"
    ok(run("copy-out", "src", "--to-file", export))
    ok(run("queue", "update", "dst", "--ingress", "off"))
    user_error(run("copy-in", "dst", export), "ingress disabled", "--ingress on")
    assert broker.queue_status("dst").depth == 0


N_KILL = 30_000


def test_copy_in_killed_and_rerun_copies_everything_once(partq_script, data, run, broker,
                                                         tmp_path):
    ok(run("queue", "create", "big", "-p", "4"))
    expected = _publish(broker, "big", N_KILL)
    export = tmp_path / "big.msgpack"
    ok(run("copy-out", "big", "--to-file", export, "--format", "msgpack"))
    ok(run("queue", "create", "dst", "-p", "3"))
    proc = subprocess.Popen([partq_script, "--data", data, "copy-in", "dst", export, "--batch",
                             "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    def progressed_while_running() -> bool:
        if broker.queue_status("dst").depth >= 3000:
            return True
        assert proc.poll() is None, proc.communicate()
        return False
    wait_until(progressed_while_running, 60, "copy-in to make progress", interval=0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "copy-in finished before SIGKILL"
    assert broker.queue_status("dst").depth < N_KILL
    rerun = subprocess.run([partq_script, "--data", data, "copy-in", "dst", export, "--json"],
                           capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    doc = json.loads(rerun.stdout)
    assert doc["published"] + doc["skipped_already_copied"] == N_KILL
    assert doc["skipped_already_copied"] >= 3000
    got = _contents(broker, "dst")
    assert got == expected, (broker.queue_status("dst").depth, sum(got.values()),
                             sum((got - expected).values()), sum((expected - got).values()), doc)


def test_copy_in_library_call(broker, tmp_path, run, src):
    from partq.ops.copy_in import copy_in
    export = tmp_path / "src.jsonl"
    ok(run("copy-out", "src", "--to-file", export))
    broker.create_queue("dst")
    calls = []
    report = copy_in(broker, "dst", str(export), batch=64, progress=lambda n, t: calls.append((n, t)))
    assert report.published == 300 and report.complete
    assert calls[0] == (0, export.stat().st_size)
    assert sum(n for n, _ in calls) == export.stat().st_size
    stopped = copy_in(broker, "dst", str(export), batch=1, stop=lambda: True)
    assert stopped.published == 0 and stopped.complete          # nothing left to stop in
    with pytest.raises(partq.InvalidConfig):
        copy_in(broker, "dst", str(export), batch=0)


def test_copy_in_creates_the_queue_when_asked_and_says_how_when_not(tmp_path):
    import subprocess

    from tools_helpers import PARTQ_SCRIPT
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("orders", partitions=2)
        broker.publish_many("orders", [(b"m%d" % i, f"k{i}") for i in range(10)])
    export = tmp_path / "orders.jsonl"

    def run(*args):
        return subprocess.run([PARTQ_SCRIPT, "--data", str(data), *args], capture_output=True,
                              text=True, timeout=120)
    assert run("copy-out", "orders", "--to-file", str(export)).returncode == 0
    missing = run("copy-in", "restored", str(export))
    assert missing.returncode == 1
    assert "no queue named 'restored'" in missing.stderr and "--create" in missing.stderr
    made = run("copy-in", "restored", str(export), "--create", "-p", "4")
    assert made.returncode == 0, made.stderr
    with partq.Broker.open(data) as broker:
        st = broker.queue_status("restored")
        assert (st.partition_count, st.depth) == (4, 10)
    again = run("copy-in", "restored", str(export), "--create", "-p", "4")
    assert again.returncode == 0 and "skipped" in again.stdout
