"""The snapshot a new standby starts from: installing it must be invisible to readers of the
standby and must survive a crash at any point."""
from __future__ import annotations

import threading

import pytest
from helpers import wait_until
from repl_helpers import compare_stores, key, payload, read_json

import partq


def _primary_with_data(path) -> partq.Broker:
    p = partq.Broker.open(path, replication_listen="127.0.0.1:0")
    p.create_queue("q", partitions=4)
    for i in range(10):
        p.publish_many("q", [(payload(j), key(j)) for j in range(i * 500, i * 500 + 500)])
    return p


@pytest.mark.timeout(60)
def test_standby_readable_while_snapshot_installs(tmp_path):
    p = _primary_with_data(tmp_path / "primary")
    errors: list[str] = []
    try:
        for attempt in range(3):
            s = partq.Broker.open(tmp_path / f"standby{attempt}", standby_of=p.replication_address)
            stop = threading.Event()

            def poll(s=s, stop=stop):
                while not stop.is_set():
                    try:
                        s.replication_status()
                        s.queues()
                    except partq.PartqError as exc:
                        errors.append(repr(exc))
                        return

            t = threading.Thread(target=poll)
            t.start()
            try:
                wait_until(lambda s=s: s.replication_status().applied_lsn
                           >= p.replication_status().head_lsn and s.queues(), 30, "the snapshot")
            except partq.BrokerClosed as exc:
                errors.append(repr(exc))
            finally:
                stop.set()
                t.join()
                s.close()
            if errors:
                break
    finally:
        p.close()
    assert not errors, errors


@pytest.mark.timeout(60)
def test_standby_crash_inside_snapshot_install_recovers(tmp_path, procs):
    p = _primary_with_data(tmp_path / "primary")
    address = p.replication_address
    try:
        s = procs.start("standby1", "proc_standby.py", tmp_path / "standby", address,
                        tmp_path / "s1.json", "crash-after-snapshot-replace")
        wait_until(lambda: not s.alive(), 30, "the crash point")
        assert s.popen.returncode == 137, s.tail()
        s = procs.start("standby2", "proc_standby.py", tmp_path / "standby", address,
                        tmp_path / "s2.json")
        wait_until(lambda: (read_json(tmp_path / "s2.json") or {}).get("connected"), 30,
                   "the restarted standby to follow", procs=[s])
        p.publish_many("q", [(payload(j), key(j)) for j in range(9000, 9100)])
        head = p.replication_status().head_lsn
        wait_until(lambda: p.replication_status().applied_lsn >= head, 30, "catch up", procs=[s])
        assert s.stop() == 0
    finally:
        p.close()
    with partq.Broker.open(tmp_path / "standby") as b:
        assert b.replication_status().role == "standby"
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)


@pytest.mark.timeout(60)
def test_primary_reports_caught_up_only_when_the_standby_has_the_data(tmp_path, procs):
    p = partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0")
    try:
        p.create_queue("q", partitions=4)
        for i in range(40):
            p.publish_many("q", [(payload(j), key(j)) for j in range(i * 1000, i * 1000 + 1000)])
        s = procs.start("standby", "proc_standby.py", tmp_path / "standby", p.replication_address,
                        tmp_path / "s.json")

        def caught_up():
            st = p.replication_status()
            return st.connected and st.applied_lsn >= st.head_lsn and st.lag_messages == 0
        wait_until(caught_up, 30, "the primary to report the standby caught up", interval=0.001,
                   procs=[s])
        s.kill()     # acked means durable on the standby: what it reported must be there
    finally:
        p.close()
    with partq.Broker.open(tmp_path / "standby") as b:
        assert [q.name for q in b.queues()] == ["q"]
        assert b.queue_status("q").depth == 40_000
