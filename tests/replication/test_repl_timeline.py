"""Issue 16, point 6: a primary restored from a file backup starts a new timeline, and a standby
that applied commits the restored primary never had is refused (and says to re-snapshot)
instead of resuming by LSN; a standby that is behind the restored primary follows it."""
from __future__ import annotations

import shutil

import pytest
from helpers import wait_until
from repl_helpers import compare_stores, free_port, snapshot_queues
from sec_helpers import TOKEN, fill, primary, wait_caught_up

import partq
from partq.replication.timeline import read_history


def _standby(path, address) -> partq.Broker:
    return partq.Broker.open(path, standby_of=address, replication_token=TOKEN)


def _refused(s: partq.Broker) -> bool:
    return "re-snapshot" in (s.replication_status().last_error or "")


CASES = {
    # a copy of the stopped primary's files; it then served again (a new timeline) and went on
    "cold-backup": (False, 0, "not in this primary's history"),
    # a copy taken while it served: the standby went on on the same timeline
    "hot-backup": (True, 0, "holds commits the primary never had"),
    # ... and the restored copy wrote other commits under the standby's LSNs before serving
    "hot-backup-then-writes": (True, 6, "is not this primary's"),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_standby_ahead_of_a_restored_primary_is_refused(tmp_path, case):
    hot, restored_writes, reason = CASES[case]
    pdir, backup = tmp_path / "primary", tmp_path / "backup"
    address = f"127.0.0.1:{free_port()}"
    p = primary(pdir, replication_listen=address)
    ahead = _standby(tmp_path / "ahead", address)
    behind = _standby(tmp_path / "behind", address)
    try:
        fill(p, 0, 400)
        wait_caught_up(p, 2)
        behind.close()
        if hot:
            backup.mkdir()
            p.store.snapshot(str(backup))                 # a consistent copy of data.mdb
        else:
            p.close()
            shutil.copytree(pdir, backup)                 # the files of the stopped primary
            p = primary(pdir, replication_listen=address)
        fill(p, 400, 400)                                 # commits the backup does not have
        wait_caught_up(p)
        p.close()
        applied = ahead.replication_status().applied_lsn
        shutil.rmtree(pdir)
        shutil.copytree(backup, pdir)                     # restored from the backup
        if restored_writes:                               # other commits under the same LSNs
            with partq.Broker.open(pdir) as restored:
                for i in range(restored_writes):
                    restored.publish_many("q", [(b"restored-%d" % i, "k")] * 10)
        p = primary(pdir, replication_listen=address)
        with p.store.read() as r:
            assert len(read_history(r)) >= 2, "a restarted primary starts a new timeline"
        wait_until(lambda: _refused(ahead), 20, "the standby that is ahead to be refused")
        assert ahead.replication_status().applied_lsn == applied
        assert reason in ahead.replication_status().last_error
        # the standby that is behind follows the restored primary
        behind = _standby(tmp_path / "behind", address)
        fill(p, 10_000, 200)
        wait_until(lambda: any(s.connected and s.acked_lsn >= p.replication_status().head_lsn
                               for s in p.replication_status().standbys), 30,
                   "the standby that was behind to follow")
        assert _refused(ahead) and ahead.replication_status().applied_lsn == applied
    finally:
        ahead.close()
        behind.close()
        p.close()
    before = snapshot_queues(tmp_path / "ahead")
    assert before["q"]["partitions"][0]["head"] > 0
    diffs = compare_stores(pdir, tmp_path / "behind")
    assert not diffs, "\n".join(diffs)
    # re-snapshot: the refused standby's directory moved aside, a new one starts from scratch
    shutil.move(tmp_path / "ahead", tmp_path / "ahead-diverged")
    p = primary(pdir, replication_listen=address)
    again = _standby(tmp_path / "ahead", address)
    try:
        wait_caught_up(p)
    finally:
        again.close()
        p.close()
    assert snapshot_queues(tmp_path / "ahead-diverged") == before, "the refused data changed"
    diffs = compare_stores(pdir, tmp_path / "ahead")
    assert not diffs, "\n".join(diffs)
