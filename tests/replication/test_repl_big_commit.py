"""Issue 16, point 5: one commit larger than any frame (27 messages of 10 MiB in one
``publish_many``, a 270 MiB change-log entry) replicates, in parts of bounded size, to a standby
in its own process, which then holds it byte for byte."""
from __future__ import annotations

import pytest
from helpers import wait_until
from repl_helpers import compare_stores, read_json
from sec_helpers import TOKEN, primary

from partq.replication.protocol import MAX_FRAME, PART_BYTES

MiB = 1 << 20


@pytest.mark.timeout(300)
def test_a_270_mib_commit_replicates(tmp_path, procs):
    p = primary(tmp_path / "primary", map_size=1 << 30)
    try:
        p.create_queue("big", partitions=3)
        limit = p.queue_config("big").max_message_size
        assert limit >= 10 * MiB
        standby = procs.start("standby", "proc_standby.py", tmp_path / "standby",
                              p.replication_address, tmp_path / "s.json", f"token={TOKEN}")
        wait_until(lambda: p.replication_status().connected, 30, "the standby", procs=[standby])
        items = [(bytes([i]) * (10 * MiB), f"key-{i}") for i in range(27)]
        p.publish_many("big", items)
        del items
        head = p.replication_status().head_lsn
        with p.store.read() as r:
            entry = len(r.change(head))
        assert entry > 270 * MiB > MAX_FRAME and PART_BYTES < MAX_FRAME
        p.publish("big", b"after", key="k")          # and the stream goes on after it
        head = p.replication_status().head_lsn
        wait_until(lambda: (read_json(tmp_path / "s.json") or {}).get("applied_lsn", 0) >= head,
                   240, "the standby to apply the large commit", procs=[standby])
        assert p.queue_status("big").depth == 28
        assert " ended: " not in standby.tail(), standby.tail()   # no link ended on the way
        assert standby.stop() == 0
    finally:
        p.close()
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)
