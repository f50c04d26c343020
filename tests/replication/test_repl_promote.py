"""Rule `replication`, promote: after the primary is SIGKILLed, the promoted standby takes publishes and
binds, and consumers that rebind by name (rule `named-flows`) or by hint (rule `bind-hint`) within the
rebalance delay get the partitions they held on the primary, with their unacked messages redelivered."""
from __future__ import annotations

import time

import pytest
from helpers import drain, wait_until
from repl_helpers import compare_stores, free_port, key, payload, read_json

import partq


def _start_primary(tmp_path, procs):
    address = f"127.0.0.1:{free_port()}"
    primary = procs.start("primary", "proc_primary_named.py", tmp_path / "primary", address, tmp_path)
    return primary, address


def _both_killed_after_catch_up(tmp_path, procs) -> dict:
    """A primary with named consumers and a standby in its own process; once the standby has
    everything, both are SIGKILLed. Returns the primary's ready.json (assignment, head LSN)."""
    primary, address = _start_primary(tmp_path, procs)
    standby = procs.start("standby", "proc_standby.py", tmp_path / "standby", address,
                          tmp_path / "standby.json")
    ready = wait_until(lambda: read_json(tmp_path / "ready.json"), 60, "the primary's setup",
                       procs=[primary, standby])
    wait_until(lambda: (read_json(tmp_path / "standby.json") or {}).get("applied_lsn", -1)
               >= ready["head_lsn"], 30, "the standby to catch up", procs=[standby])
    primary.kill()
    standby.kill()
    return ready


def _check_promoted(b: partq.Broker, ready: dict) -> None:
    assert b.replication_status().role == "primary"
    assignment = ready["assignment"]
    # consumers come back by name, and the unnamed one with its hint: nothing moves
    started = time.monotonic()
    flows = {name: b.bind("orders", name=name) for name in ("a", "b", "c")}
    flows["hint"] = b.bind("orders", hint=assignment["hint"])
    assert time.monotonic() - started < 10, "rebinds must happen well within the 20 s delay"
    got = {name: sorted(f.partitions) for name, f in flows.items()}
    assert got == assignment
    status = b.queue_status("orders")
    assert [p.next_seq for p in status.partitions] == ready["heads"]
    assert [p.ack_floor for p in status.partitions] == ready["floors"]
    assert [p.depth for p in status.partitions] == ready["depths"]
    assert {p.flow_name for p in status.partitions} == {"a", "b", "c", None}

    # publishing works and continues each partition's sequence
    r = b.publish("orders", payload(10_000), key=key(10_000))
    assert r.seq == ready["heads"][r.partition]
    many = b.publish_many("orders", [(payload(i), key(i)) for i in range(10_001, 10_101)])
    assert len(many) == 100

    # each flow gets its partitions' unacked messages (delivered on the old primary: marked
    # redelivered), in order, then the new ones
    owner = {p: name for name, parts in assignment.items() for p in parts}
    new = [res.partition for res in [r, *many]]
    total = 0
    for name, flow in flows.items():
        # drained until all of its partitions' messages came (not until a pause, which load
        # can make), then until a pause, which shows no more come
        expected = sum(ready["depths"][p] + new.count(p) for p in assignment[name])
        seen: dict[int, list[int]] = {}
        for m in drain(flow, batch=1000, timeout=0.2, at_least=expected):
            assert owner[m.partition] == name
            seen.setdefault(m.partition, []).append(m.seq)
            if m.seq < ready["heads"][m.partition]:
                assert m.redelivered, m
            total += 1
        for seqs in seen.values():
            assert seqs == sorted(seqs)
    assert total == sum(ready["depths"]) + 101
    assert b.queue_status("orders").depth == 0
    # a new consumer binds too (a standby consumer or a rebalance: either way it is accepted)
    b.bind("orders", name="newcomer")


@pytest.mark.timeout(120)
def test_promote_live_standby_after_primary_killed(tmp_path, procs):
    primary, address = _start_primary(tmp_path, procs)
    standby = partq.Broker.open(tmp_path / "standby", standby_of=address)
    try:
        ready = wait_until(lambda: read_json(tmp_path / "ready.json"), 60, "the primary's setup",
                           procs=[primary])
        wait_until(lambda: standby.replication_status().applied_lsn >= ready["head_lsn"], 30,
                   "the standby to catch up")
        primary.kill()
        wait_until(lambda: not standby.replication_status().connected, 10,
                   "the standby to notice the primary is gone")
        with pytest.raises(partq.StandbyReadOnly):
            standby.bind("orders", name="a")
        standby.promote()
        assert standby.replication_status().role == "primary"
        _check_promoted(standby, ready)
    finally:
        standby.close()


@pytest.mark.timeout(120)
def test_promote_reopened_standby_after_both_killed(tmp_path, procs):
    ready = _both_killed_after_catch_up(tmp_path, procs)
    with partq.Broker.open(tmp_path / "standby") as b:
        with pytest.raises(partq.StandbyReadOnly):
            b.bind("orders", name="a")
        b.promote()
    # promotion is durable: reopened, it is a primary, and consumers still keep their partitions
    with partq.Broker.open(tmp_path / "standby") as b:
        _check_promoted(b, ready)


@pytest.mark.timeout(120)
def test_promoted_standby_serves_a_new_standby(tmp_path, procs):
    """After a failover, the promoted broker becomes the primary of a new standby (reopened with
    replication_listen), which ends identical to it."""
    _both_killed_after_catch_up(tmp_path, procs)
    with partq.Broker.open(tmp_path / "standby") as b:
        b.promote()
    new_address = f"127.0.0.1:{free_port()}"
    b = partq.Broker.open(tmp_path / "standby", replication_listen=new_address)
    try:
        b.publish_many("orders", [(payload(i), key(i)) for i in range(20_000, 20_300)])
        follower = procs.start("standby2", "proc_standby.py", tmp_path / "standby2", new_address,
                               tmp_path / "standby2.json")
        wait_until(lambda: b.replication_status().standbys, 30, "the new standby's hello",
                   procs=[follower])
        # a commit after the slot exists: an LSN > 0 that only a standby holding the snapshot acks
        b.publish_many("orders", [(payload(i), key(i)) for i in range(20_300, 20_600)])
        head = b.replication_status().head_lsn
        assert head > 0
        wait_until(lambda: b.replication_status().applied_lsn >= head
                   and b.replication_status().connected, 30, "the new standby to catch up",
                   procs=[follower])
        assert follower.stop() == 0
    finally:
        b.close()
    diffs = compare_stores(tmp_path / "standby", tmp_path / "standby2")
    assert not diffs, "\n".join(diffs)


@pytest.mark.timeout(120)
def test_second_standby_follows_promoted_standby(tmp_path, procs):
    """Two DR-standbys A and B of one primary P take their snapshot while P is idle. B goes down;
    P takes 500 messages, which A applies; P is lost; A is promoted and serves B again. B must
    end identical to A (by a snapshot or by the change stream), not resume as if it had A's
    history."""
    pdir, adir, bdir = tmp_path / "P", tmp_path / "A", tmp_path / "B"
    p = partq.Broker.open(pdir, replication_listen="127.0.0.1:0")
    try:
        p.create_queue("q", partitions=2)
        p.publish_many("q", [(payload(i), key(i)) for i in range(100)])
        a = procs.start("A", "proc_standby.py", adir, p.replication_address, tmp_path / "A.json")
        b = procs.start("B", "proc_standby.py", bdir, p.replication_address, tmp_path / "B.json")
        for s in (a, b):
            wait_until(lambda s=s: "loaded a" in s.tail(), 30, f"{s.name}'s snapshot", procs=[s])
        wait_until(lambda: sum(link.connected for link in p.replication_status().standbys) == 2,
                   10, "both standbys linked")
        b.kill()
        p.publish_many("q", [(payload(i), key(i)) for i in range(100, 600)])
        head = p.replication_status().head_lsn
        wait_until(lambda: (read_json(tmp_path / "A.json") or {}).get("applied_lsn", -1) >= head,
                   30, "A to apply P's messages", procs=[a])
    finally:
        p.close()
    a.kill()
    with partq.Broker.open(adir) as promoted:
        promoted.promote()
    promoted = partq.Broker.open(adir, replication_listen="127.0.0.1:0")
    try:
        b = procs.start("B2", "proc_standby.py", bdir, promoted.replication_address,
                        tmp_path / "B2.json")

        def b_caught_up():
            st = promoted.replication_status()
            return st.standbys and st.connected and st.applied_lsn >= st.head_lsn
        wait_until(b_caught_up, 30, "B to catch up with A", procs=[b])
        head = promoted.replication_status().head_lsn

        def b_says_caught_up():                 # and B itself reports it, linked to A
            st = read_json(tmp_path / "B2.json") or {}
            return st.get("connected") and st.get("applied_lsn", -1) >= head
        wait_until(b_says_caught_up, 30, "B to report that it caught up with A", procs=[b])
        assert b.stop() == 0
    finally:
        promoted.close()
    diffs = compare_stores(adir, bdir)
    assert not diffs, "B resumed against the promoted A but differs:\n" + "\n".join(diffs)
