"""``partq inspect``: browsing without consuming, filters, safe payloads, corrupt records, and
a store another process is publishing into."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time

import pytest
from helpers import wait_until
from tools_helpers import invoke, json_lines, ok, run_script


@pytest.fixture
def orders(run, broker):
    ok(run("queue", "create", "orders", "-p", "3", "--rebalance-delay", "0"))
    results = broker.publish_many("orders", [(f"hello {i}".encode(), f"k{i % 5}") for i in range(30)])
    return {(r.partition, r.seq): (f"hello {i}".encode(), f"k{i % 5}") for i, r in enumerate(results)}


def test_inspect_json_lists_every_message_without_consuming(run, broker, orders):
    before = broker.queue_status("orders")
    rows = json_lines(ok(run("inspect", "orders", "--limit", "0", "--json")).stdout)
    assert {(r["partition"], r["seq"]): (r["payload"].encode(), r["key"]) for r in rows} == orders
    assert all(r["payload_encoding"] == "text" and r["acked"] is False for r in rows)
    assert all(r["size"] == len(r["payload"]) and r["publish_time"].endswith("Z") for r in rows)
    assert [(r["partition"], r["seq"]) for r in rows] == sorted(orders)   # partition order
    after = broker.queue_status("orders")
    assert after == before          # nothing consumed, nothing bound
    assert after.delivery_owner is None


def test_inspect_filters(run, orders):
    key_rows = json_lines(ok(run("inspect", "orders", "--key", "k3", "--json")).stdout)
    assert len(key_rows) == 6 and {r["key"] for r in key_rows} == {"k3"}
    p = key_rows[0]["partition"]
    part = json_lines(ok(run("inspect", "orders", "-p", p, "--json", "--from-seq", "2",
                             "--to-seq", "4")).stdout)
    assert [(r["partition"], r["seq"]) for r in part] == [(p, 2), (p, 3), (p, 4)]
    limited = json_lines(ok(run("inspect", "orders", "-n", "4", "--json")).stdout)
    assert len(limited) == 4
    assert json_lines(ok(run("inspect", "orders", "--from-seq", "1000", "--json")).stdout) == []
    assert "no messages" in ok(run("inspect", "orders", "--from-seq", "1000")).stdout


def test_inspect_marks_acked_messages(run, broker, orders):
    flow = broker.bind("orders")
    msgs = flow.receive(max_messages=100, timeout=1.0)
    by_p = {}
    for m in msgs:
        by_p.setdefault(m.partition, []).append(m)
    p, ms = next((p, ms) for p, ms in by_p.items() if len(ms) >= 3)
    flow.ack(ms[1])                       # acked above the floor: still stored, shown acked
    flow.ack(ms[0])                       # now the floor passes both: truncated, not shown
    flow.ack(ms[2])
    rows = json_lines(ok(run("inspect", "orders", "-p", p, "--json")).stdout)
    assert [r["seq"] for r in rows] == [m.seq for m in ms[3:]]
    q = next(q for q, qs in by_p.items() if len(qs) >= 3 and q != p)
    flow.ack(by_p[q][1])
    rows = {r["seq"]: r for r in json_lines(ok(run("inspect", "orders", "-p", q, "--json")).stdout)}
    assert rows[by_p[q][1].seq]["acked"] is True and rows[by_p[q][0].seq]["acked"] is False
    flow.unbind()


def test_inspect_human_output_is_aligned_and_safe(run, broker):
    ok(run("queue", "create", "raw"))
    broker.publish_many("raw", [(b"plain text", "k"), (b"\x00\x01\xfe\xff", None),
                                (b"red \x1b[31m alert\nnext line", "evil\x1b]0;title\x07"),
                                (b"x" * 500, "long"), (b"h", "h", {"trace": b"\x01\x02", "n": 1})])
    text = ok(run("inspect", "raw", "--width", "40")).stdout
    assert "\x1b" not in text and "\x07" not in text
    lines = text.splitlines()
    assert lines[0].split() == ["PARTITION", "SEQ", "KEY", "PUBLISHED", "SIZE", "ACKED", "PAYLOAD"]
    assert "plain text" in lines[1]
    assert "hex:0001feff" in lines[2]
    assert "hex:726564201b5b" in lines[3] and "evil\\x1b]0;title\\x07" in lines[3]  # ESC: not text
    assert lines[4].endswith("…") and len(lines[4].split()[-1]) == 40
    assert "headers=" in lines[5]
    payload_col = lines[0].index("PAYLOAD")
    assert all(len(line) > payload_col for line in lines[1:6])
    assert lines[-1] == "5 messages"
    as_text = ok(run("inspect", "raw", "--payload", "text", "--width", "0")).stdout
    assert "\x1b" not in as_text and "\x07" not in as_text
    assert "red \\x1b[31m alert\\nnext line" in as_text.splitlines()[3]
    assert "x" * 500 in as_text


@pytest.mark.parametrize("mode,expect", [
    ("hex", "00010203"), ("base64", base64.b64encode(b"\x00\x01\x02\x03").decode()),
    ("text", "\x00\x01\x02\x03"), ("auto", base64.b64encode(b"\x00\x01\x02\x03").decode())])
def test_inspect_payload_modes_json(run, broker, mode, expect):
    ok(run("queue", "create", "raw"))
    broker.publish("raw", b"\x00\x01\x02\x03")
    (row,) = json_lines(ok(run("inspect", "raw", "--payload", mode, "--json")).stdout)
    assert row["payload"] == expect
    assert row["payload_encoding"] == ("base64" if mode == "auto" else mode)


def test_inspect_headers_with_bytes_are_json(run, broker):
    ok(run("queue", "create", "h"))
    broker.publish("h", b"p", key="k", headers={"bin": b"\xff", "n": [1, 2]})
    (row,) = json_lines(ok(run("inspect", "h", "--json")).stdout)
    assert row["headers"] == {"bin": {"$base64": "/w=="}, "n": [1, 2]}


PUBLISHER = r"""
import os, sys, time, partq
path, progress, stop = sys.argv[1:4]
with partq.Broker.open(path) as b:
    n = 0
    while not os.path.exists(stop):
        # 16 KiB payloads for the first 6000 (the LMDB map grows past 64 MiB while inspect
        # reads), then small ones so that the disk use stays modest until the test stops us
        size = 16384 if n < 6000 else 100
        b.publish_many("busy", [(b"p" * size, "k%d" % (n + i)) for i in range(100)])
        n += 100
        with open(progress + ".tmp", "w") as f:
            f.write(str(n))
        os.replace(progress + ".tmp", progress)
        time.sleep(0.005)
"""


def _published(progress) -> int:
    try:
        return int(progress.read_text())
    except (FileNotFoundError, ValueError):
        return 0


def _wait_published(progress, at_least: int, pub) -> int:
    def published_while_running() -> int:
        if (n := _published(progress)) >= at_least:
            return n
        assert pub.poll() is None, pub.communicate()[1]
        return 0
    return wait_until(published_while_running, 60, f"the publisher to publish {at_least}",
                      interval=0.01)


def test_inspect_while_another_process_publishes(partq_script, run, data, tmp_path):
    ok(run("queue", "create", "busy"))
    stop, progress = tmp_path / "stop", tmp_path / "progress"
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, data, str(progress), str(stop)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        start, seen, rounds = 0, [], 0
        while rounds < 5 or _published(progress) <= 6000:
            _wait_published(progress, start + 100, pub)
            proc = run_script(partq_script, data, "inspect", "busy", "--from-seq", start,
                              "--limit", "50", "--json")
            assert proc.returncode == 0, proc.stderr
            rows = json_lines(proc.stdout)
            seqs = [r["seq"] for r in rows]
            assert seqs == list(range(start, start + 50))        # contiguous, from where we asked
            assert all(r["payload"].startswith("ppp") and r["key"] == f"k{r['seq']}" for r in rows)
            seen.append(seqs[-1])
            # the in-process runner too, on the same busy directory
            again = json_lines(ok(run("inspect", "busy", "--from-seq", seqs[-1], "-n", "1",
                                      "--json")).stdout)
            assert again[0]["seq"] == seqs[-1]
            start = _published(progress)       # next round: only what is published after now
            rounds += 1
        assert seen == sorted(seen) and len(set(seen)) == len(seen) >= 5
        stats = json.loads(ok(run("stats", "--json")).stdout)
        assert stats["store"]["map_size"] > 64 << 20      # the map grew while we read
    finally:
        stop.write_text("stop")
        _, err = pub.communicate(timeout=60)
    assert pub.returncode == 0, err


def test_store_open_while_another_process_grows_the_map(data, tmp_path):
    """Opening the store (what every command does first) works, again and again, while another
    process grows the LMDB map: each open reads the queue, and the later ones see a larger map."""
    from partq.storage import Store
    ok(invoke("--data", data, "queue", "create", "busy"))
    stop, progress = tmp_path / "stop", tmp_path / "progress"
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, data, str(progress), str(stop)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    map_sizes = []
    try:
        _wait_published(progress, 200, pub)
        deadline = time.monotonic() + 120
        while _published(progress) < 5000:         # while the map grows
            assert pub.poll() is None and time.monotonic() < deadline, "the publisher stalled"
            store = Store.open(data, create=False)
            try:
                with store.read() as r:
                    assert r.queue("busy") is not None
                map_sizes.append(store.usage()["map_size"])
            finally:
                store.close()
    finally:
        stop.write_text("stop")
        _, err = pub.communicate(timeout=60)
    assert pub.returncode == 0, err
    # 5000 messages of 16 KiB need more than the initial 64 MiB map: it grew between opens
    assert len(map_sizes) >= 2 and map_sizes[0] == 64 << 20
    assert max(map_sizes) > map_sizes[0]
