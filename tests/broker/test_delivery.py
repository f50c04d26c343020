"""Delivery through the Broker on real LMDB directories: order (rule `partition-order`), the
unacked bound (rule `max-unacked`), nack, durable acks across a restart (rule `crash-recovery`),
and the process model (publish from another process; one delivery owner per queue)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from broker_helpers import DELAY, HANDOFF, drain

import partq

# ---------------------------------------------------------------------- helpers

def keys_for_partitions(n: int, count_per_partition: int = 1) -> dict[int, list[str]]:
    """Key strings landing in each partition under rule `key-hash` (crc32c % n)."""
    found: dict[int, list[str]] = {p: [] for p in range(n)}
    i = 0
    while any(len(v) < count_per_partition for v in found.values()):
        k = f"k{i}"
        p = partq.key_partition(k, n)
        if len(found[p]) < count_per_partition:
            found[p].append(k)
        i += 1
    return found


def run_py(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------- order
def test_message_fields(broker, clock, partitioner):
    broker.create_queue("q", partitions=3, partitioner=partitioner)
    res = broker.publish("q", b"hello", key="customer-42", headers={"h": 1})
    assert res.partition == partq.key_partition("customer-42", 3)
    flow = broker.bind("q")
    (m,) = flow.receive(10)
    assert (m.queue, m.partition, m.seq, m.key, m.payload, m.headers) == \
        ("q", res.partition, res.seq, "customer-42", b"hello", {"h": 1})
    assert m.publish_time_ns == int(clock.now() * 1e9)
    assert m.redelivered is False


def test_per_partition_order(broker, partitioner):
    broker.create_queue("q", partitions=4, partitioner=partitioner)
    broker_pub = []
    for i in range(200):
        r = broker.publish("q", b"%d" % i)            # unkeyed: the partitioner chooses
        broker_pub.append((r.partition, r.seq, i))
    broker.publish_many("q", [b"%d" % i for i in range(200, 300)])
    flow = broker.bind("q")
    got = drain(flow, batch=7)                         # small batches interleave partitions
    assert len(got) == 300
    assert len({(m.partition, m.seq) for m in got}) == 300
    for p in range(4):
        seqs = [m.seq for m in got if m.partition == p]
        assert seqs == sorted(seqs)
        payload_order = [int(m.payload) for m in got if m.partition == p]
        assert payload_order == sorted(payload_order)
    for part, seq, i in broker_pub:
        assert any(m.partition == part and m.seq == seq and int(m.payload) == i for m in got)


def test_per_key_order_many_keys_two_flows(broker, clock, partitioner):
    broker.create_queue("q", partitions=5, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    a = broker.bind("q")
    b = broker.bind("q")
    clock.advance(DELAY)
    broker.tick()
    keys = [f"cust-{i}" for i in range(13)]
    items = [(b"%d" % i, keys[i % 13]) for i in range(390)]
    broker.publish_many("q", items[:200])
    for payload, key in items[200:]:
        broker.publish("q", payload, key=key)
    seen: dict[str, list[int]] = {}
    for flow in (a, b):
        for m in drain(flow, batch=11):
            assert m.partition in flow.partitions
            assert m.partition == partq.key_partition(m.key, 5)
            seen.setdefault(m.key, []).append(int(m.payload))
    assert sum(len(v) for v in seen.values()) == 390
    for key, order in seen.items():
        assert order == sorted(order), key


# ---------------------------------------------------------------------- max unacked
def test_max_delivered_unacked_per_flow(broker, partitioner):
    broker.create_queue("q", partitions=3, max_delivered_unacked_per_flow=4,
                        partitioner=partitioner, redelivery_delay=0)   # a nack: back at once
    for i in range(30):
        broker.publish("q", b"%d" % i, key=f"k{i}")
    flow = broker.bind("q")
    first = flow.receive(100)
    assert len(first) == 4
    assert flow.receive(100) == []
    t0 = time.monotonic()
    assert flow.receive(100, timeout=0.2) == []        # blocks for the timeout, then nothing
    assert time.monotonic() - t0 >= 0.15
    flow.ack(first[0])
    nxt = flow.receive(100)
    assert len(nxt) == 1
    flow.ack_many(first[1:3])
    assert len(flow.receive(100)) == 2
    assert flow.receive(100) == []
    # Nack gives room back: the nacked message (and later ones of its partition) come back.
    held = first[3:] + nxt
    assert flow.unacked == 4
    flow.nack(held[0])
    again = flow.receive(100)
    assert again and all(m.redelivered for m in again)
    assert flow.unacked <= 4
    assert (again[0].partition, again[0].seq) == (held[0].partition, held[0].seq)


def test_a_flow_holding_all_it_may_still_runs_its_queues_timers(broker, clock):
    """Without a ticker (a ManualClock) the timers of a queue run in its receives: a receive
    of a flow that holds all the unacked messages it may hands out nothing and reads nothing
    to do so, but still runs them (here the rebalance a second flow waits for)."""
    broker.create_queue("q", partitions=2, max_delivered_unacked_per_flow=1,
                        rebalance_delay=DELAY, max_handoff_time=HANDOFF)
    for i in range(8):
        broker.publish("q", b"%d" % i, key=f"k{i}")
    first = broker.bind("q")
    assert len(first.receive(10)) == 1 and first.receive(10) == []     # holds all it may
    second = broker.bind("q")
    assert first.partitions == frozenset({0, 1})           # the holddown has not passed
    for _ in range(3):                  # the holddown, then the handoff's time for acks
        clock.advance(DELAY + HANDOFF)
        first.receive(10)               # (a moved partition gives it room again)
    assert len(first.partitions) == 1 and len(second.partitions) == 1


def test_unacked_bound_is_never_exceeded(broker, partitioner):
    broker.create_queue("q", partitions=4, max_delivered_unacked_per_flow=5,
                        partitioner=partitioner)
    broker.publish_many("q", [(b"%d" % i, f"k{i % 9}") for i in range(100)])
    flow = broker.bind("q")
    holding = []
    delivered = set()
    for step in range(200):
        got = flow.receive(3)
        holding += got
        assert len(holding) <= 5
        assert flow.unacked == len(holding)
        delivered |= {(m.partition, m.seq) for m in got}
        if holding and (step % 2 == 0 or not got):
            flow.ack_many(holding[:2])
            holding = holding[2:]
        if len(delivered) == 100 and not holding:
            break
    assert len(delivered) == 100


# ---------------------------------------------------------------------- nack
def test_nack_redelivers_in_order_marked(broker, partitioner):
    broker.create_queue("q", partitions=2, partitioner=partitioner, redelivery_delay=0)
    key = keys_for_partitions(2)[1][0]
    for i in range(6):
        broker.publish("q", b"%d" % i, key=key)
    flow = broker.bind("q")
    got = flow.receive(100)
    assert [m.payload for m in got] == [b"%d" % i for i in range(6)]
    assert not any(m.redelivered for m in got)
    flow.ack(got[0])
    flow.nack(got[2])                                  # 2 and every later one come back
    again = flow.receive(100)
    assert [m.payload for m in again] == [b"2", b"3", b"4", b"5"]
    assert all(m.redelivered for m in again)
    # A new message after the redeliveries is not marked.
    broker.publish("q", b"6", key=key)
    (new,) = flow.receive(100)
    assert new.payload == b"6" and not new.redelivered
    flow.ack_many([got[1]] + again + [new])
    assert broker.queue_status("q").depth == 0
    assert flow.receive(100) == []


def test_nack_other_partition_unaffected(broker, partitioner):
    broker.create_queue("q", partitions=2, partitioner=partitioner, redelivery_delay=0)
    keys = keys_for_partitions(2)
    for i in range(3):
        broker.publish("q", b"a%d" % i, key=keys[0][0])
        broker.publish("q", b"b%d" % i, key=keys[1][0])
    flow = broker.bind("q")
    got = flow.receive(100)
    p0 = [m for m in got if m.partition == 0]
    flow.nack(p0[0])
    again = flow.receive(100)
    assert [m.payload for m in again] == [b"a0", b"a1", b"a2"]
    assert all(m.redelivered for m in again)


# ---------------------------------------------------------------------- durability (rule `crash-recovery`)
def test_acks_are_durable_across_restart(open_broker, clock, partitioner):
    b = open_broker()
    b.create_queue("q", partitions=3, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                   partitioner=partitioner)
    b.publish_many("q", [(b"%d" % i, f"k{i % 5}") for i in range(60)])
    flow = b.bind("q")
    got = flow.receive(100)
    assert len(got) == 60
    acked = got[::3]
    flow.ack_many(acked)
    flow.ack(got[1])
    acked.append(got[1])
    unacked = [m for m in got if m not in acked]
    # A few never-delivered messages.
    b.publish_many("q", [(b"late%d" % i, f"k{i % 5}") for i in range(9)])
    b.close()

    b = open_broker()
    assert b.queue_status("q").depth == len(unacked) + 9
    flow = b.bind("q")                 # unnamed: a new consumer, partitions after the delay
    clock.advance(DELAY)
    b.tick()
    assert flow.partitions == frozenset(range(3))
    again = drain(flow, ack=False)
    ids = [(m.partition, m.seq) for m in again]
    assert len(ids) == len(set(ids))
    assert not set(ids) & {(m.partition, m.seq) for m in acked}, "acked messages came back"
    old = [m for m in again if not m.payload.startswith(b"late")]
    assert sorted((m.partition, m.seq) for m in old) == sorted((m.partition, m.seq) for m in unacked)
    assert all(m.redelivered for m in old)
    assert len(again) == len(unacked) + 9
    for p in range(3):
        seqs = [m.seq for m in again if m.partition == p]
        assert seqs == sorted(seqs)
    flow.ack_many(again)
    b.close()
    b = open_broker()
    assert b.queue_status("q").depth == 0
    f = b.bind("q")
    clock.advance(DELAY)
    b.tick()
    assert f.receive(100) == []


def test_ack_of_message_from_before_restart_through_new_flow(open_broker, clock, partitioner):
    b = open_broker()
    b.create_queue("q", partitions=1, rebalance_delay=DELAY, partitioner=partitioner)
    b.publish("q", b"x")
    f = b.bind("q", name="n")
    (m,) = f.receive(10)
    b.close()
    b = open_broker()
    f2 = b.bind("q", name="n")
    f2.ack(m)                           # the old Message object is still a valid ack handle
    assert f2.receive(10) == []
    assert b.queue_status("q").depth == 0


# ---------------------------------------------------------------------- process model
PUBLISHER = """
    import sys, time, partq
    time.sleep(float(sys.argv[2]))    # publish only once the parent's receive is waiting
    with partq.Broker.open(sys.argv[1]) as b:
        r = b.publish("q", b"from-child", key="k")
        print(r.partition, r.seq)
"""


def test_publish_in_other_process_wakes_blocking_receive(broker, data_dir):
    broker.create_queue("q", partitions=2)
    flow = broker.bind("q")
    assert flow.receive(10) == []
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PUBLISHER), str(data_dir), "0.5"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        got = flow.receive(10, timeout=5)
        elapsed = time.monotonic() - t0
    finally:
        out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert [m.payload for m in got] == [b"from-child"]
    assert elapsed < 4.5
    part, seq = map(int, out.split())
    assert (got[0].partition, got[0].seq) == (part, seq)
    flow.ack(got[0])


BINDER = """
    import sys, partq
    b = partq.Broker.open(sys.argv[1])
    try:
        flow = b.bind("q", name="other")
        print("BOUND", sorted(flow.partitions), b.queue_status("q").delivery_owner)
    except partq.DeliveryLocked as exc:
        print("LOCKED", exc)
    finally:
        b.close()
"""


def test_a_second_process_binding_is_served_by_the_owner(broker, data_dir, clock):
    """Rule `peer-flows`: DeliveryLocked never reaches a user who binds; the owner (this process, with a
    ManualClock: no rebalance happens until it ticks) serves the other process's flow."""
    broker.create_queue("q", partitions=2)
    broker.publish("q", b"x")
    broker.bind("q")
    res = run_py(BINDER, str(data_dir))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("BOUND []"), res.stdout      # a new member waits for holddown
    assert f"pid {os.getpid()}" in res.stdout
    assert broker.queue_status("q").delivery_owner.startswith(f"pid {os.getpid()} ")
    # Publishing from the other process is still allowed while this one delivers.
    res = run_py(PUBLISHER, str(data_dir), "0")
    assert res.returncode == 0, res.stderr
    # Once this broker closes, the other process takes delivery over; the closed process's
    # unnamed flow left with it, so the new one gets both partitions at once.
    broker.close()
    res = run_py(BINDER, str(data_dir))
    assert res.stdout.startswith("BOUND [0, 1] pid "), res.stdout + res.stderr
    assert f"pid {os.getpid()} " not in res.stdout


def test_a_second_broker_in_the_same_process_is_served_by_the_first(broker, data_dir, clock):
    broker.create_queue("q", partitions=2, rebalance_delay=0)
    first = broker.bind("q")
    other = partq.Broker.open(data_dir, clock=clock)
    try:
        second = other.bind("q")
        assert sorted(first.partitions) + sorted(second.partitions) in ([0, 1], [1, 0])
        assert len(first.partitions) == len(second.partitions) == 1
        other.publish("q", b"y")
    finally:
        other.close()


def test_named_flow_twice_is_refused(broker):
    broker.create_queue("q", partitions=2)
    broker.bind("q", name="dup")
    with pytest.raises(partq.InvalidConfig):
        broker.bind("q", name="dup")


def test_receive_on_unbound_flow_raises(broker):
    broker.create_queue("q", partitions=2)
    f = broker.bind("q")
    f.unbind()
    with pytest.raises(partq.FlowClosed):
        f.receive(1)


def test_a_count_changed_while_nobody_delivered_is_stored_at_the_first_bind(open_broker, clock):
    """Scaled while no process ran delivery: the first bind reconciles the assignment to the new
    count, and another broker reading the stored state sees every partition assigned."""
    b = open_broker()
    b.create_queue("grow", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF)
    b.bind("grow", name="a")
    b.close()
    b = open_broker()
    b.scale("grow", 4)                      # nobody delivers this queue in this process yet
    flow = b.bind("grow", name="a")
    assert flow.partitions == frozenset(range(4))
    observer = partq.Broker.open(b.path, clock=clock)   # reads the stored state, not b's memory
    try:
        st = observer.queue_status("grow")
        assert [p.status for p in st.partitions] == ["Ready"] * 4
        assert [p.flow for p in st.partitions] == [flow.flow_id] * 4
    finally:
        observer.close()


# ---------------------------------------------------------------------- acks without waiting
def test_ack_many_async_takes_effect_at_once_and_is_durable_after_result(open_broker, partitioner):
    b = open_broker()
    b.create_queue("q", partitions=2, partitioner=partitioner)
    b.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(300)])
    flow = b.bind("q", name="c")
    first = flow.receive(100)
    pending = flow.ack_many_async(first)
    second = flow.receive(100)            # while the first acks may still be committing
    assert not {(m.partition, m.seq) for m in first} & {(m.partition, m.seq) for m in second}
    assert flow.unacked == 100
    pending.result()
    assert pending.done()
    flow.ack_many_async(second).result()
    b.close()
    b = open_broker()
    rest = drain(b.bind("q", name="c"))
    assert sorted(m.payload for m in rest) == sorted(
        set(b"m%d" % i for i in range(300)) - {m.payload for m in first + second})


def test_ack_many_async_refuses_bad_acks_before_returning(broker, partitioner):
    broker.create_queue("q", partitioner=partitioner)
    broker.publish("q", b"x")
    flow = broker.bind("q")
    (m,) = flow.receive(1)
    with pytest.raises(partq.InvalidAck):
        flow.ack_many_async([m._replace(seq=m.seq + 5)])
    flow.ack_many_async([m]).result()
    assert broker.queue_status("q").depth == 0


def test_publish_async_keeps_order_shares_commits_and_reports_each_result(open_broker, partitioner):
    b = open_broker()
    b.create_queue("q", partitions=3, partitioner=partitioner)
    before, _ = b.store.commit_counts()    # to show that the publishes shared commits
    pending = [b.publish_async("q", b"m%d" % i, key=f"k{i % 5}") for i in range(200)]
    results = [p.result() for p in pending]
    assert all(p.done() for p in pending)
    assert b.store.commit_counts()[0] - before < 200
    for i, r in enumerate(results):
        assert r.partition == partq.key_partition(f"k{i % 5}", 3)
    by_key: dict[str, list[int]] = {}
    for i, r in enumerate(results):       # publish order is seq order within a key
        by_key.setdefault(f"k{i % 5}", []).append(r.seq)
    assert all(seqs == sorted(seqs) for seqs in by_key.values())
    with pytest.raises(partq.InvalidMessage):
        b.publish_async("q", "not bytes")     # bad input raises at once, nothing queued
    b.close()
    b = open_broker()
    got = drain(b.bind("q"))
    assert sorted(m.payload for m in got) == sorted(b"m%d" % i for i in range(200))


def test_commit_here_commits_a_batch_before_it_returns_when_the_writer_is_idle(tmp_path):
    """``partq serve`` publishes with ``commit_here``: when the writer is idle the connection's
    thread commits the batch itself, durable when the call returns; without it the batch goes
    to the writer thread."""
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=2)
        many = broker.publish_many_async("q", [b"a", b"b"], commit_here=True)
        assert many.done()
        each = broker.publish_each_async("q", [(b"c", None, None)], commit_here=True)
        assert each.done()
        assert len(many.result()) == 2 and len(each.result()) == 1
        broker.publish_many_async("q", [b"d"]).result()
        flow = broker.bind("q")
        assert sorted(m.payload for m in drain(flow)) == [b"a", b"b", b"c", b"d"]


def test_ack_many_commits_in_the_callers_thread_when_the_writer_is_idle(tmp_path):
    """``ack_many`` (``ack_many_async(commit_here=True)``) finding the writer idle commits the
    acks before it returns; durable across a reopen."""
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=1)
        broker.publish_many("q", [b"a", b"b", b"c"])
        flow = broker.bind("q")
        msgs = flow.receive(3, timeout=5)
        done = flow.ack_many_async(msgs[:2], commit_here=True)
        assert done.done()
        flow.ack_many(msgs[2:])
    with partq.Broker.open(data) as broker:
        assert broker.queue_status("q").partitions[0].depth == 0
