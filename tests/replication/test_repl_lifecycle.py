"""The message lifecycle reaches a DR-standby through the change log (rules `delivery-count`,
`dead-messages`, `quota`): after a failover a message's delivery count goes on from where the
primary left it, dead messages are in the dead message queue once, the counts are kept, and a
nack's delay still holds its message (rule `retry-delay`)."""
from __future__ import annotations

import pytest
from helpers import wait_until

import partq


@pytest.mark.timeout(60)
def test_delivery_counts_dead_messages_and_counts_survive_a_failover(tmp_path):
    p = partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0")
    s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address)
    try:
        p.create_queue("dmq")
        p.create_queue("q", max_redelivery=2, dead_message_queue="dmq", rebalance_delay=0,
                       redelivery_delay=0,
                       max_depth=4, reject_msg_to_sender=False)
        p.publish_many("q", [(b"poison", "a"), (b"retry", "b"), (b"bad", "c")])
        flow = p.bind("q", name="svc")
        for _ in range(3):                       # poison: three deliveries, then dead
            flow.nack(flow.receive(1)[0])
        retry, bad = flow.receive(2)
        flow.reject(bad)
        flow.nack(retry)
        assert flow.receive(1)[0].delivery_count == 2          # retry's second delivery
        p.publish_many("q", [b"x"] * 5)          # over max_depth: discarded, counted
        p.create_queue("later", rebalance_delay=0)
        p.publish("later", b"in an hour")
        waiting = p.bind("later", name="svc")
        waiting.nack(waiting.receive(1)[0], delay=3600)   # the delay is in the change log too
        head = p.replication_status().head_lsn
        wait_until(lambda: s.replication_status().applied_lsn >= head, 30,
                   "the standby to catch up")
    finally:
        s.close()
    # the standby takes over while the primary still runs (as if it were cut off): nothing the
    # primary does from now on reaches it
    with partq.Broker.open(tmp_path / "standby") as b:
        b.promote()
        st = b.queue_status("q")
        assert st.dead == {"max_redelivery": 1, "expired": 0, "rejected": 1, "discarded": 0}
        assert st.quota_discarded == 5
        flow = b.bind("q", name="svc")
        (again,) = flow.receive(5)
        # delivered twice on the primary, the second delivery lost with it: the third now
        assert (again.payload, again.delivery_count, again.redelivered) == (b"retry", 3, True)
        flow.ack(again)
        assert b.bind("later", name="svc").receive(1, timeout=0.2) == []    # an hour to go
        dead = b.bind("dmq")
        got = dead.receive(10)
        assert sorted((m.payload, m.headers["dead_reason"]) for m in got) == \
            [(b"bad", "rejected"), (b"poison", "max_redelivery")]
    p.close()
