"""Queue quotas (rule `quota`) on real LMDB directories: ``max_depth`` (published and not acked)
and ``max_bytes`` (bytes of the stored log) refuse a publish, or a whole ``publish_many``, with
``QueueFull`` (reject_msg_to_sender) or discard and count it; acks make room; the limit holds
between two processes publishing at once; the byte counter follows appends, truncations and
partition drops, on a store that had none before, and on a DR-standby."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from broker_helpers import drain
from helpers import wait_until

import partq
from partq.publish.quota import queue_depth, quota_counts, stored_bytes
from partq.storage.writer import QUEUE_BYTES


def qid_of(broker: partq.Broker, queue: str) -> int:
    return broker.queue_config(queue).qid


def counts(broker: partq.Broker, queue: str) -> dict:
    with broker.store.read() as r:
        return quota_counts(r, qid_of(broker, queue))


def depth(broker: partq.Broker, queue: str) -> int:
    with broker.store.read() as r:
        return queue_depth(r, qid_of(broker, queue))


def stored(broker: partq.Broker, queue: str) -> int:
    with broker.store.read() as r:
        return stored_bytes(r, qid_of(broker, queue))


def scanned(broker: partq.Broker, queue: str) -> int:
    """The queue's stored bytes counted from its chunks, ignoring the counter."""
    qid = qid_of(broker, queue)
    with broker.store.read() as r:
        return sum(size for p in r.heads(qid) for _, size in r.chunk_sizes(qid, p, 0))


def published(broker: partq.Broker, queue: str) -> int:
    """Messages the queue ever took (the sum of its heads)."""
    qid = qid_of(broker, queue)
    with broker.store.read() as r:
        return sum(r.heads(qid).values())


# ---------------------------------------------------------------------- max_depth
def test_max_depth_refuses_the_next_publish_and_an_ack_makes_room(broker, partitioner):
    broker.create_queue("orders", partitions=3, partitioner=partitioner, max_depth=5)
    for i in range(5):
        broker.publish("orders", b"m%d" % i, key=None if i % 2 else f"k{i}")
    with pytest.raises(partq.QueueFull) as info:
        broker.publish("orders", b"one too many", key="k0")
    full = info.value
    assert (full.queue, full.limit, full.limit_value, full.now) == ("orders", "max_depth", 5, 5)
    assert str(full) == ("queue 'orders' is full: max_depth=5 reached (5 messages published and "
                         "not acked); ack messages, or raise the quota with `partq queue update "
                         "orders --max-depth N`")
    assert isinstance(full, partq.PartqError)
    assert published(broker, "orders") == 5 and depth(broker, "orders") == 5
    with pytest.raises(partq.QueueFull):
        broker.publish_async("orders", b"async too").result()
    assert counts(broker, "orders") == {"refused": 2, "discarded": 0}

    flow = broker.bind("orders")
    (first,) = flow.receive(1)
    with pytest.raises(partq.QueueFull):          # delivered is not acked: still full
        broker.publish("orders", b"not yet")
    flow.ack(first)
    assert depth(broker, "orders") == 4
    r = broker.publish("orders", b"room again")
    assert not r.discarded
    with pytest.raises(partq.QueueFull):
        broker.publish("orders", b"full again")
    assert broker.queue_status("orders").depth == 5
    assert counts(broker, "orders") == {"refused": 4, "discarded": 0}


def test_a_publish_many_over_the_quota_stores_nothing(broker):
    broker.create_queue("q", partitions=4, max_depth=10)
    broker.publish_many("q", [(b"a%d" % i, f"k{i}") for i in range(8)])
    for batch in ([(b"b%d" % i, f"k{i}") for i in range(3)], [b"x"] * 50):
        with pytest.raises(partq.QueueFull) as info:
            broker.publish_many("q", batch)
        assert (info.value.limit, info.value.now) == ("max_depth", 8)
    with pytest.raises(partq.QueueFull):
        broker.publish_many_async("q", [b"c"] * 3).result()
    assert published(broker, "q") == 8 and depth(broker, "q") == 8
    assert counts(broker, "q")["refused"] == 3 + 50 + 3        # messages, as discards count
    results = broker.publish_many("q", [(b"d%d" % i, f"k{i}") for i in range(2)])
    assert len(results) == 2 and not any(r.discarded for r in results)
    assert depth(broker, "q") == 10
    # a checkpointed batch: refused, and its position not stored (a retry publishes it)
    with pytest.raises(partq.QueueFull):
        broker.publish_many("q", [b"e"], checkpoint=("copy", 1))
    assert broker.checkpoint("q", "copy") is None
    flow = broker.bind("q")
    assert len(drain(flow, at_least=10)) == 10
    assert len(broker.publish_many("q", [b"e"], checkpoint=("copy", 1))) == 1
    assert broker.checkpoint("q", "copy") == 1


def test_single_publishes_sharing_a_commit_are_refused_one_by_one(broker):
    """Concurrent single publishes are merged into one placement; at the quota, each is placed or
    refused on its own, in order: exactly the room is used."""
    broker.create_queue("q", partitions=2, max_depth=30)
    broker.publish_many("q", [b"x"] * 20)
    pending = [broker.publish_async("q", b"%d" % i, key=f"k{i}") for i in range(25)]
    placed, refused = [], 0
    for p in pending:
        try:
            placed.append(p.result())
        except partq.QueueFull as exc:
            assert (exc.now, exc.limit_value) == (30, 30)
            refused += 1
    assert (len(placed), refused) == (10, 15)
    assert depth(broker, "q") == 30 and counts(broker, "q")["refused"] == 15
    # publish_each: one entry per item, a QueueFull for each refused one
    flow = broker.bind("q")
    flow.ack_many(flow.receive(3))
    each = broker.publish_each_async("q", [(b"e%d" % i, None, None) for i in range(5)]).result()
    assert [type(e) for e in each[:3]] == [partq.PublishResult] * 3
    assert all(type(e) is partq.QueueFull for e in each[3:])
    assert depth(broker, "q") == 30 and counts(broker, "q")["refused"] == 17


def test_update_queue_sets_and_lifts_the_quota_of_a_live_queue(open_broker):
    broker = open_broker()
    broker.create_queue("q", partitions=2)
    broker.publish_many("q", [b"x"] * 6)
    broker.update_queue("q", max_depth=6)
    with pytest.raises(partq.QueueFull):
        broker.publish("q", b"over")
    broker.update_queue("q", max_depth=8)
    broker.publish("q", b"fits")
    # another broker of the directory changes it: this one's next publish obeys
    other = open_broker()
    other.update_queue("q", max_depth=7)
    with pytest.raises(partq.QueueFull) as info:
        broker.publish("q", b"over again")
    assert (info.value.limit_value, info.value.now) == (7, 7)
    other.update_queue("q", max_depth=0)
    broker.publish_many("q", [b"y"] * 100)
    assert depth(broker, "q") == 107


def test_an_exclusive_queue_counts_its_parent_log(broker):
    broker.create_queue("ex", partitions=2, access_type="exclusive", max_depth=3)
    broker.publish_many("ex", [b"a", b"b", b"c"])
    with pytest.raises(partq.QueueFull) as info:
        broker.publish("ex", b"d")
    assert info.value.now == 3
    assert broker.queue_status("ex").depth == 3
    # partitioned again: what is left in the parent log is still published and not acked
    broker.update_queue("ex", access_type="non-exclusive")
    with pytest.raises(partq.QueueFull):
        broker.publish("ex", b"e")
    with broker.store.read() as r:
        qid = qid_of(broker, "ex")
        assert partq.PARENT in r.partitions(qid) and queue_depth(r, qid) == 3
    assert broker.ack_parent("ex", [0, 1]) == 2
    broker.publish_many("ex", [b"f", b"g"])
    with pytest.raises(partq.QueueFull):
        broker.publish("ex", b"h")


# ---------------------------------------------------------------------- max_bytes
def test_max_bytes_refuses_past_the_stored_bytes_and_truncation_frees_them(broker):
    payload = b"p" * 200
    broker.create_queue("q", partitions=1)
    broker.publish("q", payload)
    one = scanned(broker, "q")                       # bytes of one single-publish chunk
    assert one > 200
    broker.update_queue("q", max_bytes=4 * one + one // 2)
    assert stored(broker, "q") == one                # no counter yet: scanned
    broker.publish("q", payload)
    with broker.store.read() as r:
        assert r.queue_meta(qid_of(broker, "q"), QUEUE_BYTES) is not None   # created on need
    broker.publish("q", payload)
    broker.publish("q", payload)
    assert stored(broker, "q") == scanned(broker, "q") == 4 * one
    with pytest.raises(partq.QueueFull) as info:
        broker.publish("q", payload)
    full = info.value
    assert (full.limit, full.limit_value, full.now) == ("max_bytes", 4 * one + one // 2, 4 * one)
    assert "--max-bytes N" in str(full)
    assert published(broker, "q") == 4
    # a smaller message still fits
    broker.publish("q", b"s")
    assert stored(broker, "q") == scanned(broker, "q") > 4 * one
    with pytest.raises(partq.QueueFull):
        broker.publish("q", payload)
    flow = broker.bind("q")
    (first,) = flow.receive(1)
    flow.ack(first)                                  # its chunk is truncated: its bytes go
    assert stored(broker, "q") == scanned(broker, "q")
    broker.publish("q", payload)
    assert counts(broker, "q") == {"refused": 2, "discarded": 0}
    drain(flow)
    assert stored(broker, "q") == scanned(broker, "q") == 0


def test_a_publish_many_shares_chunks_which_go_once_all_their_messages_are_acked(broker):
    broker.create_queue("q", partitions=1, max_bytes=1 << 20)
    broker.publish_many("q", [b"a" * 100] * 10)      # one chunk
    full = stored(broker, "q")
    assert full == scanned(broker, "q")
    flow = broker.bind("q")
    msgs = flow.receive(10)
    flow.ack_many(msgs[:9])
    assert stored(broker, "q") == full               # the chunk still holds the tenth
    flow.ack(msgs[9])
    assert stored(broker, "q") == 0


def test_the_byte_counter_follows_drops_and_a_store_that_had_none(open_broker):
    broker = open_broker()
    broker.create_queue("q", partitions=3)
    broker.publish_many("q", [(b"x" * 64, f"k{i}") for i in range(90)])
    qid = qid_of(broker, "q")
    with broker.store.read() as r:
        assert r.queue_meta(qid, QUEUE_BYTES) is None    # as a store written before quotas
    before = scanned(broker, "q")
    broker.update_queue("q", max_bytes=before + 10_000)
    broker.publish("q", b"y" * 64, key="k1")
    assert stored(broker, "q") == scanned(broker, "q") > before
    broker.update_queue("q", access_type="exclusive")   # partitions dropped with their messages
    assert stored(broker, "q") == scanned(broker, "q") == 0
    broker.publish_many("q", [b"z" * 64] * 20)
    broker.close()
    broker = open_broker()                              # the counter is on disk
    assert stored(broker, "q") == scanned(broker, "q") > 0
    broker.update_queue("q", max_bytes=stored(broker, "q"))
    with pytest.raises(partq.QueueFull):
        broker.publish("q", b"z")
    # a queue created again under the name starts from nothing
    broker.delete_queue("q")
    broker.create_queue("q", partitions=1, max_bytes=100)
    assert stored(broker, "q") == 0
    with pytest.raises(partq.QueueFull):
        broker.publish("q", b"w" * 200)


# ---------------------------------------------------------------------- discarding
def test_a_queue_that_discards_returns_discarded_results_and_counts_them(open_broker):
    broker = open_broker()
    broker.create_queue("q", partitions=2, max_depth=3, reject_msg_to_sender=False)
    for i in range(3):
        assert not broker.publish("q", b"%d" % i).discarded
    r = broker.publish("q", b"over")
    assert r.discarded and (r.partition, r.seq) == (-1, -1)
    results = broker.publish_many("q", [b"a", b"b"])
    assert [x.discarded for x in results] == [True, True]
    assert broker.publish_many_async("q", [b"c"]).result()[0].discarded
    # independent publishes sharing a commit: each on its own
    pending = [broker.publish_async("q", b"m") for _ in range(4)]
    assert all(p.result().discarded for p in pending)
    assert depth(broker, "q") == 3 and published(broker, "q") == 3
    assert counts(broker, "q") == {"refused": 0, "discarded": 8}
    # a checkpointed batch is refused, not discarded: it would be lost behind its position
    with pytest.raises(partq.QueueFull):
        broker.publish_many("q", [b"d"], checkpoint=("copy", 5))
    assert broker.checkpoint("q", "copy") is None
    broker.close()
    broker = open_broker()
    assert counts(broker, "q") == {"refused": 1, "discarded": 8}
    flow = broker.bind("q")
    flow.ack_many(flow.receive(1))
    assert not broker.publish("q", b"room").discarded
    assert counts(broker, "q") == {"refused": 1, "discarded": 8}


# ---------------------------------------------------------------------- over partq serve
@pytest.mark.timeout(60)
def test_a_client_of_partq_serve_gets_queue_full_with_its_fields(broker):
    from partq.remote.server import Server
    token = "a-test-token-of-32-bytes-or-so!!"
    broker.create_queue("q", partitions=2, max_depth=2)
    server = Server(broker, "127.0.0.1:0", token=token.encode())
    try:
        with partq.connect(server.address, token=token) as client:
            client.publish("q", b"a")
            with pytest.raises(partq.QueueFull) as info:
                client.publish_many("q", [b"b", b"c"])
            assert (info.value.queue, info.value.limit, info.value.limit_value,
                    info.value.now) == ("q", "max_depth", 2, 1)
            client.publish("q", b"b")
            with pytest.raises(partq.QueueFull) as info:
                client.publish("q", b"c")
            assert info.value.now == 2 and "partq queue update q --max-depth N" in str(info.value)
    finally:
        server.close()
    assert depth(broker, "q") == 2 and counts(broker, "q")["refused"] == 3


# ---------------------------------------------------------------------- two processes
CHILD = """
    import json, os, sys, time
    import partq
    path, name, go, tries = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ok = full = 0
    with partq.Broker.open(path) as b:
        b.publish_many("other", [b"warm"])          # the writer thread and the map are up
        open(os.path.join(path, "..", name + ".ready"), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(go):               # both start together
            if time.monotonic() > deadline:
                sys.exit("no go signal")
            time.sleep(0.005)
        for i in range(tries):
            try:
                b.publish("q", b"%s-%d" % (name.encode(), i), key=f"k{i % 7}")
                ok += 1
            except partq.QueueFull as exc:
                assert exc.limit == "max_depth" and exc.now == 500, exc
                full += 1
    print(json.dumps({"ok": ok, "full": full}))
"""


@pytest.mark.timeout(180)
def test_two_processes_publishing_at_once_never_pass_max_depth(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=4, max_depth=500)
        b.create_queue("other")
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(CHILD), str(data), name,
                               str(go), "400"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for name in ("a", "b")]
    try:
        wait_until(lambda: all((tmp_path / f"{n}.ready").exists() for n in "ab")
                   or any(p.poll() is not None for p in procs), timeout=60,
                   what="both publishers to be ready")
        go.touch()
        seen = []
        with partq.Broker.open(data) as watcher:
            deadline = time.monotonic() + 150
            for _ in range(15_000):             # sample the depth until both have finished
                if all(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                    break
                seen.append(depth(watcher, "q"))
                assert seen[-1] <= 500, f"the depth passed the quota: {seen[-1]}"
                time.sleep(0.01)                # a sampling interval, not a synchronisation
            outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
            assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
            results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
            assert sum(r["ok"] for r in results) == 500
            assert sum(r["full"] for r in results) == 300
            assert all(r["ok"] + r["full"] == 400 for r in results)
            assert depth(watcher, "q") == 500 and published(watcher, "q") == 500
            assert watcher.queue_status("q").depth == 500
            assert counts(watcher, "q") == {"refused": 300, "discarded": 0}
            assert max(seen, default=0) <= 500
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# ---------------------------------------------------------------------- DR-standby
@pytest.mark.timeout(60)
def test_a_standby_keeps_the_same_byte_counter(tmp_path):
    p = partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0")
    s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address)
    try:
        p.create_queue("q", partitions=3)
        p.publish_many("q", [(b"a" * 50, f"k{i}") for i in range(60)])   # before the counter
        p.update_queue("q", max_bytes=1 << 30, max_depth=1000)
        for i in range(20):
            p.publish("q", b"b" * 80, key=f"k{i}")
        flow = p.bind("q")
        flow.ack_many(flow.receive(40))
        p.update_queue("q", max_depth=30, reject_msg_to_sender=False)
        assert p.publish("q", b"over").discarded
        p.update_queue("q", access_type="exclusive")
        p.publish_many("q", [b"c" * 70] * 5)
        head = p.replication_status().head_lsn
        wait_until(lambda: s.replication_status().applied_lsn >= head, 30,
                   "the standby to catch up")
        qid = qid_of(p, "q")
        with p.store.read() as rp, s.store.read() as rs:
            assert rp.queue_meta(qid, QUEUE_BYTES) == rs.queue_meta(qid, QUEUE_BYTES) is not None
            assert stored_bytes(rs, qid) == stored_bytes(rp, qid) == scanned(p, "q") > 0
            assert quota_counts(rs, qid) == quota_counts(rp, qid) == {"refused": 0,
                                                                        "discarded": 1}
    finally:
        s.close()
        p.close()
