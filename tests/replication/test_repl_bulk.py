"""Rule `replication` end to end: 100k messages published on a real primary while a real standby process is
SIGKILLed and restarted twice at random moments; once it caught up, both directories hold the
same data, byte for byte (records, heads, ack state, configs, assignment state blobs)."""
from __future__ import annotations

import os
import random
import time

import msgpack
import pytest
from helpers import wait_until
from repl_helpers import (
    compare_stores,
    free_port,
    meta_of,
    payload,
    read_json,
    read_log,
    snapshot_queues,
    stored_payloads,
    u64,
)

from partq.storage.txn import queue_meta_key

COUNT = 100_000
SEED = int(os.environ.get("PARTQ_REPL_SEED", "20240527"))


@pytest.mark.timeout(300)
def test_100k_messages_standby_killed_twice_ends_identical(tmp_path, procs):
    rng = random.Random(SEED)
    pdir, sdir = tmp_path / "primary", tmp_path / "standby"
    address = f"127.0.0.1:{free_port()}"
    primary = procs.start("primary", "proc_primary_bulk.py", pdir, address, COUNT, tmp_path, SEED)
    progress = lambda: (read_json(tmp_path / "progress.json") or {}).get("published", 0)

    incarnation = [0]
    applied_seen: list[int] = []

    def start_standby():
        incarnation[0] += 1
        status = tmp_path / f"standby{incarnation[0]}.json"
        return procs.start(f"standby{incarnation[0]}", "proc_standby.py", sdir, address, status), status

    def sample(status_path):
        st = read_json(status_path)
        if st is not None and (not applied_seen or applied_seen[-1] != st["applied_lsn"]):
            applied_seen.append(st["applied_lsn"])
        return st

    # the standby joins once the primary holds data: it starts from a snapshot
    wait_until(lambda: progress() >= COUNT * 0.03, 60, "the first 3% published", procs=[primary])
    standby, status = start_standby()
    kills = []
    for frac in (rng.uniform(0.1, 0.45), rng.uniform(0.55, 0.9)):
        wait_until(lambda status=status, frac=frac: (sample(status), progress() >= frac * COUNT
                                                     or read_json(tmp_path / "done.json"))[1],
                   120, f"{frac:.0%} published", procs=[primary, standby])
        standby.kill()
        kills.append(progress())
        time.sleep(rng.uniform(0.0, 0.5))     # down for a random while as the primary goes on
        standby, status = start_standby()

    done = wait_until(lambda: (sample(status), read_json(tmp_path / "done.json"))[1], 180,
                      "the primary to publish everything", procs=[primary, standby])
    assert done["published"] == COUNT

    def caught_up():
        # the primary's head as it reports it now: its settling is a pause of 2 s without a
        # commit, and a late delivery-state write after it is rare but allowed (late.json)
        st, pst = sample(status), read_json(tmp_path / "status.json")
        return (st is not None and pst is not None and st["connected"]
                and st["applied_lsn"] >= pst["head_lsn"] >= done["head_lsn"]
                and pst["lag_messages"] == 0)
    wait_until(caught_up, 60, f"standby applied_lsn to reach the primary's head {done['head_lsn']}",
               procs=[primary, standby])
    assert standby.stop() == 0, standby.tail()
    assert primary.stop() == 0, primary.tail()
    # a commit after the primary settled may only store delivery state (the assignment blob and
    # the move counts written with it); anything else is named here
    late = read_json(tmp_path / "late.json") or []
    assert {c[0] for entry in late for c in entry["changes"]} <= {"put_state", "queue_meta"}, late

    # applied_lsn never went backwards, across two SIGKILLs
    assert applied_seen == sorted(applied_seen), applied_seen
    pmeta, smeta = meta_of(pdir), meta_of(sdir)
    assert u64(smeta[b"applied_lsn"]) == u64(pmeta[b"lsn"]) >= done["head_lsn"]
    assert b"role" in smeta and b"slots" not in smeta

    diffs = compare_stores(pdir, sdir)
    assert not diffs, "standby differs from primary:\n" + "\n".join(diffs)

    # and what they both hold is right: every message the primary said it stored is there with
    # its payload, unless a consumer acked it
    queues = snapshot_queues(sdir)
    stored = stored_payloads(sdir)
    log = read_log(tmp_path / "log")
    assert len(log) == COUNT and sorted(i for i, *_ in log) == list(range(COUNT))
    acked = dropped = 0
    for idx, queue, p, seq in log:
        part = queues[queue]["partitions"].get(p)
        if part is None:          # partition 2 of "events" was removed with its messages (rule `scaling`)
            dropped += 1
            continue
        if seq < part["floor"] or seq in part["above"]:
            acked += 1
            continue
        assert stored.get((queue, p, seq)) == payload(idx), (idx, queue, p, seq)
    unacked = sum(p["head"] - p["floor"] - len(p["above"])
                  for q in queues.values() for p in q["partitions"].values())
    assert acked + unacked + dropped == COUNT
    # the run exercised what it claims to: acks with gaps, both queues, the scaled-up queue (how
    # many the consumer acks depends on its speed beside the publisher's: a tenth at least)
    assert acked > COUNT // 10, acked
    assert queues["events"]["config"]["partitions"] == 2          # scaled 2 -> 3 -> 2
    assert queues["orders"]["config"]["max_handoff_time"] == 1.5
    assert "tmp" not in queues
    key = queue_meta_key(queues["orders"]["config"]["qid"], b"checkpoint/copy")
    assert key in smeta and smeta[key] == pmeta[key]
    state = msgpack.unpackb(queues["orders"]["state"], raw=False)
    assert {f[1] for f in state["core"]["flows"]} >= {"c1", "c2", "c3"}, state
    print(f"killed the standby at {kills} published; acked {acked}; dropped by scaling {dropped}; "
          f"{len(set(applied_seen))} distinct applied LSNs observed; head {done['head_lsn']}")
