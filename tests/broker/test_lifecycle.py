"""The message lifecycle (rules `delivery-count` to `expiry`): delivery counts, redelivery limits and the dead
message queue, reject, nack delays, expiry. Real stores; time is the ManualClock."""
from __future__ import annotations

import pytest

import partq
from partq.delivery.dead_letter import dead_counts
from tests.helpers import drain


def setup(broker, **options):
    # these tests count deliveries and follow the order of redeliveries: a nack without a
    # delay of its own comes back at once (the default's small delay has a test of its own)
    options.setdefault("redelivery_delay", 0)
    broker.create_queue("dmq", partitions=2)
    broker.create_queue("jobs", partitions=1, dead_message_queue="dmq", rebalance_delay=0,
                        **options)


def dead_letters(broker, n_min: int = 0) -> list[partq.Message]:
    with broker.bind("dmq") as flow:
        return drain(flow, at_least=n_min)


def counts(broker, queue: str = "jobs") -> dict:
    with broker.store.read() as r:
        return dead_counts(r, broker.queue_config(queue).qid)


def test_a_poison_message_dies_after_exactly_1_plus_max_redelivery_deliveries(broker):
    setup(broker, max_redelivery=2)
    broker.publish_many("jobs", [(b"poison", "a"), (b"ok-1", "b"), (b"ok-2", "c")])
    flow = broker.bind("jobs")
    deliveries = []
    acked = []
    for _ in range(20):
        msgs = flow.receive(10)
        if not msgs:
            break
        for m in msgs:
            if m.payload == b"poison":
                deliveries.append(m.delivery_count)
                flow.nack(m)
                break
            flow.ack(m)
            acked.append(m.payload)
    assert deliveries == [1, 2, 3]
    assert acked == [b"ok-1", b"ok-2"]          # the rest of the partition flowed on, in order
    dead = dead_letters(broker, 1)
    assert [m.payload for m in dead] == [b"poison"]
    h = dead[0].headers
    assert h["dead_reason"] == "max_redelivery" and h["origin_queue"] == "jobs"
    assert (h["origin_partition"], h["origin_seq"], h["delivery_count"]) == (0, 0, 3)
    assert dead[0].key == "a"
    assert counts(broker)["max_redelivery"] == 1
    assert broker.queue_status("jobs").depth == 0


def test_later_messages_given_back_by_a_nack_keep_their_count(broker):
    setup(broker, max_redelivery=1)
    broker.publish_many("jobs", [b"first", b"second", b"third"])
    flow = broker.bind("jobs")
    first, second, third = flow.receive(3)
    flow.nack(first)              # second and third come back too, not counted
    again = flow.receive(3)
    assert [(m.payload, m.delivery_count, m.redelivered) for m in again] == [
        (b"first", 2, True), (b"second", 1, True), (b"third", 1, True)]
    flow.nack(again[0])           # first is past max_redelivery=1: dead
    rest = flow.receive(3)
    assert [(m.payload, m.delivery_count) for m in rest] == [(b"second", 1), (b"third", 1)]
    flow.ack_many(rest)
    assert [m.payload for m in dead_letters(broker, 1)] == [b"first"]


def test_reject_kills_at_once_whatever_max_redelivery_says(broker):
    setup(broker)                 # max_redelivery 0: redeliver forever
    broker.publish("jobs", b"bad", key="k", headers={"trace": "t1"})
    broker.publish("jobs", b"good", key="k")
    flow = broker.bind("jobs")
    bad, good = flow.receive(2)
    flow.reject(bad)
    flow.ack(good)
    assert flow.receive(5) == []
    dead = dead_letters(broker, 1)
    assert [(m.payload, m.key) for m in dead] == [(b"bad", "k")]
    assert dead[0].headers["trace"] == "t1" and dead[0].headers["dead_reason"] == "rejected"
    assert dead[0].headers["delivery_count"] == 1
    assert counts(broker)["rejected"] == 1


def test_without_a_dead_message_queue_dead_messages_are_discarded_and_counted(broker):
    broker.create_queue("jobs", max_redelivery=1, rebalance_delay=0, redelivery_delay=0)
    broker.publish("jobs", b"poison")
    flow = broker.bind("jobs")
    for _ in range(2):
        flow.nack(flow.receive(1)[0])
    assert flow.receive(1) == []
    c = counts(broker)
    assert c["max_redelivery"] == 1 and c["discarded"] == 1


def test_a_nack_with_a_delay_holds_its_partition_until_the_delay_passed(broker, clock):
    setup(broker)
    broker.publish_many("jobs", [b"a", b"b"])
    flow = broker.bind("jobs")
    a, _b = flow.receive(2)
    flow.nack(a, delay=5.0)
    assert flow.receive(2) == []
    clock.advance(4.9)
    assert flow.receive(2) == []
    clock.advance(0.2)
    assert [m.payload for m in flow.receive(2)] == [b"a", b"b"]


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_a_nack_delay_holds_across_a_restart(open_broker, clock, ordering):
    """The delay is durable: a broker that restarts (a deploy) does not send the nacked message
    again before its delay ends. Under "partition" the partition waits at it; under "key" only
    its key does."""
    broker = open_broker()
    setup(broker, ordering=ordering)
    broker.publish_many("jobs", [(b"a1", "a"), (b"b1", "b"), (b"a2", "a")])
    flow = broker.bind("jobs")
    a1, b1, a2 = flow.receive(3)
    flow.ack(b1)
    flow.nack(a1, delay=60.0)               # "key": a1 and a2 come back and wait
    if ordering == "partition":
        assert flow.receive(3) == []        # a1 and everything after it wait
    broker.close()
    clock.advance(30)
    broker = open_broker()
    broker.publish("jobs", b"b2", key="b")
    flow = broker.bind("jobs")
    early = [m.payload for m in flow.receive(10, timeout=0)]
    assert early == ([] if ordering == "partition" else [b"b2"])
    clock.advance(29.9)
    assert flow.receive(10, timeout=0) == []
    clock.advance(0.2)
    late = flow.receive(10, timeout=0)
    assert [m.payload for m in late] == \
        ([b"a1", b"a2", b"b2"] if ordering == "partition" else [b"a1", b"a2"])
    assert late[0].redelivered and late[0].delivery_count == 2
    flow.ack_many(late)


def test_the_queue_redelivery_delay_grows_with_each_redelivery(broker, clock):
    setup(broker, redelivery_delay=1.0, redelivery_delay_multiplier=3.0,
          redelivery_delay_max=5.0)
    broker.publish("jobs", b"a")
    flow = broker.bind("jobs")
    waits = []
    for _ in range(4):
        m = flow.receive(1)[0]
        flow.nack(m)
        waited = 0.0
        while not (got := flow.receive(1, timeout=0)) and waited < 100:
            clock.advance(0.5)
            waited += 0.5
        assert got
        flow.nack(got[0], delay=0)  # back at once: the next nack is the next redelivery
        waits.append(waited)
    # first nack: 1 s; then 3 s; then 5 s (the max 9 s capped), ... each nack above alternates
    assert waits[0] == pytest.approx(1.0, abs=0.5)
    assert waits[1] == pytest.approx(5.0, abs=0.5)    # third failure: min(1 * 3**2, 5)


def test_an_expired_message_is_never_delivered_and_dies_expired(broker, clock):
    setup(broker)
    broker.publish("jobs", b"short", ttl=10)
    broker.publish("jobs", b"long", ttl=100)
    broker.publish("jobs", b"forever")
    clock.advance(11)
    flow = broker.bind("jobs")
    got = drain(flow)
    assert [m.payload for m in got] == [b"long", b"forever"]
    dead = dead_letters(broker, 1)
    assert [(m.payload, m.headers["dead_reason"]) for m in dead] == [(b"short", "expired")]
    assert counts(broker)["expired"] == 1


def test_max_ttl_bounds_every_message_of_the_queue(broker, clock):
    setup(broker, max_ttl=5)
    broker.publish("jobs", b"a", ttl=100)
    broker.publish("jobs", b"b")
    clock.advance(6)
    with broker.bind("jobs") as flow:
        assert drain(flow) == []
    assert counts(broker)["expired"] == 2


def test_delivery_counts_survive_a_restart(open_broker):
    broker = open_broker()
    setup(broker)
    broker.publish("jobs", b"a")
    flow = broker.bind("jobs", name="w")
    m = flow.receive(1)[0]
    flow.nack(m)
    m = flow.receive(1)[0]
    assert m.delivery_count == 2
    broker.close()                    # a clean close: the delivery in flight counts as lost
    broker = open_broker()
    flow = broker.bind("jobs", name="w")
    m = flow.receive(1)[0]
    assert (m.delivery_count, m.redelivered) == (3, True)


def test_a_clean_restart_counts_only_real_deliveries(open_broker):
    broker = open_broker()
    setup(broker)
    broker.publish_many("jobs", [b"%d" % i for i in range(50)])
    flow = broker.bind("jobs", name="w")
    flow.receive(10)                  # ten delivered, none acked; the mark leased far ahead
    broker.close()
    broker = open_broker()
    flow = broker.bind("jobs", name="w")
    got = drain(flow, batch=100)
    assert [m.delivery_count for m in got] == [2] * 10 + [1] * 40
    assert [m.redelivered for m in got] == [True] * 10 + [False] * 40


def test_bad_lifecycle_settings_get_one_clear_line(broker):
    for bad, text in [({"max_redelivery": -1}, "max_redelivery"),
                      ({"max_redelivery": 1.5}, "max_redelivery"),
                      ({"redelivery_delay": float("nan")}, "redelivery_delay"),
                      ({"redelivery_delay_multiplier": 0.5}, "multiplier"),
                      ({"max_ttl": -1}, "max_ttl"),
                      ({"dead_message_queue": "jobs"}, "its own dead message queue"),
                      ({"dead_message_queue": "not a name"}, "dead_message_queue"),
                      ({"max_depth": -5}, "max_depth"),
                      ({"max_poll_interval": float("inf")}, "max_poll_interval")]:
        with pytest.raises(partq.InvalidConfig, match=text):
            broker.create_queue("jobs", **bad)
    broker.create_queue("jobs")
    with pytest.raises(partq.InvalidConfig, match="ttl"):
        broker.publish("jobs", b"x", ttl=-1)
    with pytest.raises(partq.InvalidConfig, match="ttl"):
        broker.publish_many("jobs", [b"x"], ttl=float("nan"))
    flow = broker.bind("jobs")
    broker.publish("jobs", b"x")
    m = flow.receive(1)[0]
    with pytest.raises(partq.InvalidConfig, match="delay"):
        flow.nack(m, delay=-1)


def test_the_status_counts_dead_messages_by_reason_and_delayed_partitions(open_broker, clock):
    broker = open_broker()
    setup(broker, max_redelivery=1)
    broker.publish("jobs", b"old", ttl=1)
    broker.publish_many("jobs", [b"poison", b"bad", b"later"])
    clock.advance(2)
    flow = broker.bind("jobs")
    poison, bad, later = flow.receive(3)
    flow.reject(bad)
    flow.nack(poison)
    flow.nack(flow.receive(3)[0])            # poison's second failure: dead
    later = flow.receive(3)[0]
    flow.nack(later, delay=30)
    st = broker.queue_status("jobs")
    assert st.dead == {"max_redelivery": 1, "expired": 1, "rejected": 1, "discarded": 0}
    assert st.delayed == 1
    broker.close()
    st = open_broker().queue_status("jobs")   # durable counts survive the restart
    assert st.dead == {"max_redelivery": 1, "expired": 1, "rejected": 1, "discarded": 0}


def test_an_operator_unblocks_a_partition_held_by_a_poison_message(broker):
    setup(broker)
    broker.publish_many("jobs", [b"poison", b"next", b"later"])
    flow = broker.bind("jobs")
    poison = flow.receive(1)[0]
    assert broker.kill_message("jobs", 0, poison.seq) is True
    assert broker.ack_message("jobs", 0, 1) is True           # "next": never delivered now
    assert flow.unacked == 1
    assert [m.payload for m in flow.receive(5)] == [b"later"]
    assert flow.unacked == 1                                  # the killed one left the count
    assert [m.payload for m in dead_letters(broker, 1)] == [b"poison"]


def test_a_queue_nobody_consumes_does_not_keep_its_expired_messages(open_broker, clock):
    broker = open_broker()
    setup(broker)
    broker.create_queue("other")
    broker.publish("jobs", b"short", ttl=5)
    broker.publish("jobs", b"long", ttl=500)
    broker.publish("other", b"no ttl")
    assert broker.sweep_expired() == 0                  # nothing expired yet
    clock.advance(6)
    assert broker.sweep_expired() == 1
    assert broker.queue_status("jobs").depth == 1 and counts(broker)["expired"] == 1
    assert broker.sweep_expired() == 0                  # once
    with broker.bind("jobs") as flow:                   # a consumer that comes later
        assert [m.payload for m in drain(flow)] == [b"long"]
    assert [m.payload for m in dead_letters(broker, 1)] == [b"short"]


def test_the_sweep_of_a_delivered_queue_reaches_its_consumers(broker, clock):
    setup(broker, max_ttl=10)
    flow = broker.bind("jobs")
    broker.publish_many("jobs", [b"a", b"b"])
    clock.advance(11)
    assert broker.sweep_expired() == 2                  # this process delivers the queue
    assert flow.receive(5) == [] and flow.unacked == 0
    assert counts(broker)["expired"] == 2


def test_the_sweep_leaves_what_a_consumer_may_hold_to_delivery(broker, clock):
    setup(broker, max_ttl=10)
    flow = broker.bind("jobs")
    broker.publish("jobs", b"held")
    (held,) = flow.receive(5)
    clock.advance(11)
    assert broker.sweep_expired() == 0                  # in a consumer's hands: not killed
    flow.ack(held)                                      # ... so its ack is the end of it
    assert counts(broker)["expired"] == 0


def test_by_default_a_nack_without_a_delay_waits_a_small_growing_delay(broker, clock):
    """A consumer that nacks every delivery at once does not spin: with the queue's defaults its
    message comes back after 0.1 s, then 0.2, 0.4 ... (and nothing is dropped: the default
    max_redelivery redelivers for ever)."""
    broker.create_queue("jobs", partitions=1, rebalance_delay=0)
    broker.publish("jobs", b"a")
    flow = broker.bind("jobs")
    waits = []
    for _ in range(5):
        m = flow.receive(1)[0]
        flow.nack(m)
        assert flow.receive(1, timeout=0) == []      # not at once
        waited = 0.0
        while not (got := flow.receive(1, timeout=0)) and waited < 100:
            clock.advance(0.05)
            waited += 0.05
        flow.nack(got[0], delay=0)
        waits.append(round(waited, 2))
    assert waits[0] == pytest.approx(0.1, abs=0.06)
    assert waits == sorted(waits) and waits[-1] >= 1.5      # 0.1, 0.4, 1.6 ... it grows
