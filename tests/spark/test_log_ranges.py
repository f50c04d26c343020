"""Reading ranges of a queue's logs without Spark (partq.jobs.log_ranges, partq.spark.rows, offsets):
what the batch reader and the stream's tasks do, on real LMDB directories."""
from __future__ import annotations

import pytest
from helpers import drain

import partq
from partq.jobs.log_ranges import queue_logs, read_range
from partq.storage.encoding import PARENT


@pytest.fixture
def broker(broker):
    broker.create_queue("q", partitions=2, rebalance_delay=0.0)
    return broker


def keyed(n: int, key: str = "one-key") -> list[tuple[bytes, str]]:
    return [(f"m{i}".encode(), key) for i in range(n)]


def read_all(store, queue, qid, p, start, end, **kw) -> list[int]:
    seqs, pos = [], start
    while pos < end:
        got = read_range(store, queue, qid, p, pos, end, **kw)
        seqs += [s for s, _ in got.records]
        pos = got.next
    return seqs


def test_a_range_leaves_out_acked_messages_and_reads_back_the_same(broker):
    broker.publish_many("q", keyed(30))
    p = partq.key_partition("one-key", 2)
    logs = queue_logs(broker.store, "q")
    assert logs.log(p).head == 30 and logs.log(p).floor == 0
    flow = broker.bind("q")
    got = drain(flow, ack=False)
    flow.ack_many([m for m in got if m.seq < 5 or m.seq in (9, 11)])
    first = read_all(broker.store, "q", logs.qid, p, 0, 30, max_records=4)
    assert first == [s for s in range(5, 30) if s not in (9, 11)]
    assert read_all(broker.store, "q", logs.qid, p, 0, 30, max_records=7) == first
    assert read_all(broker.store, "q", logs.qid, p, 20, 25) == list(range(20, 25))


def test_reads_stop_at_the_range_and_cap_bytes(broker):
    broker.publish_many("q", keyed(100))
    p = partq.key_partition("one-key", 2)
    qid = queue_logs(broker.store, "q").qid
    got = read_range(broker.store, "q", qid, p, 10, 50, max_bytes=1)
    assert [s for s, _ in got.records] == [10] and got.next == 11
    got = read_range(broker.store, "q", qid, p, 90, 100)
    assert [s for s, _ in got.records] == list(range(90, 100)) and got.next == 100


def test_a_dropped_partition_or_a_deleted_queue_is_an_error(broker):
    broker.publish_many("q", [(b"x", f"k{i}") for i in range(40)])
    qid = queue_logs(broker.store, "q").qid
    broker.scale("q", 1)
    with pytest.raises(partq.PartitionNotFound, match="partition 1 of queue 'q' is gone"):
        read_range(broker.store, "q", qid, 1, 0, 10)
    logs = queue_logs(broker.store, "q", known=[0, 1])
    assert [s.partition for s in logs.logs] == [0] and logs.gone[0][0] == 1 and logs.gone[0][1] > 0
    broker.delete_queue("q")
    with pytest.raises(partq.QueueNotFound, match="was deleted"):
        read_range(broker.store, "q", qid, 0, 0, 10)
    broker.create_queue("q", partitions=2)
    with pytest.raises(partq.QueueNotFound, match="deleted and created again"):
        read_range(broker.store, "q", qid, 0, 0, 10)


def test_the_parent_log_is_listed_after_the_partitions(broker):
    broker.update_queue("q", access_type="exclusive")
    broker.publish_many("q", keyed(3))
    broker.update_queue("q", access_type="non-exclusive")
    logs = queue_logs(broker.store, "q")
    assert [s.partition for s in logs.logs] == [0, 1, PARENT]
    assert logs.log(PARENT).head == 3


def test_rows_are_checked_before_they_are_decoded(broker):
    pytest.importorskip("pyarrow")
    from partq.spark.rows import arrow_schema, to_batch
    broker.publish_many("q", [(b"payload", "k", {"n": 1, "s": "text", "b": b"\x00"}), (b"two", None)])
    p = partq.key_partition("k", 2)
    qid = queue_logs(broker.store, "q").qid
    records = read_range(broker.store, "q", qid, p, 0, queue_logs(broker.store, "q").log(p).head).records
    with pytest.raises(partq.InvalidConfig, match="has only"):
        read_range(broker.store, "q", qid, p, 0, 1000)
    batch = to_batch("q", p, records, arrow_schema())
    row = batch.to_pylist()[0]
    assert (row["partition"], row["seq"], row["key"], row["payload"]) == (p, 0, "k", b"payload")
    assert dict(row["headers"]) == {"n": "1", "s": "text", "b": '"AA=="'}
    seq, raw = records[0]
    damaged = raw[:-1] + bytes([raw[-1] ^ 1])
    with pytest.raises(partq.CorruptRecord, match="crc32c mismatch"):
        to_batch("q", p, [(seq, damaged)], arrow_schema())
