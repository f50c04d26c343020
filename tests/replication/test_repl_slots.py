"""Issue 16, point 4: replication slots are made only for authenticated standbys, are listed
(`partq dr slots`) and dropped (`partq dr drop-slot`), and are bounded by ``max_slot_keep``: an
absent standby never fills the primary, served or not, and comes back through a snapshot."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import wait_until
from repl_helpers import compare_stores
from sec_helpers import TOKEN, RawStandby, fill, primary, slot_ids, wait_caught_up

import partq
from partq.replication import drop_slot, list_slots
from partq.replication.slots import change_log_bytes

PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")
MiB = 1 << 20


def partq_cli(*args, data):
    return subprocess.run([PARTQ, "--data", str(data), *args], capture_output=True, text=True,
                          timeout=60)


def _log_bytes(broker: partq.Broker) -> int:
    with broker.store.read() as r:
        return change_log_bytes(r)


def _has_change_log(path) -> bool:
    with partq.Broker.open(path) as b, b.store.read() as r:
        return r.meta(b"slots") is not None or r.first_change_lsn() is not None


@pytest.mark.timeout(60)
def test_no_slot_without_authentication(tmp_path):
    p = primary(tmp_path / "primary")
    try:
        fill(p, 0, 100)
        for token in ("wrong-token-0123456789abcdef", None):
            with pytest.raises(partq.AuthenticationFailed):
                RawStandby(p.replication_address, "intruder", token=token)
        peer = RawStandby(p.replication_address, "bad id with spaces")   # authenticated
        assert peer.start["type"] == "refused" and "standby id" in peer.start["reason"]
        peer.close()
        assert slot_ids(p) == []
        fill(p, 100, 100)
    finally:
        p.close()
    assert not _has_change_log(tmp_path / "primary"), "commits without a standby were logged"


@pytest.mark.timeout(90)
def test_dr_slots_lists_and_drop_slot_removes(tmp_path):
    p = primary(tmp_path / "primary")
    s = None
    try:
        fill(p, 0, 200)
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_caught_up(p)
        sid = slot_ids(p)[0]
        s.close()
        s = None
        fill(p, 200, 300)
        wait_until(lambda: not p.replication_status().connected, 10, "the link to end")
    finally:
        if s is not None:
            s.close()
        p.close()
    listed = partq_cli("dr", "slots", "--json", data=tmp_path / "primary")
    assert listed.returncode == 0, listed.stderr
    [slot] = json.loads(listed.stdout)["slots"]
    assert slot["standby_id"] == sid and slot["state"] == "active"
    assert slot["lag_changes"] > 0 and slot["lag_messages"] == 300
    assert slot["age_seconds"] >= 0 and slot["idle_seconds"] >= 0
    text = partq_cli("dr", "slots", data=tmp_path / "primary")
    assert text.returncode == 0 and sid in text.stdout and "LAG MESSAGES" in text.stdout
    missing = partq_cli("dr", "drop-slot", "nobody", data=tmp_path / "primary")
    assert missing.returncode == 1 and "no replication slot named 'nobody'" in missing.stderr
    dropped = partq_cli("dr", "drop-slot", sid, "--json", data=tmp_path / "primary")
    assert dropped.returncode == 0 and json.loads(dropped.stdout) == {"dropped": sid}
    with partq.Broker.open(tmp_path / "primary") as b:
        assert list_slots(b.store) == []
        with b.store.read() as r:
            assert r.first_change_lsn() is None, "the dropped slot's change log was kept"
    # the standby comes back: a new slot, and a snapshot for the changes it lost
    p = primary(tmp_path / "primary")
    s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                          replication_token=TOKEN)
    try:
        wait_caught_up(p)
        fill(p, 500, 100)
        wait_caught_up(p)
    finally:
        s.close()
        p.close()
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("served", [True, False], ids=["serving", "not-serving"])
def test_an_absent_standby_never_fills_the_primary(tmp_path, served):
    """A small store (8 MiB) with a standby gone for good: the change log stops at
    max_slot_keep (at most a quarter of the map), the slot is invalidated, publishing and
    acking go on at depth 0 far past the store's size, whether or not the process serves
    replication. The standby, back, starts from a snapshot and ends identical."""
    opts = dict(map_size=MiB, max_map_size=8 * MiB)
    p = primary(tmp_path / "primary", **opts)
    s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                          replication_token=TOKEN)
    try:
        p.create_queue("q", partitions=2, rebalance_delay=0.0)
        wait_caught_up(p)
        sid = slot_ids(p)[0]
    finally:
        s.close()
    if not served:
        p.close()
        p = partq.Broker.open(tmp_path / "primary", **opts)
    try:
        flow = p.bind("q", name="drain")
        biggest = 0
        for _ in range(400):                       # 400 x 100 KiB = 40 MiB through 8 MiB
            p.publish_many("q", [(b"p" * 1000, f"k{j}") for j in range(100)])
            got = []
            while len(got) < 100:
                got += flow.receive(100, timeout=5)
            flow.ack_many(got)
            biggest = max(biggest, _log_bytes(p))
        assert p.queue_status("q").depth == 0
        # max_slot_keep is a quarter of the map (2 MiB) and holds at every commit, however
        # late the upkeep threads run: one commit (100 KiB) and its pages may pass it
        assert biggest <= 2 * MiB + 512 * 1024, f"the change log reached {biggest} bytes"
        wait_until(lambda: not slot_ids(p), 10, "the slot to be invalidated")
        [slot] = list_slots(p.store)
        assert slot["standby_id"] == sid and slot["state"] == "invalidated"
        assert "max_slot_keep" in slot["reason"]
        flow.unbind()
    finally:
        p.close()
    p = primary(tmp_path / "primary", **opts)
    s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                          replication_token=TOKEN)
    try:
        wait_caught_up(p)
        fill(p, 0, 50)
        wait_caught_up(p)
        assert slot_ids(p) == [sid]
    finally:
        s.close()
        p.close()
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)


@pytest.mark.timeout(120)
def test_a_full_store_names_the_change_log_a_slot_keeps(tmp_path):
    """A store full of unacked messages and of the change log an absent standby's slot keeps:
    StorageFull says how much the change log holds and how to free it, and dropping the slot
    (as it says) makes room to publish again."""
    opts = dict(map_size=MiB, max_map_size=8 * MiB)
    p = primary(tmp_path / "primary", **opts)
    batch = [(b"f" * 1000, f"k{j}") for j in range(50)]
    p.create_queue("q", partitions=2)
    for _ in range(80):                           # 4 MiB before the standby: not in the log
        p.publish_many("q", batch)
    s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                          replication_token=TOKEN)
    try:
        wait_caught_up(p)
        [sid] = slot_ids(p)
    finally:
        s.close()
    try:
        with pytest.raises(partq.StorageFull) as full:
            for _ in range(1000):         # 50 MiB more: the log stays under max_slot_keep
                p.publish_many("q", batch)
        message = str(full.value)
        assert "change log kept for DR-standbys" in message and "drop-slot" in message, message
        assert drop_slot(p.store, sid)
        p.publish_many("q", batch)
    finally:
        p.close()
