"""The log's chunks (format 2): one LMDB entry per append and partition, keyed by its last
sequence, split at CHUNK_RECORDS records or CHUNK_BYTES bytes; reads start anywhere inside a
chunk; a damaged chunk reports each of its records as corrupt, never skips them."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from partq.errors import CorruptRecord
from partq.storage import Store, decode_record, encode_record
from partq.storage.encoding import CHUNK_BYTES, CHUNK_RECORDS, chunks, log_key, unpack_chunk


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "d", durability="async")
    yield s
    s.close()


def _queue(store) -> int:
    def op(w):
        qid = w.allocate_qid()
        w.put_queue("q", {"name": "q", "qid": qid, "partitions": 1})
        w.init_partition(qid, 0)
        return qid
    return store.write(op)


def _chunks(store, qid) -> list[tuple[int, int, int]]:
    """(first, last, bytes) of every stored chunk of partition 0, from LMDB itself."""
    out = []
    with store.env.begin(db=store.dbs["log"]) as txn:
        for k, v in txn.cursor():
            last = int.from_bytes(k[8:], "big")
            first, recs = unpack_chunk(v, last)
            out.append((first, last, sum(map(len, recs))))
    return out


def test_one_chunk_per_append_split_at_the_limits(store):
    qid = _queue(store)
    small = [encode_record(i, None, None, b"s") for i in range(CHUNK_RECORDS * 2 + 10)]
    store.write(lambda w: w.append(qid, 0, small[:3]))
    store.write(lambda w: w.append(qid, 0, small[3:]))
    n = len(small)
    assert [(first, last) for first, last, _ in _chunks(store, qid)] == \
        [(0, 2), (3, 3 + CHUNK_RECORDS - 1), (3 + CHUNK_RECORDS, 3 + 2 * CHUNK_RECORDS - 1),
         (3 + 2 * CHUNK_RECORDS, n - 1)]
    big = [encode_record(i, "k", None, b"b" * (CHUNK_BYTES // 3)) for i in range(7)]
    first = store.write(lambda w: w.append(qid, 0, big))
    sizes = [size for f, _, size in _chunks(store, qid) if f >= first]
    assert len(sizes) == 3 and all(size <= CHUNK_BYTES + len(big[0]) for size in sizes)
    with store.read() as r:
        got = r.records(qid, 0, 0, 10_000)
    assert [s for s, _ in got] == list(range(n + 7))
    assert [raw for _, raw in got] == small + big


@pytest.mark.parametrize("start,limit", [(0, 1), (1, 1), (2, 2), (1, 600), (515, 3), (514, 10_000)])
def test_reads_start_inside_a_chunk_and_cross_chunks(store, start, limit):
    qid = _queue(store)
    records = [encode_record(i, None, None, b"%d" % i) for i in range(600)]
    store.write(lambda w: w.append(qid, 0, records[:2]))
    store.write(lambda w: w.append(qid, 0, records[2:]))     # chunks 0-1, 2-513, 514-599
    with store.read() as r:
        got = r.records(qid, 0, start, limit)
    want = list(range(start, min(start + limit, 600)))
    assert [s for s, _ in got] == want
    assert [decode_record(raw, "q", 0, s).payload for s, raw in got] == [b"%d" % s for s in want]


def test_a_damaged_chunk_reports_each_of_its_records(store):
    qid = _queue(store)
    for lo in (0, 5, 10):
        store.write(lambda w, lo=lo: w.append(qid, 0, [encode_record(i, None, None, b"x")
                                                        for i in range(lo, lo + 5)]))
    with store.env.begin(write=True, db=store.dbs["log"]) as txn:
        txn.put(log_key(qid, 0, 9), b"\xc1not a chunk")          # the middle chunk, 5..9
    for start in (0, 5, 7):
        with store.read() as r:
            got = r.records(qid, 0, start, 100)
        assert [s for s, _ in got] == list(range(start, 15))
        for seq, raw in got:
            if 5 <= seq <= 9:
                with pytest.raises(CorruptRecord) as err:
                    decode_record(raw, "q", 0, seq)
                assert err.value.seq == seq
            else:
                decode_record(raw, "q", 0, seq)
    with store.read() as r:
        assert r.stored_count(qid, 0) == 10     # the damaged chunk's header counts nothing


def test_a_cache_decodes_a_chunk_once_across_reads(store):
    qid = _queue(store)
    records = [encode_record(i, None, None, b"%d" % i) for i in range(700)]
    store.write(lambda w: w.append(qid, 0, records))        # chunks 0-511, 512-699
    cache = [None, 0, None]
    got, pos, decoded = [], 0, []
    with store.read() as r:
        while batch := r.records(qid, 0, pos, 100, cache):
            if not decoded or cache[2] is not decoded[-1]:
                decoded.append(cache[2])
            got += batch
            pos = batch[-1][0] + 1
        uncached = r.records(qid, 0, 0, 10_000)
    assert got == uncached and [s for s, _ in got] == list(range(700))
    assert len(decoded) == 2          # seven reads, two chunks decoded


def test_an_empty_append_changes_nothing(store):
    qid = _queue(store)
    records = [encode_record(i, None, None, b"x") for i in range(3)]
    store.write(lambda w: w.append(qid, 0, records))
    assert store.write(lambda w: w.append(qid, 0, [])) == 3
    with store.read() as r:
        assert r.head(qid, 0) == 3 and [raw for _, raw in r.records(qid, 0, 0, 10)] == records



def test_a_damaged_first_chunk_reports_from_the_ack_floor(store):
    qid = _queue(store)
    for lo in (0, 5, 10):
        store.write(lambda w, lo=lo: w.append(qid, 0, [encode_record(i, None, None, b"x")
                                                        for i in range(lo, lo + 5)]))
    store.write(lambda w: w.ack(qid, 0, range(7)))            # chunk 0..4 goes, 5..9 stays
    with store.env.begin(write=True, db=store.dbs["log"]) as txn:
        txn.put(log_key(qid, 0, 9), b"\xc1 damaged")
    with store.read() as r:
        got = r.records(qid, 0, 0, 100)
    assert [s for s, _ in got] == list(range(7, 15))        # not 0..6: acked, long truncated
    assert [raw for s, raw in got if s < 10] == [b""] * 3


def _chunks_one_by_one(first: int, records: list[bytes]) -> list[tuple[int, list[bytes]]]:
    """The rule, record by record: a chunk closes at its CHUNK_RECORDS-th record, at the record
    that brings it to CHUNK_BYTES, or at the last record."""
    out, start, size = [], 0, 0
    for i, rec in enumerate(records):
        size += len(rec)
        if i + 1 - start >= CHUNK_RECORDS or size >= CHUNK_BYTES or i + 1 == len(records):
            out.append((first + i, records[start:i + 1]))
            start, size = i + 1, 0
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 1 << 40),
       st.lists(st.tuples(st.integers(1, 3 * CHUNK_RECORDS), st.sampled_from(
           [1, 7, 300, CHUNK_BYTES // 64, CHUNK_BYTES // 5, CHUNK_BYTES, CHUNK_BYTES + 1])),
           min_size=1, max_size=4))
def test_chunks_close_where_the_record_by_record_rule_closes_them(first, runs):
    records = [bytes(size) for count, size in runs            # at most ~4 chunks of bytes a run
               for _ in range(min(count, 4 * CHUNK_BYTES // size + 1))]
    got = [(last, unpack_chunk(value, last)) for last, value in chunks(first, records)]
    want = _chunks_one_by_one(first, records)
    assert [last for last, _ in got] == [last for last, _ in want]
    assert [recs for _, (_, recs) in got] == [recs for _, recs in want]
    assert [start for _, (start, _) in got] == [first] + [last + 1 for last, _ in want[:-1]]


# A chunk whose key was damaged (a flipped bit): the entry for seqs 100..199 of three chunks of
# 100 is put back under another key. Reading the partition then yields every seq once, in order,
# with b"" (a corrupt record) for exactly the seqs whose chunk is not where it must be.
DAMAGED_KEYS = {
    "high bit of its last seq": (0, (1 << 40) + 199),        # sorts after every other chunk
    "last seq below its first": (0, 50),                     # sorts before the chunk before it
    "last seq inside its range": (0, 150),                   # ends before its records do
    "last seq inside the next chunk": (0, 250),              # overlaps the chunk after it
    "another partition": (1, 199),                           # leaves a gap in its own
}


@pytest.mark.parametrize("how", sorted(DAMAGED_KEYS))
def test_a_chunk_under_a_damaged_key_is_read_as_corrupt_records(store, how):
    qid = _queue(store)
    for lo in (0, 100, 200):
        store.write(lambda w, lo=lo: w.append(qid, 0, [encode_record(i, None, None, b"x")
                                                        for i in range(lo, lo + 100)]))
    partition, last = DAMAGED_KEYS[how]
    with store.env.begin(write=True, db=store.dbs["log"]) as txn:
        value = txn.pop(log_key(qid, 0, 199))
        txn.put(log_key(qid, partition, last), value)
    with store.read() as r:
        got = r.records(qid, 0, 0, 10_000)
        assert [s for s, _ in got] == list(range(300))
        assert [s for s, raw in got if raw == b""] == list(range(100, 200))
        assert r.records(qid, 0, 120, 5) == [(s, b"") for s in range(120, 125)]
        assert [s for s, _ in r.records(qid, 0, 195, 10)] == list(range(195, 205))
    with pytest.raises(CorruptRecord, match="seq 100: .*chunk"):
        decode_record(got[100][1], "q", 0, 100)
    from partq.storage.log_check import check_log  # and the check of the keys names it
    faults = check_log(store)
    assert faults and any(f.key == log_key(qid, partition, last) for f in faults) \
        or any("100..199" in f.reason for f in faults), faults
