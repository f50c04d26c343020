"""The parent queue's log in the ``partq`` tool (rule `ingress-egress`): exclusive (non-partitioned)
queues, changes of access type, the messages such a change strands in the parent queue, and
copying them back into the partitions with ``copy-out --parent``.

The parent queue's log is storage partition ``partq.PARENT`` (4294967295): people see it as
partition "parent", ``--json`` and copy-out files keep the integer.
"""
from __future__ import annotations

import base64
import collections
import json

import msgpack
import pytest
from tools_helpers import json_lines, ok, option_error, run_script, script_user_error, usage_error, user_error

import partq
from partq import PARENT, scaling
from partq.storage.encoding import partition_key
from partq.tools import common

NEEDLE = b"UNIQUE-PARENT-PAYLOAD-3b7d91c4-needle"


def _publish(broker, queue: str, n: int, start: int = 0) -> dict:
    """n messages with unique payloads, every fourth unkeyed; returns {payload: key}."""
    items = [(b"msg-%04d" % i, None if i % 4 == 0 else f"key-{i % 11}")
             for i in range(start, start + n)]
    broker.publish_many(queue, items)
    return dict(items)


def _rows(run, queue: str, *args) -> list[dict]:
    return json_lines(ok(run("inspect", queue, "--limit", "0", "--payload", "base64", "--json",
                             *args)).stdout)


def _payloads(rows) -> collections.Counter:
    return collections.Counter(base64.b64decode(r["payload"]) for r in rows)


def _drain(flow) -> list:
    got = []
    while msgs := flow.receive(max_messages=1000, timeout=0.3):
        got += msgs
        flow.ack_many(msgs)
    return got


def _strand(run, broker, queue: str = "q", n: int = 30, acked: int = 0) -> dict:
    """An exclusive queue with n messages (the first ``acked`` consumed), then made
    non-exclusive with --yes: returns {payload: key} of those left in its parent queue."""
    ok(run("queue", "create", queue, "-p", "3", "--access-type", "exclusive",
           "--rebalance-delay", "0"))
    published = _publish(broker, queue, n)
    if acked:
        flow = broker.bind(queue)
        msgs = flow.receive(max_messages=acked, timeout=1.0)
        assert len(msgs) == acked and {m.partition for m in msgs} == {PARENT}
        flow.ack_many(msgs)
        flow.unbind()
        for m in msgs:
            del published[m.payload]
    ok(run("queue", "update", queue, "--access-type", "non-exclusive", "--yes"))
    return published


# ---------------------------------------------------------------------- exclusive queues
def test_exclusive_queue_shows_partition_parent(run, broker):
    assert "exclusive" in ok(run("queue", "create", "q", "-p", "2", "--access-type",
                                 "exclusive")).stdout
    config = broker.queue_config("q")
    assert config.access_type == "exclusive" and config.operating_partitions == 0
    published = _publish(broker, "q", 6)
    rows = _rows(run, "q")
    assert [(r["partition"], r["seq"]) for r in rows] == [(PARENT, s) for s in range(6)]
    assert _payloads(rows) == collections.Counter(list(published))
    lines = ok(run("inspect", "q")).stdout.splitlines()
    assert lines[0].split()[0] == "PARTITION"
    assert [line.split()[:2] for line in lines[1:7]] == [["parent", str(s)] for s in range(6)]
    assert "4294967295" not in "\n".join(lines)
    assert _rows(run, "q", "--parent") == rows
    assert _rows(run, "q", "--partition", PARENT) == rows   # the integer --json prints

    flow = broker.bind("q", name="solo")          # this process runs the queue's delivery
    doc = json.loads(ok(run("queue", "show", "q", "--json")).stdout)["status"]
    assert doc["access_type"] == "exclusive" and doc["partition_count"] == 0
    assert doc["depth"] == 6 and doc["parent_depth"] == 6
    assert [p["partition"] for p in doc["partitions"]] == [PARENT]
    assert doc["flows"][0]["partitions"] == [PARENT]
    text = ok(run("queue", "show", "q")).stdout
    assert "access exclusive  partitions 0" in text and "4294967295" not in text
    part_row = next(line.split() for line in text.splitlines() if line.split()[:1] == ["parent"])
    assert part_row[1:3] == ["Ready", "solo"]
    flow_row = next(line.split() for line in text.splitlines() if "solo" in line.split()[:2])
    assert flow_row[-1] == "parent"               # the flows' PARTITIONS column
    flow.unbind()

    for command in (["queue", "list"], ["stats"]):
        doc = json.loads(ok(run(*command, "--json")).stdout)
        row = doc["queues"][0]
        assert (row["access_type"], row["partitions"], row["depth"], row["parent_depth"]) == \
            ("exclusive", 0, 6, 6)
        lines = ok(run(*command)).stdout.splitlines()
        header = next(line for line in lines if "ACCESS" in line).split()
        row = next(line for line in lines if line.startswith("q ")).split()
        assert row[header.index("ACCESS")] == "exclusive" and row[header.index("PARTITIONS")] == "0"


def test_list_and_stats_when_a_status_cannot_be_read(run, broker):
    """A queue whose status fails (here its parent log's ack state is damaged on disk) is listed
    from its config, with the error; the others are listed as usual."""
    ok(run("queue", "create", "excl", "-p", "4", "--access-type", "exclusive"))
    ok(run("queue", "create", "plain", "-p", "2"))
    qid = broker.queue_config("excl").qid
    store = broker._store
    with store.env.begin(write=True, db=store.dbs["acks"]) as txn:
        txn.put(partition_key(qid, PARENT), b"\xc1 not an ack state")
    with pytest.raises(partq.CorruptStore):
        broker.queue_status("excl")
    rows = json.loads(ok(run("queue", "list", "--json")).stdout)["queues"]
    stats = json.loads(ok(run("stats", "--json")).stdout)["queues"]
    for listed in (rows, stats):
        excl, plain = listed
        assert (excl["access_type"], excl["partitions"], excl["depth"], excl["parent_depth"]) == \
            ("exclusive", 0, None, None)
        assert f"queue id {qid} partition 4294967295" in excl["error"]
        assert plain["error"] is None
        assert (plain["partitions"], plain["parent_depth"]) == (2, 0)
    result = ok(run("queue", "list"))
    assert "Warning: " in result.stderr and "partition 4294967295" in result.stderr


def test_help_documents_the_parent_partition_number(run):
    for command in ("inspect", "copy-out", "verify"):
        text = " ".join(ok(run(command, "--help")).stdout.split())
        assert "partition 4294967295 (partq.PARENT) in --json" in text, command
    assert "--parent" in ok(run("inspect", "--help")).stdout
    assert "--yes" in ok(run("queue", "update", "--help")).stdout


# ---------------------------------------------------------------------- to non-exclusive
def test_stranded_parent_messages_are_copied_back_into_the_partitions(run, broker):
    left = _strand(run, broker, acked=5)
    assert len(left) == 25
    st = broker.queue_status("q")
    assert (st.access_type, st.partition_count, st.depth, st.parent_depth) == \
        ("non-exclusive", 3, 0, 25)
    text = ok(run("queue", "show", "q")).stdout
    assert ("parent queue: 25 messages left by a change of access type; not delivered; move them "
            "into the partitions with `partq copy-out q --parent --to-queue q --move`") in text
    assert "Warning: parent queue: 25 messages" in ok(run("queue", "list")).stderr
    parent_rows = _rows(run, "q", "--parent")
    assert {r["partition"] for r in parent_rows} == {PARENT}
    assert _payloads(parent_rows) == collections.Counter(list(left))
    assert _rows(run, "q", "--partition", "0") == []

    doc = json.loads(ok(run("copy-out", "q", "--parent", "--to-queue", "q", "--batch", "4",
                            "--json")).stdout)
    assert doc["copied"] == 25 and [p["partition"] for p in doc["partitions"]] == [PARENT]
    rows = _rows(run, "q")
    partitioned = [r for r in rows if r["partition"] != PARENT]
    assert _payloads(partitioned) == collections.Counter(list(left))   # each exactly once
    for r in partitioned:
        key = left[base64.b64decode(r["payload"])]
        assert r["key"] == key
        if key is not None:
            assert r["partition"] == partq.key_partition(key, 3)
    assert _payloads(r for r in rows if r["partition"] == PARENT) == collections.Counter(list(left))

    again = ok(run("copy-out", "q", "--parent", "--to-queue", "q"))
    assert "copied 0 messages" in again.stdout and "continued an earlier copy" in again.stdout
    assert "parent" in again.stdout and "4294967295" not in again.stdout
    assert _payloads(r for r in _rows(run, "q") if r["partition"] != PARENT) == \
        collections.Counter(list(left))
    assert ("already copied into its partitions; remove them from the parent queue with `partq "
            "copy-out q --parent --to-queue q --move`") in ok(run("queue", "show", "q")).stdout

    # this Broker ran the exclusive queue's delivery: have it apply the change the CLI's Broker
    # made now (its ticker would within 50 ms; a flow bound before that is closed by it)
    broker.tick()
    flow = broker.bind("q")                      # and consumers get them, once each
    got = _drain(flow)
    flow.unbind()
    assert collections.Counter(m.payload for m in got) == collections.Counter(list(left))
    assert all(m.partition in (0, 1, 2) for m in got)


def _records(path, fmt: str) -> list[dict]:
    data = path.read_bytes()
    if fmt == "jsonl":
        return [json.loads(line) for line in data.splitlines()]
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    return list(unpacker)


def _record_ends(data: bytes, fmt: str) -> list[int]:
    """The byte offset where each complete record ends."""
    if fmt == "jsonl":
        return [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    ends = []
    for _ in unpacker:
        ends.append(unpacker.tell())
    return ends


@pytest.mark.parametrize("fmt", ["jsonl", "msgpack"])
def test_copy_out_parent_to_file_continues_after_an_interruption(run, broker, tmp_path, fmt):
    left = _strand(run, broker, n=40)
    out = tmp_path / f"parent.{fmt}"
    ok(run("copy-out", "q", "--parent", "--to-file", out, "--format", fmt, "--batch", "7"))
    full = out.read_bytes()
    records = _records(out, fmt)
    assert [(r["partition"], r["seq"]) for r in records] == [(PARENT, s) for s in range(40)]
    # as if the copy died while writing record 16: 15 complete records and a torn one
    ends = _record_ends(full, fmt)
    out.write_bytes(full[:ends[15] - 3])
    doc = json.loads(ok(run("copy-out", "q", "--parent", "--to-file", out, "--format", fmt,
                            "--json")).stdout)
    assert (doc["records_already_in_file"], doc["copied"]) == (15, 25)
    assert doc["torn_bytes_cut"] > 0 and doc["partitions"][0]["resumed"] is True
    assert out.read_bytes() == full                            # no gap, no duplicate
    payload_key = "payload_b64" if fmt == "jsonl" else "payload"
    copied = [r[payload_key] for r in _records(out, fmt)]
    if fmt == "jsonl":
        copied = [base64.b64decode(p) for p in copied]
    assert collections.Counter(copied) == collections.Counter(list(left))
    doc = json.loads(ok(run("copy-out", "q", "--parent", "--to-file", out, "--format", fmt,
                            "--json")).stdout)
    assert doc["copied"] == 0 and out.read_bytes() == full

    # without --parent every log is copied: the partitions, then the parent queue's
    broker.publish_many("q", [(b"new-%d" % i, f"n{i}") for i in range(9)])
    doc = json.loads(ok(run("copy-out", "q", "--to-file", tmp_path / "all.jsonl",
                            "--json")).stdout)
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2, PARENT]
    assert doc["copied"] == 49


# ---------------------------------------------------------------------- to exclusive
def test_change_to_exclusive_asks_then_deletes_the_partitions(run, broker, monkeypatch):
    ok(run("queue", "create", "q", "-p", "3", "--rebalance-delay", "0"))
    _publish(broker, "q", 30)
    flows = [broker.bind("q", name="a"), broker.bind("q", name="b")]
    assert sorted(len(f.partitions) for f in flows) == [1, 2]

    user_error(run("queue", "update", "q", "--access-type", "exclusive"),
               "not confirmed", "pass --yes")
    monkeypatch.setattr(common, "interactive", lambda: True)
    answered_no = run("queue", "update", "q", "--access-type", "exclusive", input="n\n")
    assert answered_no.exit_code == 1
    assert answered_no.stderr.splitlines()[-1] == "Error: cancelled; nothing was changed"
    question = " ".join(answered_no.stderr.split())
    assert "Change queue 'q' to exclusive?" in question
    assert "its 2 flows" in question and "30 unacked messages in its 3 partitions are deleted" \
        in question
    assert broker.queue_config("q").access_type == "non-exclusive"
    assert len(_rows(run, "q")) == 30
    # other settings need no confirmation
    ok(run("queue", "update", "q", "--max-unacked", "500"))
    monkeypatch.setattr(common, "interactive", lambda: False)

    doc = json.loads(ok(run("queue", "update", "q", "--access-type", "exclusive", "--yes",
                            "--json")).stdout)
    assert doc["changed"] == {"access_type": ["non-exclusive", "exclusive"]}
    assert _rows(run, "q") == []
    assert "checked 0 records" in ok(run("verify", "q")).stdout
    st = json.loads(ok(run("queue", "show", "q", "--json")).stdout)["status"]
    assert (st["partition_count"], st["depth"], [p["partition"] for p in st["partitions"]]) == \
        (0, 0, [PARENT])
    for flow in flows:
        with pytest.raises(partq.FlowClosed):
            flow.receive(max_messages=10, timeout=2.0)
    # and back: nothing in the parent queue, so nothing to warn about
    broker.publish("q", b"one", key="k")
    answered = run("queue", "update", "q", "--access-type", "non-exclusive")
    user_error(answered, "pass --yes")
    ok(run("queue", "update", "q", "--access-type", "non-exclusive", "-y"))
    assert "parent queue: 1 message left" in ok(run("queue", "show", "q")).stdout


# ---------------------------------------------------------------------- bad input
def test_bad_parent_and_partition_choices(run, broker):
    ok(run("queue", "create", "plain", "-p", "3"))
    ok(run("queue", "create", "excl", "-p", "3", "--access-type", "exclusive"))
    broker.publish_many("plain", [b"x"] * 3)
    usage_error(run("inspect", "excl", "--parent", "--partition", "0"))
    usage_error(run("copy-out", "excl", "--parent", "-p", "0", "--to-file", "x.jsonl"))
    for command in (["inspect", "plain", "--parent"],
                    ["copy-out", "plain", "--parent", "--to-file", "x.jsonl"],
                    ["copy-out", "plain", "--parent", "--to-queue", "plain"]):
        user_error(run(*command), "queue 'plain' has no parent-queue log (it was never exclusive)")
    for command in (["inspect", "plain", "--partition", "7"],
                    ["copy-out", "plain", "-p", "7", "--to-queue", "excl"]):
        user_error(run(*command), "queue 'plain' has partitions 0 to 2;", "no partition 7")
    user_error(run("inspect", "excl", "-p", "0"), "queue 'excl' has no partitions, only its "
               "parent-queue log (--parent)")
    option_error(run("copy-out", "plain", "--to-queue", "plain"), "another queue")
    user_error(run("copy-out", "excl", "--parent", "--to-queue", "excl"),
               "duplicate every message")
    assert broker.queue_status("excl").discarded == 0 and broker.queue_status("excl").depth == 0


def test_scale_refuses_an_exclusive_queue_before_touching_ingress(run, broker):
    ok(run("queue", "create", "q", "-p", "2", "--access-type", "exclusive"))
    user_error(run("scale", "q", "-p", "4"), "queue 'q' is exclusive")   # before asking
    for args in ([], ["--json"]):
        result = run("scale", "q", "-p", "4", "--yes", *args)
        user_error(result, "queue 'q' is exclusive", "partq queue update q --access-type "
                   "non-exclusive")
        assert result.stdout == ""                  # no step started
    with pytest.raises(partq.InvalidConfig, match="is exclusive"):   # the procedure itself too
        scaling.run(broker, "q", 4, drain=False, drain_timeout=0, rebalance_timeout=0,
                    standby_timeout=0, reporter=scaling.Reporter())
    config = broker.queue_config("q")
    assert config.ingress_enabled and config.partitions == 2 and config.scaling_status == "Ready"
    assert not broker.publish("q", b"accepted").discarded


def test_parent_errors_in_a_real_process(partq_script, data, run):
    ok(run("queue", "create", "plain", "-p", "3"))
    script_user_error(run_script(partq_script, data, "inspect", "plain", "--parent"),
                      "has no parent-queue log")
    script_user_error(run_script(partq_script, data, "scale", "plain", "-p", "0", "--yes"),
                      status=2)
    usage = run_script(partq_script, data, "inspect", "plain", "--parent", "-p", "1")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr


# ---------------------------------------------------------------------- verify
def test_verify_reports_a_corrupt_record_in_the_parent_log(run, data):
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=2, access_type="exclusive")
        b.publish_many("q", [(b"payload %d" % i, f"k{i}") for i in range(20)])
        res = b.publish("q", NEEDLE, key="needle")
        b.update_queue("q", access_type="non-exclusive")   # the parent log stays, undelivered
    assert res.partition == PARENT
    path = f"{data}/data.mdb"
    with open(path, "r+b") as f:      # the live record, and any stale copy in a free page
        raw = f.read()
        assert raw.count(NEEDLE) >= 1, "the needle must be on disk"
        at = raw.find(NEEDLE)
        while at >= 0:
            f.seek(at + len(NEEDLE) // 2)
            f.write(bytes([raw[at + len(NEEDLE) // 2] ^ 0x01]))
            at = raw.find(NEEDLE, at + 1)
    result = run("verify")
    user_error(result, f"1 corrupt record (q partition parent seq {res.seq})")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["QUEUE", "PARTITION", "SEQ", "REASON"]
    assert lines[1].split() == ["q", "parent", str(res.seq), "crc32c", "mismatch"]
    assert "checked 21 records in 1 queue: 1 corrupt" in result.stdout
    doc = json.loads(run("verify", "q", "--json").stdout)
    assert doc["corrupt"] == [{"queue": "q", "partition": PARENT, "seq": res.seq,
                               "reason": "crc32c mismatch"}]
    bad = [r for r in json_lines(ok(run("inspect", "q", "--parent", "--json")).stdout)
           if r.get("corrupt")]
    assert [(r["partition"], r["seq"]) for r in bad] == [(PARENT, res.seq)]
    user_error(run("copy-out", "q", "--parent", "--to-queue", "q"),
               f"partition parent seq {res.seq}", "--skip-corrupt")


# ---------------------------------------------------------------------- status, fixed in partq
def test_status_from_a_third_process_after_a_scale_up_the_owner_has_not_applied(
        partq_script, data, run):
    """Once a partq bug (worked around in the tool until fixed): a process owning delivery
    has persisted assignments for 2 partitions, another Broker scales the queue to 4, and a
    process that does not run delivery asks for the status before the owner applied it."""
    from partq.core.rebalancer import Rebalancer
    owner = partq.Broker.open(data, clock=partq.ManualClock())   # never ticks on its own
    try:
        owner.create_queue("orders", partitions=2, rebalance_delay=0)
        flow = owner.bind("orders", name="svc")
        owner.tick()
        assert sorted(flow.partitions) == [0, 1]
        with partq.Broker.open(data) as scaler:
            scaler.scale("orders", 4)
        with owner._store.read() as r:                            # the bug's precondition
            config = r.queue("orders")
            state = msgpack.unpackb(r.state(config["qid"]), raw=False)
        assert config["partitions"] == 4 and Rebalancer.restored(state["core"], 0, 0, 0).n == 2

        proc = run_script(partq_script, data, "queue", "show", "orders", "--json")
        assert proc.returncode == 0, proc.stderr
        st = json.loads(proc.stdout)["status"]
        assert st["partition_count"] == 4 and st["delivery_owner"]
        assert [(p["partition"], p["flow_name"]) for p in st["partitions"]] == \
            [(0, "svc"), (1, "svc"), (2, None), (3, None)]
        text = run_script(partq_script, data, "queue", "show", "orders")
        assert text.returncode == 0 and "Unassigned" in text.stdout, text.stderr
        rows = json.loads(ok(run("queue", "list", "--json")).stdout)["queues"]
        assert rows[0]["partitions"] == 4 and rows[0]["error"] is None
    finally:
        owner.close()


# ---------------------------------------------------------------------- --move
def test_move_removes_stranded_messages_once_copied(run, broker):
    left = _strand(run, broker, acked=2)
    doc = json.loads(ok(run("copy-out", "q", "--parent", "--to-queue", "q", "--move",
                            "--batch", "4", "--json")).stdout)
    assert (doc["copied"], doc["removed_from_parent"]) == (28, 28)
    st = broker.queue_status("q")
    assert (st.parent_depth, st.depth) == (0, 28)
    assert _rows(run, "q", "--parent") == []
    assert _payloads(_rows(run, "q")) == collections.Counter(list(left))
    assert "parent queue:" not in ok(run("queue", "show", "q")).stdout


def test_move_after_a_copy_that_did_not_remove_finishes_the_removal(run, broker):
    left = _strand(run, broker, n=20)
    ok(run("copy-out", "q", "--parent", "--to-queue", "q"))       # copied, nothing removed
    assert broker.queue_status("q").parent_depth == 20
    text = ok(run("copy-out", "q", "--parent", "--to-queue", "q", "--move")).stdout
    assert "copied 0 messages" in text and "removed 20 messages from the parent queue" in text
    assert broker.queue_status("q").parent_depth == 0
    assert _payloads(_rows(run, "q")) == collections.Counter(list(left))    # no duplicates


def test_move_to_a_file_cut_short_removes_exactly_what_the_file_holds(run, broker, tmp_path):
    _strand(run, broker, n=30)
    out = tmp_path / "parent.jsonl"
    ok(run("copy-out", "q", "--parent", "--to-file", out))
    lines = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:12]))            # as if killed after 12 records, none removed
    doc = json.loads(ok(run("copy-out", "q", "--parent", "--to-file", out, "--move",
                            "--json")).stdout)
    assert (doc["records_already_in_file"], doc["copied"], doc["removed_from_parent"]) == (12, 18, 30)
    assert [r["seq"] for r in _records(out, "jsonl")] == list(range(30))
    assert broker.queue_status("q").parent_depth == 0


def test_move_refusals(run, broker):
    ok(run("queue", "create", "x", "-p", "2", "--access-type", "exclusive"))
    broker.publish("x", b"one")
    user_error(run("copy-out", "x", "--to-queue", "y", "--move"), "--move applies to the parent")
    user_error(run("copy-out", "x", "--parent", "--to-file", "f.jsonl", "--move"), "is exclusive")
    assert broker.queue_status("x").depth == 1
