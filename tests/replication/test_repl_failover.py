"""Rule `replication`, failover: SIGKILL a publishing primary at random moments, promote the standby, and
check what a publisher was told against what the promoted standby holds.

* sync mode: nothing whose publish returned is lost;
* async mode: what is lost is bounded by the lag the primary reported just before the kill
  (plus what returned after that report), and the standby is always a consistent prefix.
"""
from __future__ import annotations

import os
import random
import time

import pytest
from helpers import wait_until
from repl_helpers import (
    compare_stores,
    free_port,
    payload,
    read_json,
    read_log,
    snapshot_queues,
    stored_payloads,
)

import partq

SEED = int(os.environ.get("PARTQ_REPL_SEED", "20240527"))


def _run_round(tmp_path, procs, mode: str, rng: random.Random, n: int):
    """Start a primary in ``mode`` and a standby, let the primary publish for a random while,
    SIGKILL it, then SIGKILL the standby. In odd rounds the standby is stalled (SIGSTOP) a
    moment before the primary dies. Returns the round's paths and whether it stalled."""
    work = tmp_path / f"{mode}{n}"
    work.mkdir()
    pdir, sdir = work / "primary", work / "standby"
    address = f"127.0.0.1:{free_port()}"
    primary = procs.start(f"{mode}-primary{n}", "proc_primary_loop.py", pdir, address, mode, work,
                          SEED + n, *(("4", "1", "10") if mode == "sync" else ("8", "0", "200")))
    standby = procs.start(f"{mode}-standby{n}", "proc_standby.py", sdir, address,
                          work / "standby.json")
    wait_until(lambda: read_json(work / "ready.json"), 60, "the primary to see its standby",
               procs=[primary, standby])
    wait_until(lambda: len(read_log(work / "log")) > 0, 30, "a first publish", procs=[primary])
    time.sleep(rng.uniform(0.2, 1.2))   # publishing for a random while: the kill's moment matters
    stalled = n % 2 == 1
    if stalled:
        # the standby stalls (SIGSTOP) while the primary goes on: in async mode publishes keep
        # returning and the lag grows; in sync mode they must not return
        standby.pause()
        time.sleep(rng.uniform(0.05, 0.3))    # stalled for a random while before the kill
    primary.check_alive()
    primary.kill()
    # a random moment to kill the standby too: it may still be applying what it received
    time.sleep(rng.uniform(0.0, 0.2))
    standby.check_alive()
    standby.kill()
    return work, pdir, sdir, stalled


def _promote(sdir) -> None:
    """Open the killed standby's directory in this process: still a standby, then promoted."""
    with partq.Broker.open(sdir) as b:
        assert b.replication_status().role == "standby"
        with pytest.raises(partq.StandbyReadOnly):
            b.publish("q", b"x")
        b.promote()
        assert b.replication_status().role == "primary"


def _check_prefix(pdir, sdir) -> tuple[int, int]:
    """The standby holds, per partition, exactly the primary's first records (a prefix of its
    commits), byte for byte. Returns (messages on the primary, messages on the standby)."""
    qp, qs = snapshot_queues(pdir), snapshot_queues(sdir)
    assert set(qs) == set(qp)
    total_p = total_s = 0
    for name in qp:
        for p, pp in qp[name]["partitions"].items():
            sp = qs[name]["partitions"][p]
            assert sp["head"] <= pp["head"], (name, p)
            assert sp["records"] == pp["records"][:len(sp["records"])], (name, p)
            assert [s for s, _ in sp["records"]] == list(range(sp["head"])), (name, p)
            total_p += pp["head"]
            total_s += sp["head"]
    return total_p, total_s


@pytest.mark.timeout(180)
def test_sync_mode_loses_nothing_that_returned(tmp_path, procs):
    rng = random.Random(SEED)
    for n in range(4):
        work, pdir, sdir, stalled = _run_round(tmp_path, procs, "sync", rng, n)
        log = read_log(work / "log")
        assert log, "nothing was published"
        _promote(sdir)
        stored = stored_payloads(sdir)
        missing = [(idx, q, p, seq) for idx, q, p, seq in log if (q, p, seq) not in stored]
        assert not missing, (f"round {n}: {len(missing)} of {len(log)} messages whose sync publish "
                             f"returned are missing on the promoted standby: {missing[:5]}")
        wrong = [(idx, q, p, seq) for idx, q, p, seq in log if stored[(q, p, seq)] != payload(idx)]
        assert not wrong, f"round {n}: wrong payloads at {wrong[:5]}"
        on_primary, on_standby = _check_prefix(pdir, sdir)
        assert on_standby >= len(log)
        status = read_json(work / "status.json") or {}
        assert status.get("timeouts", 0) == 0, status


@pytest.mark.timeout(180)
def test_async_mode_loss_is_bounded_by_reported_lag(tmp_path, procs):
    rng = random.Random(SEED + 1)
    report = []
    for n in range(4):
        work, pdir, sdir, stalled = _run_round(tmp_path, procs, "async", rng, n)
        log = read_log(work / "log")
        assert log, "nothing was published"
        last = read_json(work / "status.json")          # the primary's last report before the kill
        standby_last = read_json(work / "standby.json")  # and the standby's
        assert last is not None and standby_last is not None
        _promote(sdir)
        stored = stored_payloads(sdir)
        on_primary, on_standby = _check_prefix(pdir, sdir)
        lost = [(idx, q, p, seq) for idx, q, p, seq in log if (q, p, seq) not in stored]
        assert all(stored[(q, p, seq)] == payload(idx) for idx, q, p, seq in log
                   if (q, p, seq) in stored)
        # Honest bound: at the report the standby had acked (durably) every commit up to its
        # acked LSN; lag_messages counts the messages committed after it. Everything committed
        # after the report returned after it, so its log index is >= the count read before it.
        returned_after = len(log) - last["returned"]
        bound = last["lag_messages"] + returned_after
        assert len(lost) <= bound, (f"round {n}: lost {len(lost)} > reported lag "
                                    f"{last['lag_messages']} + {returned_after} returned after it")
        # messages committed on the primary but not on the standby
        assert on_primary - on_standby >= len(lost)
        report.append(dict(round=n, stalled=stalled, published=len(log), lost=len(lost),
                           primary_lag=last["lag_messages"], returned_after_report=returned_after,
                           standby_reported_lag=standby_last["lag_messages"],
                           committed_not_replicated=on_primary - on_standby))
    print(report)


@pytest.mark.timeout(120)
def test_primary_killed_and_restarted_standby_resumes(tmp_path, procs):
    """The primary dies (SIGKILL) twice while publishing and comes back on the same directory
    and port; the standby, never restarted, resumes from the change log each time (no new
    snapshot) and ends identical to it, holding every message whose publish returned."""
    rng = random.Random(SEED + 2)
    pdir, sdir = tmp_path / "primary", tmp_path / "standby"
    address = f"127.0.0.1:{free_port()}"
    standby = procs.start("standby", "proc_standby.py", sdir, address, tmp_path / "standby.json")
    for n in range(3):
        threads = "4" if n < 2 else "0"          # the last run only serves
        primary = procs.start(f"primary{n}", "proc_primary_loop.py", pdir, address, "async",
                              tmp_path, SEED + n, threads, "0", "50")
        wait_until(lambda: read_json(tmp_path / "ready.json"), 60, "the standby caught up",
                   procs=[primary, standby])
        if n < 2:
            time.sleep(rng.uniform(0.3, 1.0))   # publishing for a random while, then killed
            primary.kill()
            (tmp_path / "ready.json").unlink()
    assert standby.stop() == 0
    primary.kill()                            # idle: everything it wrote is committed
    assert standby.tail().count("loaded a") == 1, standby.tail()
    diffs = compare_stores(pdir, sdir)
    assert not diffs, "\n".join(diffs)
    log = read_log(tmp_path / "log")
    stored = stored_payloads(sdir)
    assert log and all(stored.get((q, p, seq)) == payload(idx) for idx, q, p, seq in log)
