"""The seed's handoff example (B1..B5 in partition 1, moving from consumer 1 to consumer 2) with a
second key, C, in the moving partition, on both orderings (rule `key-ordering`).

Under "partition" every message of partition 1 waits until consumer 1 acked B1 and B2 (or
max_handoff_time passed). Under "key" only B waits: C's messages reach consumer 2 at once, and
consumer 2's acks of them count although the handoff is still under way; nothing is delivered
twice and each key keeps its order through the handoff's end, whichever way it ends."""
from __future__ import annotations

import pytest
from broker_helpers import DELAY, HANDOFF
from example_helpers import KEY_A, KEY_B, pick_key

import partq

KEY_C = pick_key(1, 2, ["C", "CC", "C0", "cust-C", "C_", "C1", "C2"])


def setup(broker, clock, ordering: str):
    """Consumer 1 holds both partitions and has received B1, B2 (unacked); B3, C1, C2 wait in
    partition 1; consumer 2 bound and the rebalance delay passed: the handoff of partition 1
    from consumer 1 to consumer 2 has started."""
    assert partq.key_partition(KEY_C, 2) == 1 and KEY_C != KEY_B
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        ordering=ordering)
    c1 = broker.bind("q", name="consumer-1")
    broker.publish("q", b"A1", key=KEY_A)
    for payload, key in ((b"B1", KEY_B), (b"B2", KEY_B), (b"B3", KEY_B), (b"C1", KEY_C),
                         (b"C2", KEY_C)):
        assert broker.publish("q", payload, key=key).partition == 1
    got: list[partq.Message] = []
    while not any(m.payload == b"B2" for m in got):
        batch = c1.receive(1)
        assert batch, "consumer 1 should be able to receive B1 and B2"
        got += batch
    c1.ack_many([m for m in got if m.partition == 0])
    bs = [m for m in got if m.partition == 1]
    assert [m.payload for m in bs] == [b"B1", b"B2"]
    c2 = broker.bind("q", name="consumer-2")
    clock.advance(DELAY)
    broker.tick()
    st = broker.queue_status("q")
    # under "key" the partition shows its new flow at once (``held_view``)
    assert st.rebalance_status == "Rebalancing" and st.partitions[1].flow == \
        (c2 if ordering == "key" else c1).flow_id
    return c1, c2, bs


def payloads(msgs) -> list[bytes]:
    return [m.payload for m in msgs]


def test_graceful_handoff_holds_the_whole_partition_under_partition_order(broker, clock):
    c1, c2, bs = setup(broker, clock, "partition")
    broker.publish("q", b"C3", key=KEY_C)
    assert c2.receive(100) == []            # C waits with B
    c1.ack(bs[0])
    assert c2.receive(100) == []
    c1.ack(bs[1])                            # the handoff ends
    got = c2.receive(100)
    assert payloads(got) == [b"B3", b"C1", b"C2", b"C3"]
    c2.ack_many(got)
    assert broker.queue_status("q").depth == 0


def test_graceful_handoff_holds_only_the_draining_key_under_key_order(broker, clock):
    c1, c2, bs = setup(broker, clock, "key")
    assert 1 in c2.partitions               # assigned at once
    got = c2.receive(100)
    assert payloads(got) == [b"C1", b"C2"] and not any(m.redelivered for m in got)
    c2.ack_many(got)                         # taken although consumer 1 still drains B
    broker.publish("q", b"B4", key=KEY_B)
    broker.publish("q", b"C3", key=KEY_C)
    later = c2.receive(100)
    assert payloads(later) == [b"C3"]
    c2.ack_many(later)
    st = broker.queue_status("q").partitions[1]
    assert st.held_keys >= 1 and st.held_messages >= 2      # B3, B4 wait for B1, B2
    c1.ack(bs[0])
    assert [m.payload for m in c2.receive(100) if m.key == KEY_B] == []
    c1.ack(bs[1])                            # B drained: the handoff ends
    st = broker.queue_status("q")
    assert st.partitions[1].flow == c2.flow_id and st.rebalance_status == "Ready"
    rest = c2.receive(100)
    assert [m.payload for m in rest if m.key == KEY_B] == [b"B3", b"B4"]
    assert not any(m.redelivered for m in rest)
    c2.ack_many(rest)
    assert broker.queue_status("q").depth == 0


def test_timed_out_key_handoff_gives_back_only_what_the_source_held(broker, clock):
    c1, c2, bs = setup(broker, clock, "key")
    early = c2.receive(100)
    assert payloads(early) == [b"C1", b"C2"]        # held by consumer 2, not acked
    clock.advance(HANDOFF)
    broker.tick()                                    # consumer 1 never acked B1, B2
    assert broker.queue_status("q").partitions[1].flow == c2.flow_id
    got = c2.receive(100)
    assert payloads(got) == [b"B1", b"B2", b"B3"]   # C1, C2 are not delivered twice
    assert [m.redelivered for m in got] == [True, True, False]
    assert [m.delivery_count for m in got] == [2, 2, 1]
    with pytest.raises(partq.FlowFenced):
        c1.ack_many(bs)
    c2.ack_many(early + got)
    assert broker.queue_status("q").depth == 0


def test_target_leaving_a_key_handoff_gives_back_what_it_received(broker, clock):
    c1, c2, bs = setup(broker, clock, "key")
    early = c2.receive(100)
    assert payloads(early) == [b"C1", b"C2"]
    c2.unbind()                      # the handoff is cancelled: partition 1 stays with consumer 1
    got = c1.receive(100)
    assert [m.payload for m in got if m.key == KEY_C] == [b"C1", b"C2"]
    assert all(m.redelivered for m in got if m.key == KEY_C)
    assert [m.payload for m in got if m.key == KEY_B] == [b"B3"]
    c1.ack_many(bs + got)
    assert broker.queue_status("q").depth == 0


def test_source_leaving_a_key_handoff_gives_its_messages_to_the_target(broker, clock):
    c1, c2, bs = setup(broker, clock, "key")
    early = c2.receive(100)
    assert payloads(early) == [b"C1", b"C2"]
    c1.unbind()
    got = c2.receive(100)
    assert [m.payload for m in got if m.partition == 1] == [b"B1", b"B2", b"B3"]
    assert [m.redelivered for m in got if m.partition == 1] == [True, True, False]
    c2.ack_many(early + got)
    assert broker.queue_status("q").depth == 0


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_status_shows_who_takes_the_partition_and_what_waits(broker, clock, ordering):
    """Under "key" the moving partition shows its new flow, Ready, holding the draining key B for
    the handoff; under "partition" it shows Paused at its old flow."""
    c1, c2, bs = setup(broker, clock, ordering)
    p1 = broker.queue_status("q").partitions[1]
    if ordering == "partition":
        assert (p1.status, p1.flow, p1.held_keys, p1.held_for) == ("Paused", c1.flow_id, 0, [])
        return
    assert (p1.status, p1.flow, p1.flow_name) == ("Ready", c2.flow_id, "consumer-2")
    assert (p1.held_keys, p1.held_for) == (1, ["handoff"])
    assert payloads(c2.receive(100)) == [b"C1", b"C2"]
    p1 = broker.queue_status("q").partitions[1]
    assert (p1.held_keys, p1.held_messages) == (1, 1)      # B3 waits for B1, B2
    c1.ack_many(bs)
    p1 = broker.queue_status("q").partitions[1]
    assert (p1.flow, p1.held_for) == (c2.flow_id, [])


def test_a_nack_delay_shows_as_what_holds_its_key(broker, clock):
    broker.create_queue("q", partitions=2, ordering="key")
    c1 = broker.bind("q")
    for payload, key in ((b"B1", KEY_B), (b"B2", KEY_B), (b"C1", KEY_C)):
        broker.publish("q", payload, key=key)
    got = c1.receive(100)
    c1.nack(got[0], delay=30)                       # B1 and B2 wait; C1 stays with consumer 1
    p1 = broker.queue_status("q").partitions[1]
    assert (p1.held_for, p1.held_keys, p1.held_messages) == (["delay"], 1, 2)
    clock.advance(31)
    p1 = broker.queue_status("q").partitions[1]
    assert p1.held_for == [] and p1.held_keys == 1          # due: waiting for a receive
    again = c1.receive(100)
    assert payloads(again) == [b"B1", b"B2"]
    c1.ack_many(got[2:] + again)
    assert broker.queue_status("q").partitions[1].held_keys == 0


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_the_rebalance_dry_run_names_the_keys_a_handoff_would_hold(broker, clock, ordering):
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        ordering=ordering)
    c1 = broker.bind("q", name="consumer-1")
    for payload, key in ((b"B1", KEY_B), (b"C1", KEY_C), (b"B2", KEY_B)):
        broker.publish("q", payload, key=key)
    held = c1.receive(100)
    assert len(held) == 3
    plan = broker.rebalance_plan("q", add=["consumer-2"])
    [step] = [s for s in plan["steps"] if s["action"] == "handoff"]
    assert step["partition"] == 1 and step["unacked"] == 3
    if ordering == "partition":
        assert step["holds_keys"] is None               # the whole partition pauses
    else:
        assert step["holds_keys"] == sorted([KEY_B, KEY_C]) and step["holds_key_count"] == 2
    c1.ack_many(held)


def test_a_keys_nack_delay_holds_after_its_partition_moved(broker, clock):
    """A nack's delay under "key" is not lost when the partition moves to another flow (read
    again from its ack floor): the new flow gets the message after what is left of the delay,
    the key's later messages after it, and the other keys at once."""
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, ordering="key")
    c1 = broker.bind("q", name="consumer-1")
    for payload, key in ((b"B1", KEY_B), (b"B2", KEY_B), (b"C1", KEY_C)):
        broker.publish("q", payload, key=key)
    got = c1.receive(100)
    assert payloads(got) == [b"B1", b"B2", b"C1"]
    c1.nack(got[0], delay=30)                       # B1, B2 wait 30 s
    c2 = broker.bind("q", name="consumer-2")
    c1.unbind()                                      # C1 comes back; partition 1 moves to c2
    clock.advance(DELAY)
    broker.tick()
    assert 1 in c2.partitions
    first = c2.receive(100)
    assert payloads(first) == [b"C1"]
    clock.advance(30 - DELAY)
    broker.tick()
    later = c2.receive(100)
    assert payloads(later) == [b"B1", b"B2"] and all(m.redelivered for m in later)
    assert [m.delivery_count for m in later] == [2, 1]
    c2.ack_many(first + later)
    assert broker.queue_status("q").depth == 0
