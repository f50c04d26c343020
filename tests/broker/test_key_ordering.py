"""Rule `key-ordering` (``ordering="key"``): every message of one key in publish order,
redeliveries included, and what holds one key back (a nack, its delay, a dead message) does
not hold the others of its partition. Real stores; time is the ManualClock."""
from __future__ import annotations

import pytest

import partq
from tests.helpers import drain


def one_partition(broker, **options):
    # a nack without a delay of its own comes back at once here: these tests follow order
    options.setdefault("redelivery_delay", 0)
    broker.create_queue("q", partitions=1, rebalance_delay=0, ordering="key", **options)


def test_a_nack_with_a_delay_holds_only_its_key(broker, clock):
    one_partition(broker)
    broker.publish_many("q", [(b"a1", "a"), (b"b1", "b"), (b"a2", "a"), (b"b2", "b")])
    flow = broker.bind("q")
    a1, b1, a2, b2 = flow.receive(10)
    flow.nack(a1, delay=5.0)
    assert flow.unacked == 2                     # a1 and a2 came back; b1 and b2 stay out
    assert flow.receive(10) == []                # a waits, b has nothing new
    broker.publish_many("q", [(b"b3", "b"), (b"a3", "a"), (b"c1", None)])
    assert [m.payload for m in flow.receive(10)] == [b"b3", b"c1"]   # not held by a
    flow.ack_many([b1, b2])
    clock.advance(5.1)
    got = flow.receive(10)
    assert [(m.payload, m.redelivered, m.delivery_count) for m in got] == [
        (b"a1", True, 2), (b"a2", True, 1), (b"a3", False, 1)]


def test_a_nack_without_a_delay_gives_back_only_its_key_in_order(broker):
    one_partition(broker)
    broker.publish_many("q", [(b"a1", "a"), (b"b1", "b"), (b"a2", "a"), (b"b2", "b")])
    flow = broker.bind("q")
    a1, b1, a2, b2 = flow.receive(10)
    flow.nack(a2)
    assert [(m.payload, m.redelivered) for m in flow.receive(10)] == [(b"a2", True)]
    flow.nack(a1)                                # a1 came before a2: both come again, in order
    flow.ack_many([b1, b2])
    assert [m.payload for m in flow.receive(10)] == [b"a1", b"a2"]


def test_a_poison_key_dies_and_the_other_keys_never_wait(broker):
    broker.create_queue("dmq")
    one_partition(broker, max_redelivery=1, dead_message_queue="dmq")
    broker.publish_many("q", [(b"p", "poison")] + [(b"ok%d" % i, f"k{i}") for i in range(5)])
    flow = broker.bind("q")
    first = flow.receive(10)
    assert [m.payload for m in first] == [b"p"] + [b"ok%d" % i for i in range(5)]
    flow.nack(first[0])
    flow.ack_many(first[1:])                     # the others were never given back
    (again,) = flow.receive(10)
    assert (again.payload, again.delivery_count) == (b"p", 2)
    flow.nack(again)
    assert flow.receive(10) == []
    assert broker.queue_status("q").dead["max_redelivery"] == 1
    assert broker.queue_status("q").depth == 0


def test_messages_passed_over_keep_their_order_and_are_not_marked(broker, clock):
    one_partition(broker)
    broker.publish_many("q", [(b"a1", "a"), (b"b1", "b")])
    flow = broker.bind("q")
    a1, b1 = flow.receive(10)
    flow.nack(a1, delay=1.0)
    broker.publish_many("q", [(b"a2", "a"), (b"b2", "b"), (b"a3", "a")])
    assert [m.payload for m in flow.receive(10)] == [b"b2"]      # a2 and a3 passed over
    clock.advance(1.1)
    got = flow.receive(10)
    assert [(m.payload, m.redelivered) for m in got] == [
        (b"a1", True), (b"a2", False), (b"a3", False)]
    flow.ack_many([b1, *got])
    broker.tick()
    assert broker.queue_status("q").depth == 1                  # b2, still unacked


def test_ordering_changes_on_a_live_queue(broker, clock):
    one_partition(broker)
    broker.publish_many("q", [(b"a1", "a"), (b"b1", "b"), (b"a2", "a")])
    flow = broker.bind("q")
    a1, b1, a2 = flow.receive(10)
    flow.nack(a1, delay=30)
    broker.update_queue("q", ordering="partition")   # once what "key" held back went out
    broker.publish("q", b"a3", key="a")
    assert flow.receive(10) == []                    # a1 and a2 first, after their delay
    clock.advance(30.1)
    assert [m.payload for m in flow.receive(10)] == [b"a1", b"a2", b"a3"]
    assert flow.receive(10) == []                    # the receive after: partition order
    flow.nack(b1)                                    # b1 and every later message in flight
    assert [m.payload for m in flow.receive(10)] == [b"b1", b"a2", b"a3"]
    assert broker.queue_config("q").ordering == "partition"
    with pytest.raises(partq.InvalidConfig, match="ordering"):
        broker.update_queue("q", ordering="per-key")


def test_status_counts_keys_waiting_out_a_delay(broker, clock):
    one_partition(broker)
    broker.publish_many("q", [(b"a1", "a"), (b"b1", "b")])
    flow = broker.bind("q")
    a1, b1 = flow.receive(10)
    flow.nack(a1, delay=10)
    flow.nack(b1, delay=10)
    assert broker.queue_status("q").delayed == 2
    clock.advance(11)
    assert len(drain(flow)) == 2


def test_the_status_shows_the_keys_held_and_what_they_hold(broker, clock):
    one_partition(broker)
    broker.publish_many("q", [(b"a1", "a"), (b"b1", "b"), (b"a2", "a"), (b"u", None)])
    flow = broker.bind("q")
    a1, b1, a2, u = flow.receive(10)
    flow.nack(a1, delay=5)                       # a holds a1 and a2
    flow.nack(u, delay=5)                        # an unkeyed message waits alone
    (p,) = broker.queue_status("q").partitions
    assert (p.held_keys, p.held_messages) == (2, 3)
    clock.advance(5.1)
    assert len(flow.receive(10)) == 3
    (p,) = broker.queue_status("q").partitions
    assert (p.held_keys, p.held_messages) == (0, 0)
