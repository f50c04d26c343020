"""The LMDB store: creating, reopening and refusing to open, and what opening costs: it does not
read the logs (rule `crash-recovery`).

Every test runs against a real LMDB environment in its own ``tmp_path`` directory (fixtures in
tests/storage/conftest.py); the main write/read tests run once per durability mode.
"""
from __future__ import annotations

import os
import random

import lmdb
import pytest
from store_helpers import append, make_queue, payloads_of

import partq
from partq.errors import CorruptStore, FormatVersionMismatch, NotAPartqStore
from partq.storage import FORMAT_VERSION, AckState, Store, encode_record
from partq.storage.encoding import FORMAT_STAMP


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


def test_open_twice_in_one_process_shares_the_store(tmp_path, opened):
    a = opened(tmp_path / "d")
    b = opened(tmp_path / "d")
    assert a is b
    qid = make_queue(a)
    a.close()  # one reference left: still usable
    assert append(b, qid, 0, [b"x"]) == 0


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


# ---------------------------------------------------------------- open cost (rule `crash-recovery`)
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


def test_a_commit_that_allocates_and_frees_pages_leaves_a_store_that_opens(tmp_path):
    """LMDB never writes the pages a transaction allocated and freed again: data.mdb could end
    before the last page its meta page counts, and the next open refused a healthy store as
    truncated. The group commit now extends the file (sparsely) to cover that page."""
    path = tmp_path / "s"
    broker = partq.Broker.open(path)
    broker.create_queue("q")
    broker.publish("q", b"kept")

    def grow_and_free(w):
        w.put_local_meta(b"scratch", b"z" * (8 << 20))
        w.delete_local_meta(b"scratch")
    broker.store.write(grow_and_free)
    broker.close()
    with partq.Broker.open(path) as again:
        assert again.queue_status("q").depth == 1


def test_nack_delays_are_kept_for_unacked_seqs_only_and_bounded():
    """``AckState.delays`` (durable nack delays): a later end replaces an earlier one, an acked
    seq keeps none, at most ``DELAYS_KEPT`` (those ending first go), and a state written
    before delays existed decodes with none."""
    from partq.storage.encoding import DELAYS_KEPT
    state = AckState(floor=0, above=set(), delivered_mark=10)
    assert state.delay([(3, 500), (5, 700)])
    assert not state.delay([(3, 400)])              # an earlier end changes nothing
    state.add([3])
    back = AckState.decode(state.encode(), "p")
    assert back.delays == {5: 700} and back.failures == {} and back.counted == -1
    old = AckState.decode(AckState(floor=2, above=set(), delivered_mark=4).encode(), "p")
    assert old.delays == {}
    many = AckState(floor=0, above=set(), delivered_mark=DELAYS_KEPT + 10)
    many.delay([(s, 1000 + s) for s in range(DELAYS_KEPT + 5)])
    assert len(many.delays) == DELAYS_KEPT and min(many.delays) == 5
