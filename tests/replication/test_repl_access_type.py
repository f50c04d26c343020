"""A change of access type reaches a DR-standby as the primary made it: partitions removed with
their messages, the parent queue's log kept, and the queue still usable after a promote."""
from __future__ import annotations

import pytest
from helpers import wait_until
from repl_helpers import compare_stores

import partq


@pytest.mark.timeout(60)
def test_access_type_changes_replicate_byte_for_byte(tmp_path):
    p = partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0")
    s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address)
    try:
        p.create_queue("q", partitions=3)
        p.publish_many("q", [(b"a%d" % i, f"k{i}") for i in range(300)])
        p.update_queue("q", access_type="exclusive")
        p.publish_many("q", [(b"b%d" % i, f"k{i}") for i in range(50)])
        flow = p.bind("q")
        flow.ack_many(flow.receive(20))
        p.update_queue("q", access_type="non-exclusive")      # 30 stranded in the parent log
        p.publish_many("q", [(b"c%d" % i, f"k{i}") for i in range(40)])
        head = p.replication_status().head_lsn
        wait_until(lambda: s.replication_status().applied_lsn >= head, 30, "the standby to catch up")
    finally:
        s.close()
        p.close()
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)
    with partq.Broker.open(tmp_path / "standby") as b:
        b.promote()
        st = b.queue_status("q")
        assert (st.access_type, st.partition_count, st.depth, st.parent_depth) == \
            ("non-exclusive", 3, 40, 30)
