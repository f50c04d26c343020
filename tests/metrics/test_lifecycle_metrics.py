"""Metrics of the message lifecycle (rules `dead-messages`, `expiry`, `retry-delay`, `quota`),
scraped over real HTTP after real dead-lettering on a broker driven by a ManualClock: a message
nacked past max_redelivery, one rejected, one expired, one rejected in a queue with no dead
message queue, a nack's delay, publishes the quota refused and discarded. The durable counts are
the same after a restart; what a live view shows is checked with ``partq top`` (tests/tools)."""
from __future__ import annotations

import pytest
from metrics_helpers import scrape

import partq
from partq.publish.quota import stored_bytes

REASONS = ("max_redelivery", "expired", "rejected")


def _dead(s, queue: str) -> dict[str, float]:
    out = {r: s.value("partq_dead_messages_total", queue=queue, reason=r) for r in REASONS}
    out["discarded"] = s.value("partq_dead_messages_discarded_total", queue=queue)
    return out


def _lifecycle(broker, clock) -> None:
    """The scenario: on "jobs" (dead message queue "dmq", max_redelivery 1) one message dies
    of max_redelivery, one is rejected, one expires; on "nodmq" one is rejected and discarded;
    "capped" (max_depth 2) refuses 3 messages, "bounded" (max_bytes, discarding) discards 1."""
    broker.create_queue("dmq", partitions=1)
    broker.create_queue("jobs", partitions=1, max_redelivery=1, dead_message_queue="dmq",
                        rebalance_delay=0)
    broker.create_queue("nodmq", partitions=1, rebalance_delay=0)
    with broker.bind("jobs") as flow:
        broker.publish("jobs", b"poison")
        for _ in range(2):                       # two deliveries: 1 + max_redelivery
            (m,) = flow.receive(1)
            assert m.payload == b"poison"
            flow.nack(m, delay=0)
        assert flow.receive(1) == []
        broker.publish("jobs", b"bad")
        (m,) = flow.receive(1)
        flow.reject(m)
        broker.publish("jobs", b"short", ttl=1)
        clock.advance(2)
        assert flow.receive(1) == []             # expired: never delivered
    with broker.bind("nodmq") as flow:
        broker.publish("nodmq", b"bad")
        flow.reject(flow.receive(1)[0])

    broker.create_queue("capped", partitions=1, max_depth=2)
    broker.publish_many("capped", [b"a", b"b"])
    for many in ([b"c"], [b"d", b"e"]):          # 3 messages refused
        with pytest.raises(partq.QueueFull):
            broker.publish_many("capped", many)
    broker.create_queue("bounded", partitions=1, max_bytes=300, reject_msg_to_sender=False)
    assert not broker.publish("bounded", b"x" * 100).discarded
    assert broker.publish("bounded", b"y" * 400).discarded


def test_dead_messages_quotas_and_delays_are_scraped_as_they_happened(open_broker, clock):
    broker = open_broker(metrics_listen="127.0.0.1:0")
    broker.create_queue("plain", partitions=2)
    s = scrape(broker.metrics_address)
    assert _dead(s, "plain") == {"max_redelivery": 0, "expired": 0, "rejected": 0, "discarded": 0}
    for name in ("partq_quota_refused_total", "partq_quota_discarded_total",
                 "partq_delayed_partitions", "partq_queue_max_depth", "partq_queue_max_bytes",
                 "partq_queue_stored_bytes"):
        assert s.value(name, queue="plain") == 0, name
    assert "# TYPE partq_dead_messages_total counter" in s.text
    assert "# TYPE partq_delayed_partitions gauge" in s.text

    _lifecycle(broker, clock)
    s = scrape(broker.metrics_address)
    assert _dead(s, "jobs") == {"max_redelivery": 1, "expired": 1, "rejected": 1, "discarded": 0}
    assert _dead(s, "nodmq") == {"max_redelivery": 0, "expired": 0, "rejected": 1, "discarded": 1}
    assert _dead(s, "dmq") == {"max_redelivery": 0, "expired": 0, "rejected": 0, "discarded": 0}
    assert s.value("partq_queue_depth", queue="dmq") == 3       # the dead copies of "jobs"
    assert s.value("partq_queue_depth", queue="jobs") == 0
    assert s.value("partq_quota_refused_total", queue="capped") == 3
    assert s.value("partq_quota_discarded_total", queue="capped") == 0
    assert s.value("partq_quota_refused_total", queue="bounded") == 0
    assert s.value("partq_quota_discarded_total", queue="bounded") == 1
    assert s.value("partq_queue_max_depth", queue="capped") == 2
    assert s.value("partq_queue_max_bytes", queue="capped") == 0
    assert s.value("partq_queue_max_bytes", queue="bounded") == 300
    assert s.value("partq_queue_max_depth", queue="bounded") == 0
    with broker.store.read() as r:     # the counter the quota checks, on the queue with max_bytes
        kept = stored_bytes(r, broker.queue_config("bounded").qid)
    assert 100 < s.value("partq_queue_stored_bytes", queue="bounded") == kept <= 300
    # a queue without max_bytes: its partitions' backlog bytes, no counter, no chunk scan
    assert s.value("partq_queue_stored_bytes", queue="capped") == s.value(
        "partq_partition_backlog_bytes", queue="capped", partition=0) > 0

    # a nack with a delay: the partition waits, counted while it does
    flow = broker.bind("plain", name="w")
    broker.publish_many("plain", [(b"later", "k")])
    (m,) = flow.receive(1)
    flow.nack(m, delay=30)
    assert flow.receive(1) == []
    assert scrape(broker.metrics_address).value("partq_delayed_partitions", queue="plain") == 1
    clock.advance(31)
    assert [x.payload for x in flow.receive(1)] == [b"later"]
    assert scrape(broker.metrics_address).value("partq_delayed_partitions", queue="plain") == 0
    broker.close()

    broker = open_broker(metrics_listen="127.0.0.1:0")       # durable: the same after a restart
    s = scrape(broker.metrics_address)
    assert _dead(s, "jobs") == {"max_redelivery": 1, "expired": 1, "rejected": 1, "discarded": 0}
    assert _dead(s, "nodmq")["discarded"] == 1
    assert s.value("partq_quota_refused_total", queue="capped") == 3
    assert s.value("partq_quota_discarded_total", queue="bounded") == 1
    assert s.value("partq_delayed_partitions", queue="plain") == 0


def test_stuck_partitions_and_the_oldest_unacked_age_are_scraped(open_broker, clock):
    """A message nacked with a delay blocks its partition: counted stuck until it is acked;
    the oldest unacked message's age follows the clock."""
    broker = open_broker(metrics_listen="127.0.0.1:0")
    broker.create_queue("jobs", partitions=2, rebalance_delay=0)
    s = scrape(broker.metrics_address)
    assert (s.value("partq_partitions_stuck", queue="jobs"),
            s.value("partq_oldest_unacked_age_seconds", queue="jobs")) == (0, 0)
    broker.publish("jobs", b"poison", key="k")
    clock.advance(5)
    with broker.bind("jobs") as flow:
        (m,) = flow.receive(1)
        flow.nack(m, delay=60)
        s = scrape(broker.metrics_address)
        assert s.value("partq_partitions_stuck", queue="jobs") == 1
        assert s.value("partq_oldest_unacked_age_seconds", queue="jobs") == pytest.approx(5)
        broker.ack_message("jobs", m.partition, m.seq)
    s = scrape(broker.metrics_address)
    assert (s.value("partq_partitions_stuck", queue="jobs"),
            s.value("partq_oldest_unacked_age_seconds", queue="jobs")) == (0, 0)
