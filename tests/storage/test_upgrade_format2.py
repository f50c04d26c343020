"""An upgrade: a directory written by commit 54c9c16 (partq before the message lifecycle, store
format 2 with three-item ack states and four-field records) opens with this version and keeps
every message, ack, assignment and setting, and can be consumed.

The directory is ``tests/fixtures/store_format2_54c9c16.tar.gz``, made by
``tests/fixtures/make_store_format2.py`` with the old code; ``store_format2_54c9c16.json`` is what
the old code saw in it when it closed: per queue its config and status, per partition its head,
ack floor, acked-above set and delivered mark, every message not acked (with whether, and how
often, the old code handed it out), and the checkpoint.

Delivery counts after an upgrade: the old code kept none and had no graceful hand-over of a
partition (its delivered mark leased up to 1024 sequences ahead, capped at the head), so to the new
code an old clean close looks like a crash: every unacked message at or below the old mark may
have been delivered. The rule is "after a crash (or an upgrade) a count may be one too high, never
too low" for what the new code can know: a message the old code really delivered comes with
count >= 2 and redelivered; none comes with more than 2 (the old code's own redeliveries, such
as its nacks, were never counted); a message above the old mark comes with count 1.
"""
from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

import pytest

import partq
from partq.config import QueueConfig
from partq.ops.verify import verify
from partq.storage.encoding import AckState, decode_record, record_fields

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
NAME = "store_format2_54c9c16"

# the settings the message lifecycle added, at the values an old queue must have after an upgrade
LIFECYCLE_DEFAULTS = {"max_redelivery": 0, "dead_message_queue": "", "redelivery_delay": 0.1,
                      "redelivery_delay_multiplier": 2.0, "redelivery_delay_max": 64.0,
                      "max_ttl": 0.0, "max_depth": 0, "max_bytes": 0, "max_poll_interval": 300.0}


@pytest.fixture(scope="module")
def record() -> dict:
    with open(FIXTURES / f"{NAME}.json") as f:
        return json.load(f)


@pytest.fixture
def old_dir(tmp_path) -> Path:
    with tarfile.open(FIXTURES / f"{NAME}.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


@pytest.fixture
def upgrade(old_dir, record):
    """``upgrade()`` opens (or reopens) the old directory with the current Broker, on a ManualClock
    an hour past the old code's last time (``.clock``); closed at teardown."""
    clock = partq.ManualClock(record["clock"] + 3600.0)
    opened: list[partq.Broker] = []

    def _open() -> partq.Broker:
        b = partq.Broker.open(old_dir, clock=clock)
        opened.append(b)
        return b
    _open.clock = clock
    yield _open
    for b in opened:
        b.close()


def json_headers(h):
    """Headers as the fixture's JSON holds them: bytes as {"$bytes": hex}."""
    if isinstance(h, dict):
        return {k: json_headers(v) for k, v in h.items()}
    if isinstance(h, (list, tuple)):
        return [json_headers(v) for v in h]
    if isinstance(h, bytes):
        return {"$bytes": h.hex()}
    return h


def unacked_of(record: dict, queue: str) -> dict[tuple[int, int], dict]:
    return {(m["partition"], m["seq"]): m for m in record["queues"][queue]["unacked"]}


def marks_of(record: dict, queue: str) -> dict[int, int]:
    return {p["partition"]: p["delivered_mark"] for p in record["queues"][queue]["partitions"]}


def as_stored(m: partq.Message) -> dict:
    return {"key": m.key, "payload": m.payload.hex(), "headers": json_headers(m.headers),
            "publish_time_ns": m.publish_time_ns}


def drain(flow, batch: int = 37) -> list[partq.Message]:
    """Receive until nothing comes, acking each batch after it is taken."""
    out: list[partq.Message] = []
    while True:
        got = flow.receive(batch)
        if not got:
            return out
        out.extend(got)
        flow.ack_many(got)


def check_upgraded_delivery(record: dict, queue: str, got: list[partq.Message]) -> None:
    """``got`` is every message of ``queue`` delivered after the upgrade: each unacked one exactly
    once, in partition order, as stored, with a delivery count the old state implies."""
    unacked, marks = unacked_of(record, queue), marks_of(record, queue)
    where = [(m.partition, m.seq) for m in got]
    assert len(where) == len(set(where)), "a message was delivered twice"
    assert set(where) == set(unacked), "a message was lost, or an acked one came back"
    for p in marks:
        seqs = [m.seq for m in got if m.partition == p]
        assert seqs == sorted(seqs), f"partition {p} out of order"
    for m in got:
        old = unacked[(m.partition, m.seq)]
        assert as_stored(m) == {k: old[k] for k in ("key", "payload", "headers", "publish_time_ns")}
        assert 1 <= m.delivery_count <= 2, (m.partition, m.seq, m.delivery_count)
        if old["delivered"]:
            # in flight at the old close (the nacked one twice): redelivered, counted once
            assert m.redelivered and m.delivery_count == 2, (m.partition, m.seq)
        elif m.seq > marks[m.partition]:
            # never handed out, above the old lease: nothing to suspect
            assert not m.redelivered and m.delivery_count == 1, (m.partition, m.seq)
        else:
            # never handed out, but under the old lease: may count one too many
            assert m.redelivered == (m.delivery_count == 2), (m.partition, m.seq)


# ---------------------------------------------------------------------------- the fixture itself
def test_the_fixture_is_small_and_was_made_by_the_old_code(record):
    assert (FIXTURES / f"{NAME}.tar.gz").stat().st_size < 100_000
    assert record["made_by"] == "54c9c16"
    # three-item ack states only: what the old code wrote
    assert all("failures" not in p for q in record["queues"].values() for p in q["partitions"])
    # what the upgrade must cope with: messages delivered before, messages under the old lease
    # never delivered, messages above it
    solo, orders = unacked_of(record, "solo"), unacked_of(record, "orders")
    marks = marks_of(record, "solo") | marks_of(record, "orders")
    everything = list(solo.values()) + list(orders.values())
    assert any(m["delivered"] for m in everything)
    assert any(m["deliveries"] == 2 for m in everything)
    assert any(not m["delivered"] and m["seq"] <= marks[m["partition"]] for m in everything)
    assert any(m["seq"] > marks[m["partition"]] for m in everything)
    assert any(p["above"] for p in record["queues"]["orders"]["partitions"])


# ---------------------------------------------------------------------------- what is kept
def test_settings_are_kept_and_new_ones_are_at_their_defaults(upgrade, record):
    b = upgrade()
    defaults = {f.name: f.default for f in dataclasses.fields(QueueConfig)}
    assert sorted(c.name for c in b.queues()) == sorted(record["queues"])
    for name, q in record["queues"].items():
        now = b.queue_config(name).to_dict()
        old = q["config"]
        assert {k: now[k] for k in old} == old, name
        added = {k: now[k] for k in now if k not in old}
        assert {k: added[k] for k in LIFECYCLE_DEFAULTS} == LIFECYCLE_DEFAULTS, name
        assert added == {k: defaults[k] for k in added}, name
    orders = b.queue_config("orders")
    assert (orders.partitions, orders.partitioner, orders.rebalance_delay, orders.max_handoff_time,
            orders.max_delivered_unacked_per_flow) == (3, "sticky", 7.5, 2.5, 400)
    assert b.queue_config("solo").access_type == "exclusive"
    assert b.checkpoint("orders", "copy") == record["checkpoints"]["orders"]["copy"] == 5


def test_messages_acks_and_marks_are_kept(upgrade, record):
    b = upgrade()
    assert verify(b.store).ok
    with b.store.read() as r:
        for name, q in record["queues"].items():
            qid = q["config"]["qid"]
            assert sorted(r.partitions(qid)) == [p["partition"] for p in q["partitions"]]
            stored = {}
            for p in q["partitions"]:
                part = p["partition"]
                ack = r.ack_state(qid, part)
                assert ack == AckState(p["floor"], set(p["above"]), p["delivered_mark"]), (name, part)
                assert r.head(qid, part) == p["head"]
                for seq, raw in r.records(qid, part, ack.floor, p["head"] - ack.floor + 1):
                    if ack.is_acked(seq):
                        continue
                    assert len(record_fields(raw)) == 4      # no expiry: old records never expire
                    rec = decode_record(raw, name, part, seq)
                    stored[(part, seq)] = {"key": rec.key, "payload": rec.payload.hex(),
                                           "headers": json_headers(rec.headers),
                                           "publish_time_ns": rec.publish_time_ns}
            old = {k: {f: m[f] for f in ("key", "payload", "headers", "publish_time_ns")}
                   for k, m in unacked_of(record, name).items()}
            assert stored == old, name


def test_statuses_depths_and_assignments_are_kept(upgrade, record):
    b = upgrade()
    for name, q in record["queues"].items():
        st, old = b.queue_status(name), q["status"]
        assert (st.depth, st.partition_count, st.access_type, st.parent_depth) == \
            (old["depth"], old["partition_count"], old["access_type"], old["parent_depth"]), name
        assert [(p.partition, p.flow_name, p.depth, p.next_seq, p.ack_floor) for p in st.partitions] == \
            [(p["partition"], p["flow_name"], p["depth"], p["next_seq"], p["ack_floor"])
             for p in old["partitions"]], name
        # the named flows the old code persisted, unbound until they come back; unnamed ones
        # are not shown, as the last owner is silent for longer than they could come back in
        assert sorted((f.name, f.partitions) for f in st.flows) == \
            sorted((f["name"], f["partitions"]) for f in old["flows"] if f["name"]), name
        assert all(not f.bound for f in st.flows)
        named = {p for f in old["flows"] if f["name"] for p in f["partitions"]}
        assert all(p.status == ("Unbound" if p.partition in named else "Unassigned")
                   for p in st.partitions), name
        assert st.dead == {"max_redelivery": 0, "expired": 0, "rejected": 0, "discarded": 0}


# ---------------------------------------------------------------------------- consuming
def test_a_named_flow_gets_its_partitions_back_and_everything_is_consumed_once(upgrade, record):
    b, clock = upgrade(), upgrade.clock
    old_flows = {f["name"]: f["partitions"] for f in record["queues"]["orders"]["status"]["flows"]}
    svc = b.bind("orders", name="svc")
    assert sorted(svc.partitions) == old_flows["svc"]
    st = b.queue_status("orders")
    assert st.rebalance_status == "Holddown"
    for p in st.partitions:
        if p.partition in old_flows["svc"]:
            assert p.status == "Ready" and p.flow_name == "svc"
        else:
            assert p.status == "Unbound" and p.flow_name == "audit"

    got = drain(svc)
    assert {m.partition for m in got} == set(old_flows["svc"])
    # "audit" does not come back within the delay: svc takes its partitions too
    clock.advance(b.queue_config("orders").rebalance_delay)
    b.tick()
    assert svc.partitions == frozenset({0, 1, 2})
    got += drain(svc)
    check_upgraded_delivery(record, "orders", got)

    # the exclusive queue: its old (unnamed) flow holds it until the delay passes
    solo = b.bind("solo")
    assert not solo.active
    clock.advance(b.queue_config("solo").rebalance_delay)
    b.tick()
    assert solo.partitions == frozenset({partq.PARENT})
    check_upgraded_delivery(record, "solo", drain(solo))

    for name, q in record["queues"].items():
        assert b.queue_status(name).depth == 0
        with b.store.read() as r:
            for p in q["partitions"]:
                ack = r.ack_state(q["config"]["qid"], p["partition"])
                assert (ack.floor, ack.above, ack.failures) == (p["head"], set(), {})
    assert svc.receive(100) == [] and solo.receive(100) == []


def test_the_lifecycle_works_on_an_upgraded_queue_and_the_directory_reopens(upgrade, record):
    b, clock = upgrade(), upgrade.clock
    svc = b.bind("orders", name="svc")
    clock.advance(7.5)
    b.tick()
    old = drain(svc)
    check_upgraded_delivery(record, "orders", old)

    # new messages with a TTL: delivered while alive, dead once expired
    b.create_queue("dead")
    # (nacks come back at once below, not after the default's small delay)
    b.update_queue("orders", max_redelivery=1, dead_message_queue="dead", redelivery_delay=0)
    short = b.publish("orders", b"short-lived", key="short", headers={"t": 1}, ttl=5.0)
    keep = [b.publish("orders", b"keep %d" % i, key=f"keep-{i}", headers={"i": i}, ttl=3600.0)
            for i in range(6)]
    clock.advance(10.0)
    got = svc.receive(100)
    assert sorted((m.partition, m.seq) for m in got) == sorted((r.partition, r.seq) for r in keep)
    assert all(m.delivery_count == 1 and not m.redelivered for m in got)
    assert b.queue_status("orders").dead["expired"] == 1
    # one nacked past max_redelivery goes to the dead message queue
    poison = next(m for m in got if m.payload != b"keep 5")
    svc.nack(poison)
    again = [m for m in svc.receive(100) if (m.partition, m.seq) == (poison.partition, poison.seq)]
    assert again[0].delivery_count == 2 and again[0].redelivered
    svc.nack(again[0])
    left = svc.receive(100)
    assert (poison.partition, poison.seq) not in {(m.partition, m.seq) for m in left}
    svc.ack_many([m for m in got + left if (m.partition, m.seq) != (poison.partition, poison.seq)
                  and m.payload != b"keep 5"])
    dead = b.bind("dead").receive(10)
    assert sorted((m.headers["dead_reason"], m.headers["origin_seq"]) for m in dead) == \
        sorted([("expired", short.seq), ("max_redelivery", poison.seq)])
    in_flight = [m for m in got if m.payload == b"keep 5"]
    # published, never delivered: no false redelivery after the new code's clean close
    fresh = b.publish("orders", b"fresh", key="fresh", ttl=3600.0)
    b.close()

    b = upgrade()
    assert verify(b.store).ok
    held = in_flight[0]
    with b.store.read() as r:
        # the new ack state: the close counted what was in flight and made the mark exact
        ack = r.ack_state(1, held.partition)
        assert ack.failures == {held.seq: 1} and ack.counted >= held.seq
        (seq, raw), = r.records(1, fresh.partition, fresh.seq, 1)
        assert seq == fresh.seq and len(record_fields(raw)) == 5            # with its expiry
    st = b.queue_status("orders")
    assert st.depth == 2 and st.dead == {"max_redelivery": 1, "expired": 1, "rejected": 0,
                                         "discarded": 0}
    svc = b.bind("orders", name="svc")
    assert svc.partitions == frozenset({0, 1, 2})
    back = {m.payload: m for m in drain(svc)}
    assert set(back) == {b"keep 5", b"fresh"}
    assert back[b"keep 5"].redelivered and back[b"keep 5"].delivery_count == 2
    assert (back[b"keep 5"].partition, back[b"keep 5"].seq) == \
        (in_flight[0].partition, in_flight[0].seq)
    assert not back[b"fresh"].redelivered and back[b"fresh"].delivery_count == 1
    assert b.queue_status("orders").depth == 0


def test_the_first_writable_open_stamps_the_current_format(old_dir, upgrade):
    """So that the partq of format 2 refuses the directory (FormatVersionMismatch) instead of
    misreading the ack states and records this one writes."""
    import lmdb

    from partq.storage.encoding import FORMAT_STAMP

    def stamp() -> bytes:
        env = lmdb.open(str(old_dir), readonly=True, lock=False, max_dbs=16)
        try:
            with env.begin() as txn:
                return bytes(txn.get(b"format", db=env.open_db(b"meta", txn=txn)))
        finally:
            env.close()
    assert stamp() == b"partq-format/2"
    upgrade().close()
    assert stamp() == FORMAT_STAMP == b"partq-format/3"
