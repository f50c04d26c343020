"""A message two processes delivered is marked redelivered the second time (the Message
contract: never a false negative), even when the second process read the partition before the
first one's delivered mark was written (found by the crash harness with concurrent consumer
processes: a follower whose assignment read was older than the owner's move delivered the
same messages as the owner, both unmarked)."""
from __future__ import annotations

import partq


def test_a_mark_written_by_another_process_since_the_read_flags_those_messages(tmp_path):
    with partq.Broker.open(tmp_path / "d", auto_tick=False) as broker:
        broker.create_queue("q", partitions=1, rebalance_delay=0.0)
        broker.publish_many("q", [(b"m%d" % i, None) for i in range(10)])
        flow = broker.bind("q", name="a")
        first = flow.receive(2)
        assert [(m.seq, m.redelivered) for m in first] == [(0, False), (1, False)]
        broker.publish_many("q", [(b"m%d" % i, None) for i in range(10, 110)])
        qid = broker.queue_config("q").qid
        # what a follower of another process writes when it delivers seqs up to 50 of this
        # partition: its delivered mark, committed after this process last read the partition
        broker.store.write(lambda w: w.set_delivered_mark(qid, 0, 50))
        got = flow.receive(200)
        assert [m.seq for m in got] == list(range(2, 110))
        assert all(m.redelivered for m in got if m.seq <= 50), "a second delivery went unmarked"
        assert not any(m.redelivered for m in got if m.seq > 50)
