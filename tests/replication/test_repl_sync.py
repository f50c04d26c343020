"""Sync mode's gate (rule `replication`): a publish returns only after the standby acked its commit; without a
standby (even one that never connected) it fails with ReplicationTimeout after sync_timeout,
the message stored on the primary (an unknown outcome for the caller) and shipped once the
standby is back."""
from __future__ import annotations

import threading
import time

import pytest
from helpers import wait_until
from repl_helpers import compare_stores, read_json

import partq
from partq.replication import ReplicationTimeout


@pytest.mark.timeout(90)
def test_sync_publish_waits_for_the_standby_and_times_out_without_it(tmp_path, procs):
    primary = partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0",
                                replication_mode="sync", sync_timeout=0.5)
    address = primary.replication_address
    try:
        # a sync primary that never had a standby does not pretend: the commit waits, then fails
        started = time.monotonic()
        with pytest.raises(ReplicationTimeout, match="no DR-standby confirmed"):
            primary.create_queue("q", partitions=2)
        assert time.monotonic() - started >= 0.45
        assert [q.name for q in primary.queues()] == ["q"]     # stored: an unknown outcome
        standby = procs.start("standby1", "proc_standby.py", tmp_path / "standby", address,
                              tmp_path / "s1.json")
        wait_until(lambda: primary.replication_status().connected, 30, "the standby",
                   procs=[standby])
        primary.publish("q", b"one", key="a")
        st = primary.replication_status()
        assert st.applied_lsn >= st.head_lsn, "a sync publish returned before the standby acked"

        # a stalled standby holds publishes until the timeout
        standby.pause()
        started = time.monotonic()
        with pytest.raises(ReplicationTimeout):
            primary.publish("q", b"two", key="a")
        assert time.monotonic() - started >= 0.45
        standby.kill()
        with pytest.raises(ReplicationTimeout):
            primary.publish_many("q", [(b"three", "a"), (b"four", "b")])
        # the outcome was unknown to the caller, but the messages are stored on the primary
        assert primary.queue_status("q").depth == 4
        assert not primary.replication_status().connected

        standby = procs.start("standby2", "proc_standby.py", tmp_path / "standby", address,
                              tmp_path / "s2.json")
        wait_until(lambda: primary.replication_status().connected, 30, "the restarted standby",
                   procs=[standby])
        primary.publish("q", b"five", key="a")
        assert primary.queue_status("q").depth == 5
        st = primary.replication_status()
        assert st.applied_lsn >= st.head_lsn and st.lag_messages == 0
        assert (read_json(tmp_path / "s2.json") or {}).get("role", "standby") == "standby"
        assert standby.stop() == 0
    finally:
        primary.close()
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)


@pytest.mark.timeout(90)
def test_sync_publishes_never_stall_with_a_healthy_standby(tmp_path, procs, caplog):
    primary = partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0",
                                replication_mode="sync", sync_timeout=30.0)
    try:
        standby = procs.start("standby", "proc_standby.py", tmp_path / "standby",
                              primary.replication_address, tmp_path / "s.json")
        wait_until(lambda: primary.replication_status().connected, 30, "the standby",
                   procs=[standby])
        primary.create_queue("q", partitions=8)
        primary.publish("q", b"first")
        latencies: list[float] = []
        deadline = time.monotonic() + 3.0

        def publisher(n: int) -> None:
            i = 0
            while time.monotonic() < deadline:
                started = time.monotonic()
                primary.publish("q", b"x" * 256, key=f"{n}-{i}")
                latencies.append(time.monotonic() - started)
                i += 1

        threads = [threading.Thread(target=publisher, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        standby.check_alive()
    finally:
        primary.close()
    ended = [r.getMessage() for r in caplog.records if "ended" in r.getMessage()]
    assert max(latencies) < 2.0, (f"slowest sync publish took {max(latencies):.2f} s "
                                  f"({len(latencies)} publishes); links ended: {ended}")
    assert not ended, ended
