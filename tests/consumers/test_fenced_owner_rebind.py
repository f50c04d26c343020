"""A process whose delivery of a queue was taken over while it was stopped learns it from the
next call of one of its flows (``FlowClosed``: bind again); binding again at once, under the
same flow name, must work, even before the process's ticker noticed and stepped down (found by
CI: the rebind raised "a flow named 'old' is already bound", because the closed flow was still
in the fenced runtime)."""
from __future__ import annotations

import pytest

import partq
from partq.delivery import owner


def test_a_flow_closed_by_a_takeover_can_bind_again_at_once_under_its_name(tmp_path):
    with partq.Broker.open(tmp_path / "d", auto_tick=False) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0.0)
        broker.publish_many("q", [(b"m%d" % i, None) for i in range(4)])
        flow = broker.bind("q", name="old")
        first = {(m.partition, m.seq) for m in flow.receive(10, timeout=5)}
        assert len(first) == 4
        qid = broker.queue_config("q").qid
        # what a process that took the delivery over writes first: its own claim
        broker.store.write(owner.claim(qid, b"another process"))
        with pytest.raises(partq.FlowClosed, match="took delivery over"):
            flow.receive(10, timeout=0)
        again = broker.bind("q", name="old")        # no tick ran in between
        assert sorted(again.partitions) == [0, 1]
        got = again.receive(10, timeout=5)
        assert {(m.partition, m.seq) for m in got} == first and all(m.redelivered for m in got)
