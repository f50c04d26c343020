"""Online scaling keeps per-key order (rule `online-scaling`): the worked example of docs/behaviour.md and the
edges around it (restart, a second scaling, scale-down, unkeyed messages, status).

The random walk over all of it is ``test_online_scaling_machine``."""
from __future__ import annotations

import threading

import pytest
from helpers import drain, wait_until

from partq import key_partition
from partq.errors import InvalidConfig


def moved_and_stayed(old: int, new: int, n: int = 40) -> tuple[list[str], list[str]]:
    keys = [f"k{i}" for i in range(n)]
    moved = [k for k in keys if key_partition(k, old) != key_partition(k, new)]
    stayed = [k for k in keys if key_partition(k, old) == key_partition(k, new)]
    assert moved and stayed
    return moved, stayed


def by_key(msgs) -> dict[str | None, list[bytes]]:
    out: dict[str | None, list[bytes]] = {}
    for m in msgs:
        out.setdefault(m.key, []).append(m.payload)
    return out


def test_worked_example_4_to_6(open_broker, clock, partitioner):
    """Two keys across 4 -> 6: one stays in its partition and flows at once, one moves and
    waits until its old partition is acked to the cut-over; unkeyed messages never wait."""
    moved, stayed = moved_and_stayed(4, 6)
    a, b = stayed[0], moved[0]
    broker = open_broker()
    broker.create_queue("q", partitions=4, rebalance_delay=0.0, partitioner=partitioner)
    flow = broker.bind("q", name="c")
    broker.publish_many("q", [(b"a-old", a), (b"b-old", b)])
    old = flow.receive(10)                     # delivered, not acked
    assert sorted(m.payload for m in old) == [b"a-old", b"b-old"]
    broker.scale("q", 6, online=True)
    broker.tick()                              # the new partitions 4 and 5 are assigned to c
    assert flow.partitions == frozenset(range(6))
    # unkeyed first: one published behind b-new in b-new's partition would wait with it
    broker.publish("q", b"none-new")
    broker.publish_many("q", [(b"a-new", a), (b"b-new", b)])
    got = drain(flow, ack=False, batch=10, max_rounds=3)
    assert sorted(m.payload for m in got) == [b"a-new", b"none-new"]     # b-new waits
    status = broker.queue_status("q")
    old_b = key_partition(b, 4)
    held = {o["partition"]: o for o in status.cutover["old_partitions"]}
    assert held[old_b]["held"] == 1 and held[old_b]["remaining"] >= 1
    flow.ack_many(old + got)
    assert [m.payload for m in flow.receive(10)] == [b"b-new"]
    broker.tick()
    assert broker.queue_status("q").cutover is None      # drained: the check is off


def test_hold_survives_a_restart(open_broker, clock):
    moved, _ = moved_and_stayed(2, 5)
    k = moved[0]
    broker = open_broker()
    broker.create_queue("q", partitions=2, rebalance_delay=0.0)
    broker.publish("q", b"old", key=k)
    broker.scale("q", 5, online=True)
    broker.publish("q", b"new", key=k)
    broker.close()
    broker = open_broker()
    flow = broker.bind("q", name="c")
    first = flow.receive(10)
    assert [m.payload for m in first] == [b"old"]
    assert flow.receive(10) == []                         # new waits for old's ack
    flow.ack_many(first)
    assert [m.payload for m in flow.receive(10)] == [b"new"]


def test_a_second_online_scaling_waits_for_the_first_to_drain(open_broker, clock):
    moved, _ = moved_and_stayed(3, 4)
    broker = open_broker()
    broker.create_queue("q", partitions=3, rebalance_delay=0.0)
    broker.publish("q", b"old", key=moved[0])
    broker.scale("q", 4, online=True)
    with pytest.raises(InvalidConfig, match="still draining"):
        broker.scale("q", 6, online=True)
    drain(broker.bind("q", name="c"))
    broker.scale("q", 6, online=True)                     # drained (record not yet removed)
    assert broker.queue_config("q").partitions == 6


def test_an_offline_scaling_drops_the_holds(open_broker, clock):
    moved, _ = moved_and_stayed(3, 4)
    broker = open_broker()
    broker.create_queue("q", partitions=3, rebalance_delay=0.0)
    broker.publish("q", b"old", key=moved[0])
    broker.scale("q", 4, online=True)
    assert broker.queue_status("q").cutover is not None
    broker.scale("q", 5)
    assert broker.queue_status("q").cutover is None


def test_online_scale_down_retires_removed_partitions_and_loses_nothing(open_broker, clock):
    """6 -> 4: the removed partitions are retired, not deleted: publishes stop going there, they
    are still delivered, and they go once drained (the scale waits for that). Every key keeps
    its order: a key of a removed partition, and one moving between kept partitions, each wait
    for their old partition."""
    keys = [f"k{i}" for i in range(60)]
    from_removed = next(k for k in keys if key_partition(k, 6) >= 4)
    between_kept = next(k for k in keys
                        if key_partition(k, 6) < 4 and key_partition(k, 6) != key_partition(k, 4))
    broker = open_broker()
    broker.create_queue("q", partitions=6, rebalance_delay=0.0)
    flow = broker.bind("q", name="c")
    broker.publish_many("q", [(b"r-old", from_removed), (b"m-old", between_kept)])
    old = flow.receive(10)
    assert sorted(m.payload for m in old) == [b"m-old", b"r-old"]
    scaled: list = []
    scaler = threading.Thread(target=lambda: scaled.append(broker.scale("q", 4, online=True)))
    scaler.start()
    wait_until(lambda: broker.queue_config("q").partitions == 4, 30, "the mapping switched")
    st = broker.queue_status("q")
    assert (st.scaling_status, st.depth) == ("ScalingDown", 2)   # nothing went with them
    broker.publish_many("q", [(b"r-new", from_removed), (b"m-new", between_kept)])
    assert {r.partition for r in broker.publish_many("q", [(b"x", k) for k in keys])} <= set(range(4))
    early = flow.receive(100)
    assert all(m.key not in (from_removed, between_kept) for m in early)
    flow.ack_many([m for m in old if m.key == from_removed])
    wait_until(lambda: scaled, 30, "the scale-down to end once the retired partitions drained")
    assert scaled[0].partitions == 4 and broker.queue_status("q").scaling_status == "Ready"
    got = drain(flow, ack=False, timeout=0.1)
    assert [m.payload for m in got if m.key == from_removed][:1] == [b"r-new"]
    assert [m for m in got if m.key == between_kept] == []          # still waits for m-old
    flow.ack_many([m for m in old if m.key == between_kept])
    got += drain(flow, ack=False, timeout=0.1)
    assert [m.payload for m in got if m.key == from_removed] == [b"r-new", b"x"]
    assert [m.payload for m in got if m.key == between_kept] == [b"m-new", b"x"]
    assert len(early) + len(got) == 2 + len(keys)                   # nothing lost


def test_a_hold_stops_its_partition_in_order(open_broker, clock):
    """Messages behind a held one in the same partition wait with it (the partition's order)."""
    moved, stayed = moved_and_stayed(4, 6, 200)
    k = next(m for m in moved if key_partition(m, 6) < 4)      # lands where a key stays
    behind = next(s for s in stayed if key_partition(s, 6) == key_partition(k, 6))
    broker = open_broker()
    broker.create_queue("q", partitions=4, rebalance_delay=0.0)
    flow = broker.bind("q", name="c")
    broker.publish("q", b"old", key=k)
    old = flow.receive(10)
    broker.scale("q", 6, online=True)
    broker.publish_many("q", [(b"new", k), (b"behind", behind)])
    assert flow.receive(10) == []
    flow.ack_many(old)
    assert [m.payload for m in flow.receive(10)] == [b"new", b"behind"]


def test_online_flag_is_not_a_user_setting(open_broker):
    broker = open_broker()
    broker.create_queue("q", partitions=2)
    with pytest.raises(InvalidConfig):
        broker.update_queue("q", scaling_online=True)


def test_key_order_per_key_over_many_keys(open_broker, clock, partitioner):
    """Every key's messages come in publish order across an online 3 -> 7, with acks as they
    come (the check switches off once the old partitions drained)."""
    broker = open_broker()
    broker.create_queue("q", partitions=3, rebalance_delay=0.0, partitioner=partitioner)
    flow = broker.bind("q", name="c")
    keys = [f"k{i}" for i in range(30)]
    broker.publish_many("q", [(f"{k}:0".encode(), k) for k in keys])
    first = flow.receive(15)
    broker.scale("q", 7, online=True)
    broker.publish_many("q", [(f"{k}:1".encode(), k) for k in keys])
    flow.ack_many(first)
    seen = by_key(first + drain(flow, batch=7))
    for k in keys:
        assert seen[k] == [f"{k}:0".encode(), f"{k}:1".encode()], k
    broker.tick()
    assert broker.queue_status("q").cutover is None
