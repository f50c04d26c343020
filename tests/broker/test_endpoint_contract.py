"""The contract of ``partq.flow.FlowEndpoint``, run on all three endpoints (``endpoint_kinds``):
a flow bound in the process that owns its queue's delivery, a flow of a second Broker of the
same directory served by that owner, and a flow of ``partq.connect`` through a real ``partq
serve``. Every case must hold on each of them; where an endpoint differs by design the
protocol's docstring says so and the case spells the difference out.

Every message is published with a key, so the queue's unkeyed partitioner plays no part."""
from __future__ import annotations

import time

import pytest
from endpoint_kinds import KINDS, Endpoints
from helpers import wait_until

import partq

PARTITIONS = 3


@pytest.fixture(params=KINDS)
def kind(request, tmp_path):
    endpoints = Endpoints(request.param, tmp_path)
    yield endpoints
    endpoints.close()


def make_queue(kind: Endpoints, **config) -> None:
    config.setdefault("partitions", PARTITIONS)
    config.setdefault("rebalance_delay", 0.0)
    kind.broker.create_queue("q", **config)


def keys_of(partition: int, n: int) -> list[str]:
    """``n`` keys that all hash to ``partition`` (rule `key-hash`)."""
    out, i = [], 0
    while len(out) < n:
        key = f"k{i}"
        if partq.key_partition(key, PARTITIONS) == partition:
            out.append(key)
        i += 1
    return out


def take(flow: partq.Flow, n: int, max_messages: int = 100, timeout: float = 30) -> list:
    """Receive until ``n`` messages came (a remote flow's arrive pushed, a peer flow's once its
    process saw the commit); fails when more come or none for ``timeout`` seconds."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"received {len(got)} of {n} messages"
        got += flow.receive(min(max_messages, n - len(got)), timeout=0.5)
    assert len(got) == n
    return got


def nothing_more(flow: partq.Flow) -> bool:
    return flow.receive(100, timeout=0.3) == []


def status_settled(kind: Endpoints, flow: partq.Flow) -> partq.QueueStatus:
    """The owner's status once it shows ``flow`` holding every partition."""
    return wait_until(lambda: (lambda st: st if all(p.flow == flow.flow_id for p in st.partitions)
                               else None)(kind.broker.queue_status("q")),
                      timeout=30, what="the owner's status to show the flow")


# ---------------------------------------------------------------------- binding
def test_bind_returns_the_partitions_and_exposes_flow_id(kind):
    make_queue(kind)
    flow = kind.bind("q", name="svc")
    assert flow.partitions == frozenset(range(PARTITIONS)) and flow.active
    assert isinstance(flow.flow_id, str) and flow.flow_id
    assert (flow.queue, flow.name, flow.closed, flow.closed_reason, flow.unacked) == \
        ("q", "svc", False, None, 0)
    st = status_settled(kind, flow)
    assert [(f.flow, f.name, f.bound) for f in st.flows] == [(flow.flow_id, "svc", True)]


# ---------------------------------------------------------------------- receive
def test_receive_returns_messages_in_partition_order_with_fields_set(kind):
    make_queue(kind)
    flow = kind.bind("q")
    sent = []
    for i in range(30):
        key = f"key-{i % 7}"
        sent.append((b"m%d" % i, key, {"i": i}))
    before = time.time_ns()
    kind.broker.publish_many("q", sent)
    got = take(flow, 30, max_messages=4)
    assert {m.payload for m in got} == {p for p, _, _ in sent}
    for m in got:
        payload, key, headers = sent[int(m.payload[1:])]
        assert (m.queue, m.partition, m.key, m.headers, m.redelivered) == \
            ("q", partq.key_partition(key, PARTITIONS), key, headers, False)
        assert m.publish_time_ns >= before - 10**9
    for p in range(PARTITIONS):     # in sequence order per partition, every key in publish order
        seqs = [m.seq for m in got if m.partition == p]
        assert seqs == sorted(seqs) == list(range(len(seqs)))
    for key in {k for _, k, _ in sent}:
        assert [m.payload for m in got if m.key == key] == [p for p, k, _ in sent if k == key]
    assert flow.unacked == 30


def test_receive_with_a_timeout_returns_nothing_when_nothing_waits(kind):
    make_queue(kind)
    flow = kind.bind("q")
    assert flow.receive(10) == []
    start = time.monotonic()
    assert flow.receive(10, timeout=0.3) == []
    assert time.monotonic() - start >= 0.3
    for bad in ({"max_messages": 0}, {"max_messages": 1, "timeout": -1.0}):
        with pytest.raises(partq.InvalidConfig):
            flow.receive(**bad)


# ---------------------------------------------------------------------- acks and nacks
def test_an_acked_message_never_comes_back(kind):
    make_queue(kind)
    flow = kind.bind("q", name="a")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(6)])
    got = take(flow, 6)
    for m in got:
        flow.ack(m)
    assert flow.unacked == 0 and nothing_more(flow)
    assert kind.broker.queue_status("q").depth == 0       # durable when ack returned
    flow.unbind()
    again = kind.bind("q", name="b")
    assert nothing_more(again)


WRONG_FLOW_CALLS = {
    "ack of an int": lambda flow, m: flow.ack(5),
    "ack of a str": lambda flow, m: flow.ack("abc"),
    "ack_many of ints": lambda flow, m: flow.ack_many([m, 1, 2]),
    "ack_many of None": lambda flow, m: flow.ack_many(None),
    "ack_many of a str": lambda flow, m: flow.ack_many("abc"),
    "nack of None": lambda flow, m: flow.nack(None),
    "nack of a tuple": lambda flow, m: flow.nack(tuple(m)),
    "reject of an int": lambda flow, m: flow.reject(5),
    "ack_through of a str partition": lambda flow, m: flow.ack_through(str(m.partition), m.seq),
    "ack_through of a bool partition": lambda flow, m: flow.ack_through(True, m.seq),
    "ack_through of a negative seq": lambda flow, m: flow.ack_through(m.partition, -5),
    "ack_through of a str seq": lambda flow, m: flow.ack_through(m.partition, "x"),
}


@pytest.mark.parametrize("call", sorted(WRONG_FLOW_CALLS))
def test_a_wrong_argument_raises_invalid_ack_and_changes_nothing(kind, call):
    """An ack of something that is not a received message (a bare tuple of its fields, a
    number, a partition named by a str) was a TypeError or AttributeError from deep inside,
    or, for ack_through, accepted and ignored."""
    make_queue(kind)
    flow = kind.bind("q", name="a")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(3)])
    got = take(flow, 3)
    with pytest.raises(partq.InvalidAck):
        WRONG_FLOW_CALLS[call](flow, got[0])
    assert flow.unacked == 3 and kind.broker.queue_status("q").depth == 3
    flow.ack_many(got)
    assert kind.broker.queue_status("q").depth == 0


def test_ack_many_acks_a_batch_in_one_commit(kind):
    make_queue(kind)
    flow = kind.bind("q")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(20)])
    got = take(flow, 20)
    flow.ack_many(got[:15])
    assert flow.unacked == 5
    assert kind.broker.queue_status("q").depth == 5
    flow.ack_many_async(got[15:]).result()
    assert flow.unacked == 0 and kind.broker.queue_status("q").depth == 0
    assert nothing_more(flow)


def test_nack_redelivers_the_message_and_the_rest_of_its_partition_marked_in_order(kind):
    make_queue(kind)
    flow = kind.bind("q")
    keys = keys_of(1, 5)
    kind.broker.publish_many("q", [(b"m%d" % i, k) for i, k in enumerate(keys)])
    first = take(flow, 5)
    assert [m.seq for m in first] == [0, 1, 2, 3, 4] and not any(m.redelivered for m in first)
    flow.nack(first[2])
    assert flow.unacked == 2
    again = take(flow, 3)
    assert [(m.seq, m.payload, m.redelivered) for m in again] == \
        [(m.seq, m.payload, True) for m in first[2:]]
    flow.ack_many(first[:2] + again)
    assert nothing_more(flow) and kind.broker.queue_status("q").depth == 0


def test_a_refused_ack_raises_from_the_call_or_from_its_result(kind):
    """Where endpoints differ (``FlowEndpoint``): a local or peer flow checks an ack itself and
    refuses in the call; a remote flow's refusal is its server's answer, raised by
    ``result()``. ``ack_many`` waits, so it raises on all three."""
    make_queue(kind)
    flow = kind.bind("q")
    kind.broker.publish("q", b"only", key="k")
    [m] = take(flow, 1)
    never = m._replace(seq=m.seq + 50)              # beyond anything delivered
    if kind.kind == "remote":
        pending = flow.ack_many_async([never])
        with pytest.raises(partq.InvalidAck):
            pending.result()
    else:
        with pytest.raises(partq.InvalidAck):
            flow.ack_many_async([never])
    with pytest.raises(partq.InvalidAck):
        flow.ack_many([m, never])                   # whole or not at all: m stays unacked
    assert kind.broker.queue_status("q").depth == 1 and flow.unacked == 1
    flow.ack(m)
    assert kind.broker.queue_status("q").depth == 0


def test_credit_is_bounded_by_max_delivered_unacked_per_flow(kind):
    make_queue(kind, max_delivered_unacked_per_flow=4)
    flow = kind.bind("q")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(10)])
    got = take(flow, 4)
    assert nothing_more(flow) and flow.unacked == 4       # rule `max-unacked`
    flow.ack_many(got[:3])
    got += take(flow, 3)
    assert nothing_more(flow) and flow.unacked == 4
    flow.ack_many(got[3:])
    got += take(flow, 3)
    flow.ack_many(got[7:])
    assert sorted(m.payload for m in got) == sorted(b"m%d" % i for i in range(10))


# ---------------------------------------------------------------------- unbinding
def test_unbind_then_receive_raises_flow_closed(kind):
    make_queue(kind)
    flow = kind.bind("q")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(10)])
    assert len(take(flow, 1, max_messages=1)) == 1     # the rest may wait on its way to the flow
    assert flow.unacked == 1
    flow.unbind()
    assert flow.closed and flow.closed_reason and not flow.active
    assert flow.partitions == frozenset() and flow.unacked == 0
    with pytest.raises(partq.FlowClosed):
        flow.receive(10)
    flow.unbind()                                      # again: nothing happens
    assert list(flow.messages()) == []


def test_an_ack_or_nack_after_unbind_is_fenced_and_the_messages_go_to_the_next_flow(kind):
    make_queue(kind)
    flow = kind.bind("q", name="a")
    kind.broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(6)])
    got = take(flow, 6)
    flow.unbind()
    with pytest.raises(partq.FlowFenced) as fenced:     # rule `fencing`: nothing was acked,
        flow.ack_many_async(got)                        # and every endpoint tells at once
    assert sorted((m.partition, m.seq) for m in fenced.value.messages) == \
        sorted((m.partition, m.seq) for m in got)
    with pytest.raises(partq.FlowFenced):
        flow.nack(got[0])
    with pytest.raises(partq.FlowFenced):
        flow.ack_through(got[0].partition, got[0].seq)
    assert kind.broker.queue_status("q").depth == 6
    successor = kind.bind("q", name="b")
    again = take(successor, 6)
    assert sorted(m.payload for m in again) == sorted(m.payload for m in got)
    assert all(m.redelivered for m in again)
    successor.ack_many(again)


# ---------------------------------------------------------------------- lifecycle
def dead_copies(kind: Endpoints, n: int) -> list:
    """The ``n`` messages of the dead message queue ``dmq``, read in the owner's process."""
    flow = kind.broker.bind("dmq")
    try:
        got = take(flow, n)
        flow.ack_many(got)
        return got
    finally:
        flow.unbind()


def test_a_nack_counts_a_failed_delivery_of_that_message_only(kind):
    make_queue(kind)
    flow = kind.bind("q")
    keys = keys_of(0, 3)
    kind.broker.publish_many("q", [(b"m%d" % i, k) for i, k in enumerate(keys)])
    first = take(flow, 3)
    assert [m.delivery_count for m in first] == [1, 1, 1]
    flow.nack(first[0])
    again = take(flow, 3)
    assert [(m.seq, m.delivery_count, m.redelivered) for m in again] == \
        [(0, 2, True), (1, 1, True), (2, 1, True)]
    flow.ack_many(again)
    assert nothing_more(flow)


def test_a_poison_message_goes_to_the_dead_message_queue_and_its_partition_flows_on(kind):
    kind.broker.create_queue("dmq")
    make_queue(kind, max_redelivery=1, dead_message_queue="dmq")
    flow = kind.bind("q")
    keys = keys_of(2, 3)
    kind.broker.publish_many("q", [(b"poison", keys[0], {"h": 1}), (b"ok1", keys[1]),
                                   (b"ok2", keys[2])])
    for count in (1, 2):
        got = take(flow, 3)
        assert (got[0].payload, got[0].delivery_count) == (b"poison", count)
        flow.nack(got[0])
    rest = take(flow, 2)
    assert [m.payload for m in rest] == [b"ok1", b"ok2"]
    flow.ack_many(rest)
    (dead,) = dead_copies(kind, 1)
    assert (dead.payload, dead.key) == (b"poison", keys[0])
    assert {k: dead.headers[k] for k in ("h", "dead_reason", "origin_queue", "origin_partition",
                                         "origin_seq", "delivery_count")} == \
        {"h": 1, "dead_reason": "max_redelivery", "origin_queue": "q", "origin_partition": 2,
         "origin_seq": 0, "delivery_count": 2}
    assert nothing_more(flow) and kind.broker.queue_status("q").depth == 0


def test_reject_moves_the_message_to_the_dead_message_queue_at_once(kind):
    kind.broker.create_queue("dmq")
    make_queue(kind, dead_message_queue="dmq")
    flow = kind.bind("q")
    keys = keys_of(1, 2)
    kind.broker.publish_many("q", [(b"bad", keys[0]), (b"good", keys[1])])
    bad, good = take(flow, 2)
    flow.reject(bad)
    assert flow.unacked == 1
    flow.ack(good)
    (dead,) = dead_copies(kind, 1)
    assert (dead.payload, dead.key, dead.headers["dead_reason"]) == (b"bad", keys[0], "rejected")
    assert nothing_more(flow) and kind.broker.queue_status("q").depth == 0


def test_a_reject_adds_the_consumers_headers_to_the_dead_copy(kind):
    kind.broker.create_queue("dmq")
    make_queue(kind, dead_message_queue="dmq")
    flow = kind.bind("q")
    kind.broker.publish("q", b"bad", key=keys_of(0, 1)[0], headers={"own": 1})
    (bad,) = take(flow, 1)
    with pytest.raises(partq.InvalidMessage, match="headers"):
        flow.reject(bad, headers=["not", "a", "dict"])
    flow.reject(bad, headers={"exception_type": "ValueError", "exception_message": "no"})
    (dead,) = dead_copies(kind, 1)
    assert dead.headers["own"] == 1 and dead.headers["dead_reason"] == "rejected"
    assert (dead.headers["exception_type"], dead.headers["exception_message"]) == ("ValueError",
                                                                                     "no")


def test_a_nack_with_a_delay_comes_back_only_after_it(kind):
    make_queue(kind)
    flow = kind.bind("q")
    kind.broker.publish("q", b"later", key=keys_of(0, 1)[0])
    (m,) = take(flow, 1)
    start = time.monotonic()
    flow.nack(m, delay=1.5)
    (again,) = take(flow, 1)
    assert time.monotonic() - start >= 1.4           # the delay is a rule, not a speed
    assert (again.payload, again.delivery_count, again.redelivered) == (b"later", 2, True)
    flow.ack(again)


def test_an_expired_message_is_never_delivered(kind):
    kind.broker.create_queue("dmq")
    make_queue(kind, dead_message_queue="dmq")
    key = keys_of(0, 1)[0]
    kind.broker.publish("q", b"stale", key=key, ttl=0.2)
    kind.broker.publish("q", b"fresh", key=key)
    expires = time.time() + 0.2
    wait_until(lambda: time.time() > expires + 0.05, 5, "the TTL to pass")
    flow = kind.bind("q")
    (m,) = take(flow, 1)
    assert m.payload == b"fresh"
    flow.ack(m)
    (dead,) = dead_copies(kind, 1)
    assert (dead.payload, dead.headers["dead_reason"]) == (b"stale", "expired")


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_an_ack_of_a_message_that_died_since_it_was_handed_out_is_fenced(kind, ordering):
    """A nack gives back the later message of its key too; that one expires while the nack's
    delay holds it, so it dies: the consumer's ack of the copy it still holds must not return
    as if it had taken the message (it is in the dead message queue), nor may an ack of a
    message the consumer rejected."""
    kind.broker.create_queue("dmq")
    make_queue(kind, dead_message_queue="dmq", ordering=ordering)
    flow = kind.bind("q")
    key, other = keys_of(0, 1)[0], keys_of(1, 1)[0]
    kind.broker.publish("q", b"first", key=key)
    kind.broker.publish("q", b"short", key=key, ttl=0.5)
    kind.broker.publish("q", b"bad", key=other)
    got = {m.payload: m for m in take(flow, 3)}
    first, short, bad = got[b"first"], got[b"short"], got[b"bad"]
    expires = time.time() + 0.5
    flow.nack(first, delay=1.0)                       # gives back "short" with it; a remote
    flow.reject(bad)                                  # flow's server sends again at once, so
    wait_until(lambda: time.time() > expires + 0.05, 5, "the TTL to pass")   # wait past the TTL
    (again,) = take(flow, 1)
    assert (again.payload, again.delivery_count) == (b"first", 2) and nothing_more(flow)
    for copy in (short, bad):
        with pytest.raises(partq.FlowFenced) as fenced:
            flow.ack_many([again, copy])              # whole or nothing: "first" stays unacked
        assert [m.seq for m in fenced.value.messages] == [copy.seq]
    assert kind.broker.queue_status("q").depth == 1
    flow.ack(again)
    dead = dead_copies(kind, 2)
    assert sorted((m.payload, m.headers["dead_reason"]) for m in dead) == \
        [(b"bad", "rejected"), (b"short", "expired")]
    assert kind.broker.queue_status("q").depth == 0


def test_a_flow_whose_handler_hangs_is_unbound_and_its_messages_redelivered(kind):
    make_queue(kind, max_poll_interval=1.0)
    hung = kind.bind("q")
    kind.broker.publish_many("q", [(b"m%d" % i, k) for i, k in enumerate(keys_of(0, 2))])
    held = take(hung, 2)                  # ... and then it never calls again
    wait_until(lambda: hung.closed, 30, "the hung flow to be unbound")
    assert "max_poll_interval" in hung.closed_reason
    other = kind.bind("q")
    again = take(other, 2)
    assert [(m.seq, m.delivery_count, m.redelivered) for m in again] == \
        [(m.seq, 2, True) for m in held]
    other.ack_many(again)


def test_a_flow_that_keeps_receiving_is_not_unbound_while_it_holds_messages(kind):
    make_queue(kind, max_poll_interval=2.0)    # (1 s was too tight on a loaded machine)
    flow = kind.bind("q")
    kind.broker.publish("q", b"m", key=keys_of(0, 1)[0])
    (m,) = take(flow, 1)
    start = time.monotonic()
    while time.monotonic() - start < 4.5:   # receives (getting nothing) past the interval
        assert flow.receive(10, timeout=0.2) == []
    assert not flow.closed
    flow.ack(m)


def test_an_operator_kills_or_acks_a_held_message_by_its_position(kind):
    kind.broker.create_queue("dmq")
    make_queue(kind, dead_message_queue="dmq")
    flow = kind.bind("q")
    keys = keys_of(0, 4)
    kind.broker.publish_many("q", [(b"m%d" % i, k) for i, k in enumerate(keys)])
    held = take(flow, 2, max_messages=2)              # m0 and m1 in flight
    assert kind.broker.kill_message("q", 0, 0) is True
    assert kind.broker.ack_message("q", 0, 1) is True
    assert kind.broker.kill_message("q", 0, 0) is False  # dead already
    flow.ack(held[1])                                 # acked already: nothing to do, no error
    with pytest.raises(partq.FlowFenced) as fenced:   # dead: the ack must not say it took it
        flow.ack(held[0])
    assert [(m.partition, m.seq) for m in fenced.value.messages] == [(0, 0)]
    rest = take(flow, 2)
    assert [m.payload for m in rest] == [b"m2", b"m3"]
    flow.ack_many(rest)
    (dead,) = dead_copies(kind, 1)
    assert (dead.payload, dead.headers["dead_reason"]) == (b"m0", "rejected")
    with pytest.raises(partq.PartitionNotFound):
        kind.broker.ack_message("q", 7, 0)
    assert nothing_more(flow) and kind.broker.queue_status("q").depth == 0


def test_under_key_ordering_a_nack_gives_back_and_holds_only_its_key(kind):
    make_queue(kind, ordering="key")
    flow = kind.bind("q")
    a, b = keys_of(1, 2)
    kind.broker.publish_many("q", [(b"a1", a), (b"b1", b), (b"a2", a), (b"b2", b)])
    a1, b1, a2, b2 = take(flow, 4)
    assert flow.nack(a1, delay=1.5) == [a1.seq, a2.seq]
    assert flow.unacked == 2
    kind.broker.publish("q", b"b3", key=b)
    (b3,) = take(flow, 1)                            # b is not held by a's delay
    assert b3.payload == b"b3"
    flow.ack_many([b1, b2, b3])
    again = take(flow, 2)
    assert [(m.payload, m.redelivered, m.delivery_count) for m in again] == [
        (b"a1", True, 2), (b"a2", True, 1)]
    flow.ack_many(again)
    assert nothing_more(flow) and kind.broker.queue_status("q").depth == 0


def test_under_key_ordering_a_handoff_holds_only_the_keys_its_source_still_holds(kind):
    """The partition handed off goes to its new flow at once and only the keys the old flow
    holds unacked wait (rule `key-ordering`): flows of the process that runs the queue's
    delivery (local, and every client of ``partq serve``) and flows of another process (peer:
    the new flow reads from the store what the old one holds, once the old one settled the
    partition on seeing the pause, which it does whether or not it receives)."""
    make_queue(kind, ordering="key", max_handoff_time=60.0, max_delivered_unacked_per_flow=1)
    one = kind.bind("q", name="one")
    b, c = keys_of(PARTITIONS - 1, 2)   # the donor hands off its highest-numbered partition
    kind.broker.publish("q", b"b1", key=b)
    (b1,) = take(one, 1)
    kind.broker.publish_many("q", [(b"c1", c), (b"c2", c), (b"b2", b)])
    two = kind.bind("q", name="two")
    wait_until(lambda: kind.broker.queue_status("q").rebalance_status == "Rebalancing",
               timeout=30, what="the handoff to start")
    got = []
    for _ in range(2):
        (m,) = take(two, 1)
        got.append(m.payload)
        two.ack(m)                  # taken although the handoff is still under way
    assert got == [b"c1", b"c2"]
    assert nothing_more(two)
    assert one.receive(10, timeout=0.3) == []       # the paused partition gives it nothing
    one.ack(b1)                     # b drained: the handoff ends
    while len(got) < 3:
        (m,) = take(two, 1)
        got.append(m.payload)
        assert not m.redelivered
        two.ack(m)
    assert got == [b"c1", b"c2", b"b2"]
    assert nothing_more(two) and kind.broker.queue_status("q").depth == 0


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_a_receive_waiting_when_a_nacks_delay_ends_gets_the_message(kind, ordering):
    """A receive that waits is woken when a nack's delay ends (a due timer), not only at the end
    of its own timeout: one receive with a timeout far longer than the delay gets the message."""
    make_queue(kind, ordering=ordering)
    flow = kind.bind("q")
    kind.broker.publish("q", b"later", key=keys_of(0, 1)[0])
    (m,) = take(flow, 1)
    flow.nack(m, delay=0.3)
    got = flow.receive(10, timeout=60)
    assert [(g.payload, g.redelivered) for g in got] == [(b"later", True)]
    flow.ack_many(got)


def test_a_flow_that_leaves_for_good_hands_its_partitions_over_at_once(kind):
    """Rule `leave`: ``unbind(leave=True)`` leaves no ghost: the other flow takes the
    partitions without waiting out the rebalance delay (60 s here)."""
    make_queue(kind, rebalance_delay=60.0)
    first = kind.bind("q")
    wait_until(lambda: first.partitions == frozenset(range(PARTITIONS)), 30, "first holds all")
    kind.broker.publish("q", b"m", key=keys_of(0, 1)[0])
    take(first, 1)                                  # unacked: it comes back, marked
    second = kind.bind("q")
    first.unbind(leave=True)
    wait_until(lambda: second.partitions == frozenset(range(PARTITIONS)), 30,
               "second holds all at once")
    (again,) = take(second, 1)
    assert again.redelivered
