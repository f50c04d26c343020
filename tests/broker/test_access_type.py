"""Exclusive (non-partitioned) queues and changes of access type (rule `ingress-egress`).

An exclusive queue keeps its messages in the parent queue's log (partition ``PARENT``) and
delivers them to one flow at a time, the others standing by. Changing a queue between
partitioned and non-partitioned unbinds every flow with the reason; messages in removed
partitions go with them; messages left in the parent queue stay there, undelivered, for an
operator to copy out.
"""
from __future__ import annotations

import pytest
from broker_helpers import DELAY, drain

import partq
from partq import PARENT
from partq.storage.encoding import log_key


def _payloads(msgs) -> list[bytes]:
    return [m.payload for m in msgs]


def test_exclusive_queue_keeps_publish_order_in_the_parent_log(broker):
    broker.create_queue("q", partitions=4, access_type="exclusive")
    results = [broker.publish("q", b"m%d" % i, key=f"k{i % 5}" if i % 2 else None) for i in range(10)]
    results += broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(10, 20)])
    assert [(r.partition, r.seq) for r in results] == [(PARENT, i) for i in range(20)]
    st = broker.queue_status("q")
    assert (st.access_type, st.partition_count, st.depth, st.parent_depth) == ("exclusive", 0, 20, 20)
    assert [p.partition for p in st.partitions] == [PARENT]
    flow = broker.bind("q")
    got = drain(flow, batch=7)
    assert _payloads(got) == [b"m%d" % i for i in range(20)]      # one total order
    assert {m.partition for m in got} == {PARENT}
    assert broker.queue_status("q").depth == 0


def test_exclusive_queue_has_one_active_flow_and_standbys_take_over_in_bind_order(broker):
    broker.create_queue("q", access_type="exclusive", rebalance_delay=DELAY)
    broker.publish_many("q", [b"m%d" % i for i in range(6)])
    first, second, third = (broker.bind("q", name=n) for n in ("a", "b", "c"))
    assert (first.partitions, second.partitions, third.partitions) == \
        (frozenset({PARENT}), frozenset(), frozenset())
    assert second.receive(10) == [] and third.receive(10) == []
    held = first.receive(3)
    first.ack(held[0])
    first.unbind()                     # excess consumers exist: the first standby takes over now
    assert second.partitions == {PARENT} and third.partitions == frozenset()
    got = second.receive(10)
    assert _payloads(got) == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert [m.redelivered for m in got] == [True, True, False, False, False]
    assert [e.active for e in second.events()] == [True]


def test_named_consumer_of_an_exclusive_queue_keeps_it_across_a_restart(open_broker, clock):
    b = open_broker()
    b.create_queue("q", access_type="exclusive", rebalance_delay=DELAY)
    b.publish_many("q", [b"m%d" % i for i in range(4)])
    flow = b.bind("q", name="svc")
    flow.ack_many(flow.receive(2))
    b.close()
    b = open_broker()
    other = b.bind("q", name="other")          # binds first, but the queue is svc's for the delay
    assert other.partitions == frozenset()
    flow = b.bind("q", name="svc")
    assert flow.partitions == {PARENT}
    got = flow.receive(10)
    # a clean close made the delivered mark exact: m2 and m3 were never delivered
    assert _payloads(got) == [b"m2", b"m3"] and not any(m.redelivered for m in got)
    assert [m.delivery_count for m in got] == [1, 1]


def test_partitioned_to_exclusive_unbinds_every_flow_and_removes_partitions(broker, partitioner):
    broker.create_queue("q", partitions=3, partitioner=partitioner)
    broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(30)])
    flows = [broker.bind("q") for _ in range(2)]
    held = flows[0].receive(5)
    broker.update_queue("q", access_type="exclusive")
    for flow in flows:
        assert flow.closed
        with pytest.raises(partq.FlowClosed, match="partitioned .3 partitions. to non-partitioned"):
            flow.receive(1)
    flows[0].ack_many(held)       # late acks of removed partitions change nothing and do not fail
    st = broker.queue_status("q")
    assert (st.partition_count, st.depth, st.flows) == (0, 0, [])
    with broker.store.read() as r:
        assert not any(r.has_partition(st_qid(broker), p) for p in range(3))
        assert sum(r.stored_count(st_qid(broker), p) for p in range(3)) == 0
    assert broker.publish("q", b"after", key="k1").partition == PARENT
    fresh = broker.bind("q")
    assert _payloads(fresh.receive(10)) == [b"after"]


def st_qid(broker) -> int:
    return broker.queue_config("q").qid


def test_exclusive_to_partitioned_strands_parent_messages(broker, partitioner):
    broker.create_queue("q", partitions=2, access_type="exclusive", partitioner=partitioner)
    broker.publish_many("q", [(b"old%d" % i, f"k{i}") for i in range(10)])
    flow = broker.bind("q")
    held = flow.receive(4)
    flow.ack(held[0])
    broker.update_queue("q", access_type="non-exclusive")
    with pytest.raises(partq.FlowClosed, match="non-partitioned .exclusive access. to partitioned"):
        flow.receive(1)
    st = broker.queue_status("q")
    assert (st.access_type, st.partition_count, st.depth, st.parent_depth) == ("non-exclusive", 2, 0, 9)
    # the stranded messages are not delivered by the partitioned queue
    res = broker.publish_many("q", [(b"new%d" % i, f"k{i}") for i in range(6)])
    assert {r.partition for r in res} <= {0, 1}
    assert all(r.partition == partq.key_partition(f"k{i}", 2) for i, r in enumerate(res))
    fresh = broker.bind("q")
    assert sorted(_payloads(drain(fresh))) == sorted(b"new%d" % i for i in range(6))
    # a late ack of a delivered parent message is still recorded (copy-out will skip it)
    flow.ack_many(held[1:3])
    assert broker.queue_status("q").parent_depth == 7
    with broker.store.read() as r:
        ack = r.ack_state(st_qid(broker), PARENT)
    assert [s for s in range(10) if not ack.is_acked(s)] == [3, 4, 5, 6, 7, 8, 9]
    # back to exclusive: the partitions go, and the parent's messages are delivered again
    broker.update_queue("q", access_type="exclusive")
    again = broker.bind("q")
    got = drain(again)
    assert _payloads(got) == [b"old%d" % i for i in range(3, 10)]
    # old3 had been delivered: it must be marked (the others may be, as after a restart: the
    # durable delivered mark runs ahead of real deliveries)
    assert got[0].redelivered


def test_another_process_change_reaches_the_delivery_owner_on_its_next_tick(open_broker,
                                                                            partitioner):
    owner = open_broker()
    owner.create_queue("q", partitions=2, partitioner=partitioner)
    owner.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(8)])
    flow = owner.bind("q", name="svc")
    operator = open_broker()
    operator.update_queue("q", access_type="exclusive")
    operator.publish("q", b"x")
    assert not flow.closed                     # the owner has not looked yet
    owner.tick()
    assert flow.closed and "non-partitioned" in flow.closed_reason
    again = owner.bind("q", name="svc")
    assert again.partitions == {PARENT}
    assert _payloads(again.receive(10)) == [b"x"]


def test_change_made_while_no_process_ran_delivery_starts_fresh_assignments(open_broker):
    b = open_broker()
    b.create_queue("q", partitions=3, rebalance_delay=DELAY)
    b.bind("q", name="a")
    b.bind("q", name="b")
    b.close()                                   # assignments of partitions 0..2 persisted
    b = open_broker()
    b.update_queue("q", access_type="exclusive")
    b.publish_many("q", [b"p0", b"p1"])
    status = b.queue_status("q")                # read without running delivery
    assert [p.partition for p in status.partitions] == [PARENT] and status.flows == []
    flow = b.bind("q", name="b", hint=[1])      # the old name and hint mean nothing now
    assert flow.partitions == {PARENT}
    assert _payloads(flow.receive(10)) == [b"p0", b"p1"]


def test_scaling_refused_while_exclusive_and_bad_access_type(broker):
    broker.create_queue("q", partitions=2, access_type="exclusive")
    with pytest.raises(partq.InvalidConfig, match="exclusive"):
        broker.scale("q", 4)
    with pytest.raises(partq.InvalidConfig, match="access_type"):
        broker.update_queue("q", access_type="shared")
    with pytest.raises(partq.InvalidConfig, match="access_type"):
        broker.create_queue("r", access_type=None)
    broker.update_queue("q", access_type="non-exclusive")
    assert broker.scale("q", 4).partitions == 4


def test_delete_queue_removes_the_parent_log(broker):
    broker.create_queue("q", partitions=2, access_type="exclusive")
    broker.publish_many("q", [b"a", b"b"])
    qid = st_qid(broker)
    broker.update_queue("q", access_type="non-exclusive")
    broker.delete_queue("q")
    with broker.store.read() as r:
        assert not r.has_partition(qid, PARENT) and r.stored_count(qid, PARENT) == 0


def test_a_bind_right_after_another_process_changed_the_access_type_uses_the_new_one(open_broker):
    owner = open_broker()
    owner.create_queue("q", partitions=2)
    old = owner.bind("q", name="svc")
    open_broker().update_queue("q", access_type="exclusive")
    flow = owner.bind("q", name="svc")        # no tick in between: bind applies the change first
    assert old.closed and flow.partitions == {PARENT}


def test_ack_parent_removes_stranded_messages_only_on_a_partitioned_queue(broker):
    broker.create_queue("q", partitions=2, access_type="exclusive")
    broker.publish_many("q", [b"m%d" % i for i in range(5)])
    with pytest.raises(partq.InvalidConfig, match="exclusive"):
        broker.ack_parent("q", [0])
    broker.update_queue("q", access_type="non-exclusive")
    assert broker.ack_parent("q", [0, 1, 1, 3, 99]) == 3      # 99 was never published
    assert broker.ack_parent("q", [0, 1]) == 0
    assert broker.queue_status("q").parent_depth == 2
    with pytest.raises(partq.InvalidConfig, match="integers"):
        broker.ack_parent("q", [-1])
    broker.update_queue("q", access_type="exclusive")
    assert _payloads(drain(broker.bind("q"))) == [b"m2", b"m4"]


def test_a_damaged_parent_log_is_reported_as_the_parent_queue(broker):
    broker.create_queue("q", access_type="exclusive")
    broker.publish_many("q", [b"a", b"b", b"c"])               # one chunk, seqs 0..2
    store = broker.store
    with store.env.begin(write=True, db=store.dbs["log"]) as txn:
        txn.put(log_key(st_qid(broker), PARENT, 2), b"\xc1 damaged")
    flow = broker.bind("q")
    with pytest.raises(partq.CorruptRecord, match="queue 'q' parent queue seq 0: ") as err:
        flow.receive(10)
    assert (err.value.partition, err.value.seq) == (PARENT, 0)


def test_a_bound_flow_cannot_ack_stranded_messages_nobody_received(broker):
    broker.create_queue("q", partitions=2, access_type="exclusive")
    broker.publish_many("q", [(b"old%d" % i, f"k{i}") for i in range(5)])
    broker.update_queue("q", access_type="non-exclusive")       # five stranded, never delivered
    flow = broker.bind("q")
    forged = [partq.Message("q", PARENT, s, None, b"", None, 0, False) for s in range(5)]
    with pytest.raises(partq.InvalidAck, match="never given"):
        flow.ack_many(forged)
    assert broker.queue_status("q").parent_depth == 5
