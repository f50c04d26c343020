"""spark.read.format("partq") (rule `spark-read`) against real local-mode PySpark and real partq
directories."""
from __future__ import annotations

import pytest
from helpers import drain

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")

import partq
import partq.spark
from partq.ops.browse import browse
from partq.spark.rows import header_map
from partq.storage.encoding import PARENT

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

COLUMNS = "partition, seq, key, payload, headers, unix_micros(publish_time) AS t"


def load(spark, path, queue="q", **options):
    reader = spark.read.format("partq").option("path", str(path)).option("queue", queue)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def rows_of(df) -> list[tuple]:
    return sorted((r.partition, r.seq, r.key, bytes(r.payload),
                   None if r.headers is None else tuple(sorted(r.headers.items())), r.t)
                  for r in df.selectExpr(*COLUMNS.split(", ")).collect())


def inspected(path, queue="q", **kw) -> list[tuple]:
    """What partq inspect shows, as rows_of gives Spark's, the acked messages left out."""
    with partq.Broker.open(path, create=False, auto_tick=False) as broker:
        return sorted((m["partition"], m["seq"], m["key"], m["payload"],
                       None if not m["headers"] else tuple(sorted(header_map(m["headers"]))),
                       m["publish_time_ns"] // 1000)
                      for m in browse(broker.store, queue, limit=0, **kw) if not m["acked"])


def state(path, queue="q") -> dict:
    with partq.Broker.open(path, create=False, auto_tick=False) as broker:
        status = broker.queue_status(queue).as_dict()
        with broker.store.read() as r:
            qid = broker.queue_config(queue).qid
            logs = {p: (r.head(qid, p), r.ack_state(qid, p)) for p in r.partitions(qid)}
    return {"status": status, "logs": logs}


def test_a_batch_read_equals_inspect_and_leaves_the_queue_unchanged(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.0)
        broker.publish_many("q", [(f"m{i}".encode(), f"k{i % 97}", {"i": i, "tag": "x"} if i % 10 == 0
                                   else None) for i in range(10_000)])
        broker.publish_many("q", [b"unkeyed-1", b"unkeyed-2"])
        flow = broker.bind("q", name="earlier")
        got = drain(flow, ack=False, batch=500, max_rounds=2)
        flow.ack_many(got[::3])                 # acked out of order: inspect shows, we do not
        flow.unbind()
    before = state(path)
    df = load(spark, path, splitRows=2_000)
    assert df.rdd.getNumPartitions() >= 8       # 4 partitions of ~2,500 seqs, split by 2,000
    rows = rows_of(df)
    assert len(rows) == 10_002 - len(got[::3])
    assert rows == inspected(path)
    assert {r[2] for r in rows if r[2] is None} == {None}
    assert state(path) == before
    with partq.Broker.open(path) as broker:     # a consumer still gets every unacked message
        fresh = drain(broker.bind("q", name="after"), batch=2_000)
        assert len(fresh) == len(rows)


def test_the_parent_option_reads_the_stranded_parent_queue_messages(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=2, access_type="exclusive", rebalance_delay=0.0)
        broker.publish_many("q", [(f"stranded-{i}".encode(), f"k{i}") for i in range(50)])
        broker.update_queue("q", access_type="non-exclusive")
        broker.publish_many("q", [(f"new-{i}".encode(), f"k{i}") for i in range(20)])
    parent = rows_of(load(spark, path, parent="true"))
    assert [r[3] for r in sorted(parent, key=lambda r: r[1])] == [f"stranded-{i}".encode() for i in range(50)]
    assert {r[0] for r in parent} == {PARENT}
    assert parent == inspected(path, parent=True)
    partitions = rows_of(load(spark, path))
    assert sorted(r[3] for r in partitions) == sorted(f"new-{i}".encode() for i in range(20))


@pytest.fixture
def pushdown(spark):
    """Filters pushed down for this test (the session setting, and the source registered with
    the reader that takes them); back to the default after it."""
    spark.conf.set(partq.spark.source.PUSHDOWN_CONF, "true")
    partq.spark.register(spark)
    yield
    spark.conf.set(partq.spark.source.PUSHDOWN_CONF, "false")
    partq.spark.register(spark)


def test_filters_on_partition_seq_and_key_are_pushed_down(spark, tmp_path, pushdown):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4)
        broker.publish_many("q", [(f"m{i}".encode(), f"k{i % 13}") for i in range(2_000)])
    everything = rows_of(load(spark, path))
    # a DataFrame per query: see test_spark_keeps_a_pushed_down_read_for_the_dataframe
    one = load(spark, path).where("partition = 2 and seq >= 10 and seq < 60")
    assert one.rdd.getNumPartitions() == 1           # pruned before any task runs
    assert rows_of(one) == [r for r in everything if r[0] == 2 and 10 <= r[1] < 60]
    keys = load(spark, path).where("key in ('k1', 'k5') and partition in (0, 1, 3)")
    assert rows_of(keys) == [r for r in everything if r[2] in ("k1", "k5") and r[0] in (0, 1, 3)]
    assert rows_of(load(spark, path).where("seq = 7")) == [r for r in everything if r[1] == 7]
    # filters the source does not take are Spark's to evaluate, with the same answer
    assert rows_of(load(spark, path).where("seq % 100 = 0 or key = 'k2'")) == \
        [r for r in everything if r[1] % 100 == 0 or r[2] == "k2"]


@pytest.mark.xfail(strict=True, reason="PySpark 4.3 keeps the read planned for a pushed-down "
                   "query on the data source a DataFrame shares, so a later query of the same "
                   "DataFrame with no filter to push reads too few rows (fixed upstream in "
                   "PythonScanBuilder: read info scoped to the scan). docs/spark.md says to load "
                   "a DataFrame per query while pushdown is on. When this passes, drop that note.")
def test_spark_keeps_a_pushed_down_read_for_the_dataframe(spark, tmp_path, pushdown):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=2)
        broker.publish_many("q", [(b"m", f"k{i}") for i in range(100)])
    df = load(spark, path)
    assert df.where("seq = 3").count() <= 2
    assert df.count() == 100


def test_an_empty_queue_reads_no_rows(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=3)
    assert load(spark, path).count() == 0


@pytest.mark.parametrize("options, message", [
    ({"queue": "nope"}, "no queue named 'nope'"),
    ({"queue": "q", "parent": "true"}, "no parent-queue log"),
    ({"queue": "q", "fromSeq": "3"}, "unknown option.*fromseq"),
    ({"queue": "q", "splitRows": "0"}, "splitRows must be a positive integer"),
    ({}, "option queue is missing"),
], ids=["unknown-queue", "no-parent-log", "unknown-option", "bad-split", "no-queue"])
def test_bad_input_fails_with_one_clear_error(spark, tmp_path, options, message):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=2)
    reader = spark.read.format("partq").option("path", str(path))
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=message):
        reader.load().collect()


def test_a_missing_directory_is_an_error_and_is_not_created(spark, tmp_path):
    with pytest.raises(Exception, match="does not exist.*check option path"):
        load(spark, tmp_path / "absent").collect()
    assert not (tmp_path / "absent").exists()
