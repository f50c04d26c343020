"""The LMDB store's space: the map grows up to max_map_size, StorageFull leaves the store usable
and acking recovers from it, and acked prefixes are truncated, so that disk use follows the
backlog (rule `truncation`).

Every test runs against a real LMDB environment in its own ``tmp_path`` directory (fixtures in
tests/storage/conftest.py); the main write/read tests run once per durability mode.
"""
from __future__ import annotations

import pytest
from store_helpers import KIB, MIB, append, head, make_queue, payloads_of

from partq.errors import StorageFull
from partq.storage import AckState


# ---------------------------------------------------------------------------- map size
def fill_to_storage_full(store, qid, batch) -> int:
    """Append ``batch`` until the map is full; return the head before the failed append."""
    for _ in range(10_000):
        before = head(store, qid)
        try:
            append(store, qid, 0, batch)
        except StorageFull as exc:
            assert "max_map_size" in str(exc)
            return before
    pytest.fail("the map never filled")


BATCH = [b"%06d" % i + b"." * 994 for i in range(40)]


def test_map_full_raises_storage_full_and_leaves_the_store_usable(tmp_path, opened, durability):
    path = tmp_path / "d"
    store = opened(path, durability=durability, map_size=1 * MIB, max_map_size=4 * MIB)
    qid = make_queue(store)
    before = fill_to_storage_full(store, qid, BATCH)
    assert store.env.info()["map_size"] == 4 * MIB  # it grew from 1 MiB to the limit

    # The failed batch left nothing: same head, same records, nothing past the head.
    assert before > 1000 and head(store, qid) == before
    stored = payloads_of(store, qid, 0)
    assert sorted(stored) == list(range(before))
    assert all(v == BATCH[s % 40] for s, v in stored.items())
    with store.read() as r:
        assert r.records(qid, 0, before, 10) == []
    # A retry fails cleanly again.
    with pytest.raises(StorageFull):
        append(store, qid, 0, BATCH)
    assert head(store, qid) == before

    # A small ack (one append's chunk) still commits on the full map, and its prefix goes.
    state = store.write(lambda w: w.ack(qid, 0, range(40)))
    assert state.floor == 40
    with store.read() as r:
        assert (r.first_seq(qid, 0), r.stored_count(qid, 0)) == (40, before - 40)
    store.close()

    # A larger max_map_size lets appends continue past the old limit.
    store = opened(path, durability=durability, map_size=1 * MIB, max_map_size=32 * MIB)
    for _ in range(150):
        append(store, qid, 0, BATCH)
    assert head(store, qid) == before + 6000
    assert store.env.info()["map_size"] > 4 * MIB
    got = payloads_of(store, qid, 0)
    assert sorted(got) == list(range(40, before + 6000))
    assert all(v == BATCH[s % 40] for s, v in got.items())


@pytest.mark.parametrize("record_size,fill_batch,ack_batch",
                         [(100, 10, 100), (500, 37, 100), (994, 10, 100), (994, 3, 10), (3000, 1, 100)])
def test_acking_drains_a_full_store(tmp_path, opened, record_size, fill_batch, ack_batch):
    """StorageFull's hint says "ack and drain messages": a consumer acking in batches must be
    able to do exactly that on a map at its limit, and publishing must then resume.

    LMDB copies every page it changes and reuses a freed page only two commits later, so a full
    map needs headroom for acks; with the storage code of commit aaf6fac every one of these
    shapes wedged after the first ack (each later commit failed with StorageFull, so no freed
    page ever became reusable)."""
    store = opened(tmp_path / "d", durability="async", map_size=1 * MIB, max_map_size=2 * MIB)
    qid = make_queue(store)
    batch = [b"%06d" % i + b"." * (record_size - 6) for i in range(fill_batch)]
    before = fill_to_storage_full(store, qid, batch)
    for start in range(0, before, ack_batch):
        end = min(start + ack_batch, before)
        assert store.write(lambda w, start=start, end=end: w.ack(qid, 0, range(start, end))).floor == end
    with store.read() as r:
        assert r.stored_count(qid, 0) == 0
    assert append(store, qid, 0, batch) == before


def test_map_grows_on_demand_below_the_maximum(tmp_path, opened, durability):
    store = opened(tmp_path / "d", durability=durability, map_size=256 * KIB)
    qid = make_queue(store, partitions=2)
    big = [bytes([i % 256]) * 2000 for i in range(100)]
    for i in range(20):  # 4 MB of records into a 256 KiB initial map
        assert append(store, qid, i % 2, big) == (i // 2) * 100
    assert store.env.info()["map_size"] >= 4 * MIB
    for p in (0, 1):
        got = payloads_of(store, qid, p)
        assert len(got) == 1000 and all(v == big[s % 100] for s, v in got.items())


def test_storage_full_reaches_every_caller_of_a_shared_commit(tmp_path, opened):
    store = opened(tmp_path / "d", map_size=256 * KIB, max_map_size=256 * KIB)
    qid = make_queue(store)
    huge = [b"h" * 100_000] * 5
    futs = [store.submit(lambda w: w.append(qid, 0, huge)) for _ in range(4)]
    for fut in futs:
        with pytest.raises(StorageFull):
            fut.result()
    assert head(store, qid) == 0
    assert append(store, qid, 0, [b"small"]) == 0


# ---------------------------------------------------------------------------- truncation (rule `truncation`)
def test_acked_prefix_is_truncated(tmp_path, opened, durability):
    store = opened(tmp_path / "d", durability=durability)
    qid = make_queue(store, partitions=2)
    for i in range(0, 100, 10):       # ten appends: ten chunks of ten records
        append(store, qid, 0, [b"m%d" % j for j in range(i, i + 10)])
    append(store, qid, 1, [b"other"] * 10)

    assert store.write(lambda w: w.ack(qid, 0, range(50))).floor == 50
    with store.read() as r:
        assert (r.first_seq(qid, 0), r.stored_count(qid, 0)) == (50, 50)
    # Acks above the floor are remembered but leave the log alone until the gap closes.
    state = store.write(lambda w: w.ack(qid, 0, [60, 61, 75]))
    assert (state.floor, state.above) == (50, {60, 61, 75})
    with store.read() as r:
        assert (r.first_seq(qid, 0), r.stored_count(qid, 0)) == (50, 50)
    state = store.write(lambda w: w.ack(qid, 0, range(50, 60)))
    assert (state.floor, state.above) == (62, {75})
    with store.read() as r:      # chunk 60..69 stays whole: 62..69 are not acked yet
        assert (r.first_seq(qid, 0), r.stored_count(qid, 0)) == (60, 40)
        assert r.stored_count(qid, 1) == 10  # the neighbour partition is untouched
    assert payloads_of(store, qid, 0, 0, 1) == {60: b"m60"}
    # Acking again, or acking below the floor, changes nothing.
    state = store.write(lambda w: w.ack(qid, 0, [0, 10, 61]))
    assert (state.floor, state.above) == (62, {75})
    assert store.write(lambda w: w.ack(qid, 0, range(62, 100))).floor == 100
    with store.read() as r:
        assert (r.first_seq(qid, 0), r.stored_count(qid, 0), r.head(qid, 0)) == (None, 0, 100)
    assert append(store, qid, 0, [b"next"]) == 100  # sequences are never reused


def test_truncate_and_drop_partition(tmp_path, opened):
    store = opened(tmp_path / "d")
    qid = make_queue(store, partitions=2)
    for _ in range(4):
        append(store, qid, 0, [b"x"] * 5)     # chunks 0..4, 5..9, 10..14, 15..19
    append(store, qid, 1, [b"y"] * 5)
    # the ack floor moves to 7 (a log holds every seq from its floor up: truncation follows it)
    store.write(lambda w: w.ack_through(qid, 0, 6))
    with store.read() as r:
        assert r.stored_count(qid, 0) == 15                     # only 0..4 lay wholly below 7
    assert store.write(lambda w: w.truncate(qid, 0, 7)) == 0
    with store.read() as r:
        assert (r.first_seq(qid, 0), r.stored_count(qid, 0)) == (5, 15)
    assert store.write(lambda w: w.drop_partition(qid, 0)) == 15
    with store.read() as r:
        assert r.stored_count(qid, 0) == 0 and r.head(qid, 0) == 20  # head kept: no seq reuse
        assert r.stored_count(qid, 1) == 5
    store.write(lambda w: w.init_partition(qid, 0))
    with store.read() as r:
        assert r.ack_state(qid, 0) == AckState(floor=20, above=set(), delivered_mark=19)
    assert append(store, qid, 0, [b"z"]) == 20


def test_disk_use_follows_the_backlog_not_history(tmp_path, opened, durability):
    path = tmp_path / "d"
    store = opened(path, durability=durability)
    qid = make_queue(store)
    batch = [b"p" * 1000] * 200
    sizes = []
    for _ in range(60):  # 12 MB published and acked in total, 200 KB backlog at most
        first = append(store, qid, 0, batch)
        store.write(lambda w, first=first: w.ack(qid, 0, range(first, first + 200)))
        sizes.append(store.usage()["high_water"])
    assert sizes[-1] <= sizes[9], f"data.mdb kept growing: {sizes[::5]}"
    assert sizes[-1] < 4 * MIB
    # past the pages used, the file keeps its reserve for acks allocated, and no more
    assert (path / "data.mdb").stat().st_size <= sizes[-1] + store.space.disk_reserve
    with store.read() as r:
        assert r.stored_count(qid, 0) == 0 and r.head(qid, 0) == 12_000


def test_records_limit_zero_returns_nothing(tmp_path, opened):
    store = opened(tmp_path / "d")
    qid = make_queue(store)
    append(store, qid, 0, [b"a", b"b"])
    with store.read() as r:
        assert r.records(qid, 0, 0, 0) == []
