"""Helpers of the examples replayed through the Broker (tests/broker is on sys.path through
pytest's ``pythonpath``): who holds what, the keys of the handoff example and its setup."""
from __future__ import annotations

from broker_helpers import DELAY, HANDOFF

import partq


def owners(broker: partq.Broker, queue: str) -> list[str | None]:
    return [p.flow for p in broker.queue_status(queue).partitions]


def part_statuses(broker: partq.Broker, queue: str) -> list[str]:
    return [p.status for p in broker.queue_status(queue).partitions]


def pick_key(partition: int, n: int, candidates) -> str:
    for k in candidates:
        if partq.key_partition(k, n) == partition:
            return k
    raise AssertionError(f"no candidate key lands in partition {partition}")


# The handoff example names its keys A and B; "A" hashes to partition 0 of 2, "B" does not hash to 1, so the
# B key is the first of these that does (rule `key-hash`: crc32c(utf8(key)) % 2).
KEY_A = pick_key(0, 2, ["A", "A0", "cust-A", "AA"])
KEY_B = pick_key(1, 2, ["B", "BB", "B0", "cust-B", "B_"])


def seed000_setup(broker, partitioner):
    """Consumer 1 holds both partitions, has received A1..A3 (acked) and B1, B2 (not acked);
    B3 is in partition 1, undelivered."""
    assert partq.key_partition(KEY_A, 2) == 0 and partq.key_partition(KEY_B, 2) == 1
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    c1 = broker.bind("q", name="consumer-1")
    assert c1.partitions == frozenset({0, 1})
    for i in (1, 2, 3):
        assert broker.publish("q", b"A%d" % i, key=KEY_A).partition == 0
    for i in (1, 2, 3):
        assert broker.publish("q", b"B%d" % i, key=KEY_B).partition == 1
    got = []
    while not any(m.payload == b"B2" for m in got):
        batch = c1.receive(1)
        assert batch, "consumer 1 should be able to receive B1 and B2"
        got += batch
    assert b"B3" not in [m.payload for m in got]
    bs = [m for m in got if m.partition == 1]
    assert [m.payload for m in bs] == [b"B1", b"B2"]
    c1.ack_many([m for m in got if m.partition == 0])
    c2 = broker.bind("q", name="consumer-2")
    assert c2.partitions == frozenset()
    st = broker.queue_status("q")
    assert st.rebalance_status == "Holddown"
    assert part_statuses(broker, "q") == ["Ready", "Ready"]
    return c1, c2, bs


def check_p0_untouched(broker, c1, tag):
    """Rule `handoff-isolation`: partition 0 is Ready with consumer 1, and a new A message goes to it."""
    st = broker.queue_status("q")
    assert st.partitions[0].status == "Ready"
    assert st.partitions[0].flow == c1.flow_id
    broker.publish("q", b"A-" + tag, key=KEY_A)
    got = c1.receive(100)
    assert [m.payload for m in got if m.partition == 0][-1:] == [b"A-" + tag]
    assert all(m.partition == 0 for m in got), "nothing of paused partition 1 may reach consumer 1"
    c1.ack_many(got)
