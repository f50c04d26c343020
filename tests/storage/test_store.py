"""The LMDB store: opening and refusing to open, map growth and StorageFull, on-disk damage,
truncation (S26), open cost (S25), fork safety and group commit (S23).

Every test runs against a real LMDB environment in its own ``tmp_path`` directory; the main
write/read tests run once per durability mode.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import pytest

from partq.errors import (
    CorruptRecord,
    CorruptStore,
    FormatVersionMismatch,
    NotAPartqStore,
    StorageFull,
    UsedAcrossFork,
)
from partq.storage import FORMAT_VERSION, AckState, Store, decode_record, encode_record
from partq.storage.encoding import FORMAT_STAMP

KIB, MIB = 1 << 10, 1 << 20
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sync", "async"])
def durability(request):
    return request.param


@pytest.fixture
def opened():
    """``opened(path, **kw)`` opens a Store and closes it at teardown if the test did not."""
    stores = []

    def open_(path, **kw):
        store = Store.open(path, **kw)
        stores.append(store)
        return store
    yield open_
    for store in reversed(stores):
        store.close()


def make_queue(store, name="q", partitions=1) -> int:
    def op(w):
        qid = w.allocate_qid()
        w.put_queue(name, {"name": name, "qid": qid, "partitions": partitions})
        for p in range(partitions):
            w.init_partition(qid, p)
        return qid
    return store.write(op)


def rec(payload: bytes, key: str | None = None, ts: int = 1) -> bytes:
    return encode_record(ts, key, None, payload)


def append(store, qid, p, payloads) -> int:
    records = [rec(x) for x in payloads]
    return store.write(lambda w: w.append(qid, p, records))


def payloads_of(store, qid, p, start=0, limit=1 << 30, queue="q") -> dict[int, bytes]:
    with store.read() as r:
        return {seq: decode_record(raw, queue, p, seq).payload
                for seq, raw in r.records(qid, p, start, limit)}


def head(store, qid, p=0) -> int:
    with store.read() as r:
        return r.head(qid, p)


# ---------------------------------------------------------------------------- create / reopen
def test_create_write_close_reopen(tmp_path, opened, durability):
    path = tmp_path / "data"
    store = opened(path, durability=durability)
    assert store.report.created and store.report.stale_readers_cleared == 0
    qid = make_queue(store, "orders", partitions=3)
    assert store.write(lambda w: w.append(qid, 1, [encode_record(5, "k", {"h": "v"}, b"a")])) == 0
    assert append(store, qid, 1, [b"b", b"c", b"d"]) == 1
    assert append(store, qid, 2, [b"z"]) == 0
    state = store.write(lambda w: w.ack(qid, 1, [0, 2]))
    assert (state.floor, state.above) == (1, {2})
    store.write(lambda w: w.set_delivered_mark(qid, 1, 2))
    store.write(lambda w: w.put_state(qid, b"opaque-blob"))
    store.close()

    store = opened(path, durability=durability)
    assert not store.report.created
    with store.read() as r:
        assert r.queue("orders") == {"name": "orders", "qid": qid, "partitions": 3}
        assert list(r.queues()) == ["orders"]
        assert r.queue("nope") is None
        assert [r.head(qid, p) for p in range(3)] == [0, 4, 1]
        assert r.ack_state(qid, 1) == AckState(floor=1, above={2}, delivered_mark=2)
        assert r.ack_state(qid, 0) == AckState(floor=0, above=set(), delivered_mark=-1)
        assert r.state(qid) == b"opaque-blob"
        assert r.first_seq(qid, 1) == 1 and r.stored_count(qid, 1) == 3
        assert r.first_seq(qid, 0) is None and r.stored_count(qid, 0) == 0
        assert r.records(qid, 1, 2, 1)[0][0] == 2
    assert payloads_of(store, qid, 1) == {1: b"b", 2: b"c", 3: b"d"}
    assert payloads_of(store, qid, 2) == {0: b"z"}


def test_qids_are_never_reused_across_reopen(tmp_path, opened):
    store = opened(tmp_path / "d")
    first = make_queue(store, "a")
    store.close()
    store = opened(tmp_path / "d")
    assert make_queue(store, "b") == first + 1


def test_failing_op_leaves_nothing_and_fails_only_its_caller(tmp_path, opened, durability):
    store = opened(tmp_path / "d", durability=durability)
    qid = make_queue(store)

    def bad(w):
        w.append(qid, 0, [rec(b"never")])
        raise ValueError("refused")

    for _ in range(20):  # submit bursts so that good and bad ops share a commit
        futs = [store.submit(lambda w: w.append(qid, 0, [rec(b"good")])), store.submit(bad),
                store.submit(lambda w: w.append(qid, 0, [rec(b"good")]))]
        with pytest.raises(ValueError, match="refused"):
            futs[1].result()
        assert futs[0].result() != futs[2].result()
    got = payloads_of(store, qid, 0)
    assert sorted(got) == list(range(40)) and set(got.values()) == {b"good"}
    assert head(store, qid) == 40


# ---------------------------------------------------------------------------- refusing to open
def test_format_version_mismatch(tmp_path, opened):
    path = tmp_path / "d"
    opened(path).close()
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        assert txn.get(b"format", db=meta) == FORMAT_STAMP
        txn.put(b"format", b"partq-format/999", db=meta)
    env.close()

    with pytest.raises(FormatVersionMismatch) as info:
        Store.open(path)
    msg = str(info.value)
    assert "partq-format/999" in msg and f"format {FORMAT_VERSION}" in msg and str(path) in msg
    # The refused Store's environment is closed only when garbage-collected, and the exception's
    # traceback keeps it alive: drop it before opening the files again in this process.
    del info
    env = lmdb.open(str(path), max_dbs=16)  # the refused open changed nothing
    with env.begin() as txn:
        assert txn.get(b"format", db=env.open_db(b"meta", txn=txn)) == b"partq-format/999"
    env.close()


def test_directory_with_other_files_is_not_a_store(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    with pytest.raises(NotAPartqStore, match="other files"):
        Store.open(path)
    assert sorted(os.listdir(path)) == ["notes.txt"]


def test_a_file_is_not_a_store(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotAPartqStore):
        Store.open(tmp_path / "f")


def test_missing_directory_with_create_false(tmp_path):
    with pytest.raises(NotAPartqStore):
        Store.open(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


def test_foreign_lmdb_environment_is_not_a_store(tmp_path):
    path = tmp_path / "d"
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"user:1", b"alice")
        txn.put(b"user:2", b"bob")
    env.close()

    with pytest.raises(NotAPartqStore, match="not a partq store"):
        Store.open(path)
    env = lmdb.open(str(path), max_dbs=4)  # left exactly as it was: no partq dbs were added
    with env.begin() as txn:
        assert list(txn.cursor()) == [(b"user:1", b"alice"), (b"user:2", b"bob")]
    env.close()


@pytest.mark.parametrize("size", ["same", 100, 4096])
def test_random_bytes_over_data_mdb_is_corrupt_store(tmp_path, opened, size):
    path = tmp_path / "d"
    store = opened(path)
    qid = make_queue(store)
    append(store, qid, 0, [b"x" * 100] * 50)
    store.close()
    data = path / "data.mdb"
    n = data.stat().st_size if size == "same" else size
    data.write_bytes(random.Random(n).randbytes(n))
    with pytest.raises(CorruptStore) as info:  # a PartqError, never a raw lmdb.Error
        Store.open(path)
    assert not isinstance(info.value, lmdb.Error)
    assert "data.mdb" in str(info.value)


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


# ---------------------------------------------------------------------------- damage on disk
@pytest.mark.parametrize("payload_size", [200, 20_000], ids=["inline", "overflow-page"])
def test_flipped_byte_on_disk_is_a_corrupt_record_naming_its_position(tmp_path, opened, durability,
                                                                       payload_size):
    path = tmp_path / "d"
    store = opened(path, durability=durability)
    qid = make_queue(store, partitions=2)
    marker = b"MARKER-7f3a9c" + os.urandom(8).hex().encode()
    marker_payload = marker + b"." * (payload_size - len(marker))
    append(store, qid, 1, [b"before-%d" % i for i in range(5)])
    marker_seq = append(store, qid, 1, [marker_payload])
    append(store, qid, 1, [b"after-%d" % i for i in range(5)])
    store.close()

    data = bytearray((path / "data.mdb").read_bytes())
    hits = []
    at = data.find(marker)
    while at != -1:  # LMDB may still hold stale copies of the page: damage every copy
        hits.append(at)
        data[at + len(marker) // 2] ^= 0x01
        at = data.find(marker, at + 1)
    assert hits, "marker payload not found in data.mdb"
    (path / "data.mdb").write_bytes(bytes(data))

    store = opened(path, durability=durability)
    with store.read() as r:
        raws = dict(r.records(qid, 1, 0, 100))
    assert sorted(raws) == list(range(11))
    for seq, raw in raws.items():
        if seq == marker_seq:
            with pytest.raises(CorruptRecord) as info:
                decode_record(raw, "orders", 1, seq)
            assert (info.value.queue, info.value.partition, info.value.seq) == ("orders", 1, 5)
            assert "'orders'" in str(info.value) and "partition 1" in str(info.value)
            assert "seq 5" in str(info.value)
        else:
            assert decode_record(raw, "orders", 1, seq).payload.startswith((b"before-", b"after-"))


DAMAGED_PAGE_READ = r"""
import struct, sys
from partq.storage import Store, encode_record
path = sys.argv[1]
store = Store.open(path)
qid = store.write(lambda w: w.allocate_qid())
store.write(lambda w: w.init_partition(qid, 0))
store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"a" * 300)] * 100))
seq = store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"MARKER-5c1e" * 30)]))
store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"b" * 300)] * 100))
store.close()
with open(path + "/data.mdb", "r+b") as f:
    data = bytearray(f.read())
    page = 4096
    at = data.find(b"MARKER-5c1e")
    while at != -1:  # mark each page holding the record as an overflow page (mp_flags at +10)
        struct.pack_into("<H", data, at // page * page + 10, 0x04)
        at = data.find(b"MARKER-5c1e", at + 1)
    f.seek(0)
    f.write(data)
store = Store.open(path)
try:
    with store.read() as r:
        r.records(qid, 0, seq, 1)  # a point lookup: LMDB reports MDB_CORRUPTED
    print("no error")
except Exception as exc:
    print(type(exc).__module__ + "." + type(exc).__name__)
"""


def test_damaged_btree_page_is_reported_as_corrupt_store(tmp_path):
    # In a subprocess: iterating *into* such a page trips an assertion inside LMDB that aborts
    # the whole process, which no Python code can catch.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", DAMAGED_PAGE_READ, str(tmp_path / "d")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "partq.storage.errors.CorruptStore"   # = partq.CorruptStore


# ---------------------------------------------------------------------------- truncation (S26)
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
    assert store.write(lambda w: w.truncate(qid, 0, 7)) == 1    # only 0..4 lies wholly below 7
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
        sizes.append((path / "data.mdb").stat().st_size)
    assert sizes[-1] <= sizes[9], f"data.mdb kept growing: {sizes[::5]}"
    assert sizes[-1] < 4 * MIB
    with store.read() as r:
        assert r.stored_count(qid, 0) == 0 and r.head(qid, 0) == 12_000


def test_records_limit_zero_returns_nothing(tmp_path, opened):
    store = opened(tmp_path / "d")
    qid = make_queue(store)
    append(store, qid, 0, [b"a", b"b"])
    with store.read() as r:
        assert r.records(qid, 0, 0, 0) == []


# ---------------------------------------------------------------------------- open cost (S25)
class _CountingTxn:
    """Delegates to a real transaction and notes every call that names the log database."""

    def __init__(self, txn, probe):
        self._txn, self._probe = txn, probe

    def __getattr__(self, name):
        attr = getattr(self._txn, name)
        if not callable(attr):
            return attr
        probe = self._probe

        def call(*args, **kw):
            if probe.log_db is not None and any(a is probe.log_db for a in (*args, *kw.values())):
                probe.log_calls.append(name)
            return attr(*args, **kw)
        return call

    def __enter__(self):
        self._txn.__enter__()
        return self

    def __exit__(self, *exc):
        return self._txn.__exit__(*exc)


class _CountingEnv:
    def __init__(self, env, probe):
        self._env, self._probe = env, probe

    def __getattr__(self, name):
        return getattr(self._env, name)

    def begin(self, *args, **kw):
        return _CountingTxn(self._env.begin(*args, **kw), self._probe)

    def open_db(self, key=None, txn=None, **kw):
        db = self._env.open_db(key, txn=getattr(txn, "_txn", txn), **kw)
        if key == b"log":
            self._probe.log_db = db
        return db


class _Probe:
    def __init__(self):
        self.log_db = None
        self.log_calls: list[str] = []


def test_open_does_not_read_the_log(tmp_path, opened, monkeypatch):
    path = tmp_path / "d"
    store = opened(path, durability="async")
    qids = [make_queue(store, name, partitions=4) for name in ("a", "b")]
    for qid in qids:
        for p in range(4):
            append(store, qid, p, [b"r" * 50] * 2500)
        store.write(lambda w, qid=qid: w.ack(qid, 0, range(1024)))   # two whole chunks
    store.close()

    probe = _Probe()
    real_open = lmdb.open
    monkeypatch.setattr(lmdb, "open", lambda *a, **kw: _CountingEnv(real_open(*a, **kw), probe))
    store = opened(path)
    assert probe.log_db is not None, "the probe did not see the log database being opened"
    assert probe.log_calls == [], f"opening touched the log: {probe.log_calls}"
    with store.read() as r:  # the probe does see log reads once the store is used
        assert r.stored_count(qids[0], 0) == 2500 - 1024
    assert probe.log_calls


# ---------------------------------------------------------------------------- fork
def _in_child(body) -> int:
    """Run ``body()`` in a forked child; return its exit status (its return value, 255 on error)."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 255
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status)
    return os.WEXITSTATUS(status)


def test_store_used_across_fork_raises(tmp_path, opened):
    store = opened(tmp_path / "d")
    qid = make_queue(store)
    append(store, qid, 0, [b"parent"])

    def child():
        code = 0
        for bit, use in ((1, lambda: store.write(lambda w: w.append(qid, 0, [rec(b"child")]))),
                         (2, lambda: store.read().__enter__()),
                         (4, lambda: store.submit(lambda w: w.append(qid, 0, [rec(b"child")])))):
            try:
                use()
            except UsedAcrossFork as exc:
                if "forked child" in str(exc):
                    code |= bit
        store.close()  # a no-op in the child: it must not touch the parent's environment
        return code

    assert _in_child(child) == 7, "1=write, 2=read, 4=submit must raise UsedAcrossFork"
    # The parent's store is unaffected, and the child wrote nothing.
    assert append(store, qid, 0, [b"parent-again"]) == 1
    assert payloads_of(store, qid, 0) == {0: b"parent", 1: b"parent-again"}


def test_forked_child_cannot_reopen_and_is_told_what_to_do(tmp_path, opened):
    """py-lmdb refuses a second environment on files its forked parent had open, so the child
    gets UsedAcrossFork saying to open after forking or to use 'spawn', never CorruptStore."""
    path = tmp_path / "d"
    store = opened(path)
    qid = make_queue(store)
    append(store, qid, 0, [b"parent"])

    def child():
        try:
            Store.open(path)
        except UsedAcrossFork as exc:
            return 0 if "spawn" in str(exc) else 2
        return 1

    assert _in_child(child) == 0
    assert payloads_of(store, qid, 0) == {0: b"parent"}


# ---------------------------------------------------------------------------- group commit (S23)
def test_group_commit_from_8_threads(tmp_path, opened, durability):
    store = opened(tmp_path / "d", durability=durability)
    qid = make_queue(store)
    commits_before, _ = store.commit_counts()
    results: dict[int, list[int]] = {}
    errors = []
    start = threading.Barrier(8)

    def publisher(t):
        try:
            start.wait()
            results[t] = [store.write(lambda w, i=i: w.append(qid, 0, [rec(b"%d:%d" % (t, i))]))
                          for i in range(200)]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=publisher, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    seqs = [s for t in range(8) for s in results[t]]
    assert len(set(seqs)) == 1600 and set(seqs) == set(range(1600))
    for t in range(8):
        assert results[t] == sorted(results[t])  # one thread's appends keep their order
    stored = payloads_of(store, qid, 0)
    for t in range(8):
        for i, seq in enumerate(results[t]):
            assert stored[seq] == b"%d:%d" % (t, i)
    commits = store.commit_counts()[0] - commits_before
    assert commits < 1600, "no commit was shared"
    assert head(store, qid) == 1600


def test_open_twice_in_one_process_shares_the_store(tmp_path, opened):
    a = opened(tmp_path / "d")
    b = opened(tmp_path / "d")
    assert a is b
    qid = make_queue(a)
    a.close()  # one reference left: still usable
    assert append(b, qid, 0, [b"x"]) == 0
