"""``partq copy-out``: unacked messages to a queue or a file, exactly once across re-runs,
including re-runs after SIGKILL, a torn last record, and files that are not copy-out files."""
from __future__ import annotations

import base64
import collections
import json
import os
import signal
import subprocess

import msgpack
import pytest
from helpers import wait_until
from tools_helpers import json_lines, ok, user_error


def _publish(broker, queue: str, n: int, start: int = 0, batch: int = 5000) -> dict:
    """Publish n messages with unique payloads; return {(partition, seq): (payload, key, headers)}."""
    expected = {}
    for lo in range(start, start + n, batch):
        items = []
        for i in range(lo, min(lo + batch, start + n)):
            headers = {"i": i, "raw": b"\x00\xff"} if i % 7 == 0 else None
            payload = b"m%06d" % i + (b"\x00\xfe" if i % 5 == 0 else b"")
            items.append((payload, f"k{i % 97}" if i % 3 else None, headers))
        for item, res in zip(items, broker.publish_many(queue, items), strict=True):
            expected[(res.partition, res.seq)] = item
    return expected


def _read_jsonl(path) -> dict:
    out = {}
    with open(path, "rb") as f:
        for line in f:
            rec = json.loads(line)
            assert list(rec) == ["queue", "queue_id", "partition", "seq", "key",
                                 "publish_time_ns", "headers", "payload_b64"]
            k = (rec["partition"], rec["seq"])
            assert k not in out, f"duplicate {k}"
            headers = rec["headers"]
            if headers and "raw" in headers:
                headers = {**headers, "raw": base64.b64decode(headers["raw"]["$base64"])}
            out[k] = (base64.b64decode(rec["payload_b64"]), rec["key"], headers)
    return out


def _read_msgpack(path) -> dict:
    out = {}
    with open(path, "rb") as f:
        for rec in msgpack.Unpacker(f, raw=False):
            k = (rec["partition"], rec["seq"])
            assert k not in out, f"duplicate {k}"
            out[k] = (rec["payload"], rec["key"], rec["headers"])
    return out


def _queue_payloads(run, queue: str) -> collections.Counter:
    rows = json_lines(ok(run("inspect", queue, "--limit", "0", "--payload", "base64", "--json")).stdout)
    return collections.Counter(base64.b64decode(r["payload"]) for r in rows)


@pytest.fixture
def orders(run, broker):
    ok(run("queue", "create", "orders", "-p", "3", "--rebalance-delay", "0"))
    return _publish(broker, "orders", 120)


def _ack_some(broker, queue: str, every: int = 4) -> set:
    """Ack every ``every``-th delivered message (acks above the floor stay stored, marked acked);
    return the acked (partition, seq)."""
    flow = broker.bind(queue)
    msgs = []
    while got := flow.receive(max_messages=1000, timeout=0.2):
        msgs += got
    acked = [m for i, m in enumerate(msgs) if i % every == 0]
    flow.ack_many(acked)
    flow.unbind()
    return {(m.partition, m.seq) for m in acked}


@pytest.mark.parametrize("fmt,reader", [("jsonl", _read_jsonl), ("msgpack", _read_msgpack)])
def test_copy_out_to_file_copies_unacked_once(run, broker, orders, tmp_path, fmt, reader):
    acked = _ack_some(broker, "orders")
    out = tmp_path / f"out.{fmt}"
    doc = json.loads(ok(run("copy-out", "orders", "--to-file", out, "--format", fmt,
                            "--batch", "7", "--json")).stdout)
    unacked = {k: v for k, v in orders.items() if k not in acked}
    assert doc["copied"] == len(unacked) and doc["complete"] is True
    assert sum(p["skipped_acked"] for p in doc["partitions"]) > 0
    assert reader(out) == unacked
    before = out.read_bytes()
    again = json.loads(ok(run("copy-out", "orders", "--to-file", out, "--format", fmt,
                              "--json")).stdout)
    assert again["copied"] == 0 and again["records_already_in_file"] == len(unacked)
    assert out.read_bytes() == before
    more = _publish(broker, "orders", 10, start=1000)
    text = ok(run("copy-out", "orders", "--to-file", out, "--format", fmt)).stdout
    assert "copied 10 messages" in text
    assert reader(out) == {**unacked, **more}
    assert broker.queue_status("orders").depth == len(orders) + 10 - len(acked)   # nothing consumed


def test_copy_out_jsonl_records_carry_publish_time(run, broker, orders, tmp_path):
    out = tmp_path / "o.jsonl"
    ok(run("copy-out", "orders", "--to-file", out))
    published = {(r["partition"], r["seq"]): r["publish_time_ns"]
                 for r in json_lines(ok(run("inspect", "orders", "-n", "0", "--json")).stdout)}
    copied = {(r["partition"], r["seq"]): r["publish_time_ns"] for r in json_lines(out.read_text())}
    assert copied == published and all(r["queue"] == "orders" for r in json_lines(out.read_text()))


def test_copy_out_one_partition_and_a_range(run, broker, orders, tmp_path):
    out = tmp_path / "p1.jsonl"
    ok(run("copy-out", "orders", "--to-file", out, "--partition", "1", "--from-seq", "3",
           "--to-seq", "9"))
    assert sorted(_read_jsonl(out)) == [(1, s) for s in range(3, 10)]


def test_copy_out_to_queue_and_rerun(run, broker, orders):
    ok(run("queue", "create", "dest", "-p", "2"))
    acked = _ack_some(broker, "orders", every=5)
    doc = json.loads(ok(run("copy-out", "orders", "--to-queue", "dest", "--batch", "9",
                            "--json")).stdout)
    unacked = [v for k, v in orders.items() if k not in acked]
    assert doc["copied"] == len(unacked) and doc["to_queue"] == "dest"
    assert _queue_payloads(run, "dest") == collections.Counter(p for p, _, _ in unacked)
    assert "copied 0 messages" in ok(run("copy-out", "orders", "--to-queue", "dest")).stdout
    assert _queue_payloads(run, "dest") == collections.Counter(p for p, _, _ in unacked)
    # keys and headers travel; keyed messages land by the destination's own key hash
    rows = json_lines(ok(run("inspect", "dest", "-n", "0", "--payload", "base64", "--json")).stdout)
    by_payload = {v[0]: v for v in unacked}
    for r in rows:
        payload, key, headers = by_payload[base64.b64decode(r["payload"])]
        assert r["key"] == key
        assert (r["headers"] or {}).get("i") == (headers or {}).get("i")
    # another explicit range is another copy (its own checkpoint)
    doc = json.loads(ok(run("copy-out", "orders", "--to-queue", "dest", "--partition", "0",
                            "--from-seq", "0", "--to-seq", "4", "--json")).stdout)
    assert doc["copied"] == len([k for k in orders if k[0] == 0 and k[1] <= 4 and k not in acked])


def test_copy_out_refuses_a_destination_with_ingress_off(run, broker, orders):
    ok(run("queue", "create", "dest", "--ingress", "off"))
    user_error(run("copy-out", "orders", "--to-queue", "dest"), "ingress disabled")
    assert broker.queue_status("dest").discarded == 0


@pytest.mark.parametrize("fmt,reader", [("jsonl", _read_jsonl), ("msgpack", _read_msgpack)])
@pytest.mark.parametrize("cut", [1, 5, 25])
def test_torn_last_record_is_cut_and_recopied(run, broker, orders, tmp_path, fmt, reader, cut):
    out = tmp_path / f"o.{fmt}"
    ok(run("copy-out", "orders", "--to-file", out, "--format", fmt))
    full = out.read_bytes()
    out.write_bytes(full[:-cut])            # a crash in the middle of the last record
    doc = json.loads(ok(run("copy-out", "orders", "--to-file", out, "--format", fmt,
                            "--json")).stdout)
    assert doc["copied"] == 1 and doc["torn_bytes_cut"] > 0
    assert reader(out) == orders


@pytest.mark.parametrize("fmt", ["jsonl", "msgpack"])
def test_a_torn_first_record_is_cut_too(run, orders, tmp_path, fmt):
    out = tmp_path / f"o.{fmt}"
    ok(run("copy-out", "orders", "--to-file", out, "--format", fmt, "--partition", "0",
           "--to-seq", "0"))
    out.write_bytes(out.read_bytes()[:9])   # killed while writing the very first record
    ok(run("copy-out", "orders", "--to-file", out, "--format", fmt))
    reader = _read_jsonl if fmt == "jsonl" else _read_msgpack
    assert reader(out) == orders


@pytest.mark.parametrize("fmt,content,fragment", [
    ("jsonl", b"just some notes\nmore notes\n", "line 1: not JSON"),
    ("jsonl", b"my diary, no newline at all", "no complete record"),
    ("jsonl", b'{"a": 1}\n', "expected an object with keys"),
    ("jsonl", b'{"queue": "other", "queue_id": 1, "partition": 0, "seq": 0, "key": null, '
              b'"publish_time_ns": 1, "headers": null, "payload_b64": ""}\n',
     "messages of queue 'other'"),
    ("jsonl", b'{"queue": "orders", "queue_id": 1, "partition": -1, "seq": 0, "key": null, '
              b'"publish_time_ns": 1, "headers": null, "payload_b64": ""}\n', "integers"),
    ("jsonl", msgpack.packb({"queue": "orders"}), "no complete record"),
    ("jsonl", msgpack.packb({"queue": "orders"}) + b"\n", "not JSON"),
    ("msgpack", b"\xc1\xc1\xc1", "not msgpack"),
    ("msgpack", msgpack.packb([1, 2, 3]) * 3, "expected an object with keys"),
    ("msgpack", b'{"queue": "orders"}\n', "expected an object with keys"),
    ("msgpack", b"\xc6\xff\xff\xff\xff", "no complete record"),
])
def test_a_file_copy_out_did_not_write_is_refused_untouched(run, orders, tmp_path, fmt, content,
                                                             fragment):
    out = tmp_path / "precious"
    out.write_bytes(content)
    user_error(run("copy-out", "orders", "--to-file", out, "--format", fmt), fragment)
    assert out.read_bytes() == content


def test_file_errors_are_one_line(run, orders, tmp_path):
    user_error(run("copy-out", "orders", "--to-file", tmp_path / "missing" / "o.jsonl"),
               "No such file or directory")
    (tmp_path / "adir").mkdir()
    result = run("copy-out", "orders", "--to-file", tmp_path / "adir")
    assert result.exit_code in (1, 2) and "Traceback" not in result.output


# ---------------------------------------------------------------------- SIGKILL and re-run
N_KILL = 50_000


@pytest.fixture
def big(run, broker):
    ok(run("queue", "create", "big", "-p", "4"))
    return _publish(broker, "big", N_KILL)


def _kill_when(proc: subprocess.Popen, progressed, what: str) -> None:
    def progressed_while_running() -> bool:
        if progressed():
            return True
        assert proc.poll() is None, f"{what} ended before it could be killed: {proc.communicate()}"
        return False
    wait_until(progressed_while_running, 60, f"{what} to make progress", interval=0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"{what} finished before SIGKILL; slow it down"


def test_copy_out_to_file_killed_and_rerun(partq_script, data, big, tmp_path):
    out = tmp_path / "big.jsonl"
    proc = subprocess.Popen([partq_script, "--data", data, "copy-out", "big", "--to-file", out,
                             "--batch", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def lines() -> int:
        try:
            return out.read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0
    _kill_when(proc, lambda: lines() >= 4000, "copy-out --to-file")
    copied_before = lines()
    assert copied_before < N_KILL
    rerun = subprocess.run([partq_script, "--data", data, "copy-out", "big", "--to-file", out,
                            "--batch", "5000", "--json"], capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    doc = json.loads(rerun.stdout)
    assert doc["records_already_in_file"] + doc["copied"] == N_KILL
    assert doc["records_already_in_file"] >= copied_before - 50
    assert _read_jsonl(out) == big                       # every message exactly once


def test_copy_out_to_queue_killed_and_rerun(partq_script, data, run, broker, big):
    ok(run("queue", "create", "dest", "-p", "3"))
    proc = subprocess.Popen([partq_script, "--data", data, "copy-out", "big", "--to-queue", "dest",
                             "--batch", "50"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _kill_when(proc, lambda: broker.queue_status("dest").depth >= 4000, "copy-out --to-queue")
    assert broker.queue_status("dest").depth < N_KILL
    rerun = subprocess.run([partq_script, "--data", data, "copy-out", "big", "--to-queue", "dest",
                            "--batch", "2000"], capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert broker.queue_status("dest").depth == N_KILL
    assert _queue_payloads(run, "dest") == collections.Counter(p for p, _, _ in big.values())


def test_progress_goes_to_stderr_on_a_terminal_and_never_with_json(run, orders, tmp_path,
                                                                   monkeypatch):
    from partq.tools import output
    monkeypatch.setattr(output, "_isatty", lambda stream: True)
    result = ok(run("copy-out", "orders", "--to-file", tmp_path / "a.jsonl"))
    assert "copying orders" in result.stderr and "copying" not in result.stdout
    result = ok(run("copy-out", "orders", "--to-file", tmp_path / "b.jsonl", "--json"))
    assert result.stderr == "" and json.loads(result.stdout)["copied"] == len(orders)
    assert "verifying" in ok(run("verify")).stderr


def test_two_copies_into_one_file_at_once_are_refused(run, orders, tmp_path):
    import fcntl
    out = tmp_path / "o.jsonl"
    out.write_bytes(b"")
    with open(out, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)     # as a running copy-out holds it
        user_error(run("copy-out", "orders", "--to-file", out), "another copy-out is writing")
    ok(run("copy-out", "orders", "--to-file", out))
    assert _read_jsonl(out) == orders
