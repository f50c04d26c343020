"""The "partq" Spark data source against real local-mode PySpark and real partq directories.

Faults are injected from inside the tasks by subclasses of the real writer. They are defined
inside functions, so cloudpickle ships them to the Python workers by value.
"""
from __future__ import annotations

import datetime
import decimal
import json
import threading
import time

import msgpack
import pytest
from helpers import wait_until
from spark_helpers import all_messages, read_queue

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")

from pyspark.sql import functions as F

import partq
from partq.jobs import staging
from partq.spark import PartqDataSource, PartqWriter

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")


def make_queue(path, name="q", partitions=4):
    with partq.Broker.open(path) as broker:
        broker.create_queue(name, partitions=partitions, rebalance_delay=0.0)


def keyed_frame(spark, n, keys=37, partitions=4):
    return (spark.range(0, n, 1, partitions)
            .select(F.concat(F.lit("key-"), (F.col("id") % keys).cast("string")).alias("key"),
                    F.concat(F.lit("payload-"), F.col("id").cast("string")).cast("binary").alias("body"),
                    F.col("id")))


def save(df, path, queue="q", **options):
    writer = df.write.format("partq").option("path", str(path)).option("queue", queue)
    for k, v in options.items():
        writer = writer.option(k, str(v))
    writer.mode("append").save()


def no_stages(path):
    with partq.Broker.open(path, create=False, auto_tick=False) as broker:
        return staging.list_stages(broker) == []


def register_faulty(spark, name, *, fail_partition, failing_attempts, report_dir=None, gate=None):
    """Register a data source ``name`` whose task ``fail_partition`` raises on its first
    ``failing_attempts`` attempts after staging the first Arrow batch, and whose tasks, when
    ``gate`` is a path, wait after staging everything until that file exists."""
    import os

    from pyspark import TaskContext

    class FaultyWriter(PartqWriter):
        def write(self, iterator):
            ctx = TaskContext.get()
            if ctx.partitionId() == fail_partition and ctx.attemptNumber() < failing_attempts:
                iterator = self._fail_after_first_batch(iterator, ctx)
            message = super().write(iterator)
            # held at the gate until the test opens it (a Spark worker cannot import tests/
            # helpers: cloudpickle ships this class by value, wait_until would go by reference)
            while gate is not None and not os.path.exists(gate):
                time.sleep(0.05)
            return message

        def _fail_after_first_batch(self, iterator, ctx):
            for i, batch in enumerate(iterator):
                if i == 1:
                    with partq.Broker.open(self.path, create=False, auto_tick=False) as b:
                        staged = sum(s.rows for s in staging.list_stages(b)
                                     if s.job_id == self.job_id and s.attempt_id == ctx.taskAttemptId())
                    if report_dir is not None:
                        with open(os.path.join(report_dir, f"attempt-{ctx.taskAttemptId()}.json"), "w") as f:
                            json.dump({"attempt": ctx.attemptNumber(), "staged": staged}, f)
                    raise RuntimeError("injected task failure")
                yield batch

    class FaultySource(PartqDataSource):
        @classmethod
        def name(cls):
            return name

        def writer(self, schema, overwrite):
            return FaultyWriter(**vars(super().writer(schema, overwrite)))

    spark.dataSource.register(FaultySource)


# ---------------------------------------------------------------------- placement and payloads
def test_keyed_rows_land_in_their_key_hash_partition_with_payloads_intact(spark, tmp_path):
    path = tmp_path / "data"
    make_queue(path, partitions=4)
    save(keyed_frame(spark, 2000), path, keyColumn="key", payloadColumn="body", batchSize=100)
    got = all_messages(path, "q")
    assert len(got) == 2000
    for partition, key, _ in got:
        assert partition == partq.key_partition(key, 4)
    expected = {(f"key-{i % 37}", f"payload-{i}".encode()) for i in range(2000)}
    assert {(k, v) for _, k, v in got} == expected
    assert no_stages(path)


def test_string_payloads_unkeyed_rows_and_null_keys(spark, tmp_path):
    path = tmp_path / "data"
    make_queue(path, partitions=3)
    df = spark.createDataFrame([("k1", "héllo ✓"), (None, "no key"), ("k2", "")], "key string, text string")
    save(df, path, keyColumn="key", payloadColumn="text")
    got = {v: (p, k) for p, k, v in all_messages(path, "q")}
    assert set(got) == {"héllo ✓".encode(), b"no key", b""}
    assert got["héllo ✓".encode()] == (partq.key_partition("k1", 3), "k1")
    assert got[b"no key"][1] is None
    save(spark.createDataFrame([("a",), ("b",)], "body string"), path, payloadColumn="body")
    assert sum(1 for _, k, _ in all_messages(path, "q") if k is None) == 3


def test_whole_rows_are_msgpack_maps_without_payload_column(spark, tmp_path):
    path = tmp_path / "data"
    make_queue(path, partitions=2)
    ts = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    df = spark.createDataFrame(
        [("c-1", 7, 2.5, b"\x00\x01", decimal.Decimal("12.34"), datetime.date(2024, 1, 2), ts, [1, 2],
          None, {"a": 1}, ("s", [{"in": 2}]))],
        "customer string, n int, x double, raw binary, amount decimal(10,2), day date, "
        "at timestamp, tags array<int>, missing string, m map<string,int>, "
        "st struct<name: string, maps: array<map<string,int>>>")
    save(df, path, keyColumn="customer")
    [(partition, key, payload)] = all_messages(path, "q")
    assert (partition, key) == (partq.key_partition("c-1", 2), "c-1")
    row = msgpack.unpackb(payload, raw=False)
    assert {k: v for k, v in row.items() if k != "at"} == {
        "customer": "c-1", "n": 7, "x": 2.5, "raw": b"\x00\x01", "amount": "12.34",
        "day": "2024-01-02", "tags": [1, 2], "missing": None, "m": {"a": 1},
        "st": {"name": "s", "maps": [{"in": 2}]}}
    assert datetime.datetime.fromisoformat(row["at"]) == ts


def test_partitions_option_creates_a_missing_queue(spark, tmp_path):
    path = tmp_path / "new-store"
    save(keyed_frame(spark, 300), path, keyColumn="key", payloadColumn="body", partitions=5)
    with partq.Broker.open(path) as broker:
        assert broker.queue_config("q").partitions == 5
    assert len(all_messages(path, "q")) == 300
    # an existing queue keeps its partition count
    save(keyed_frame(spark, 10), path, keyColumn="key", payloadColumn="body", partitions=9)
    with partq.Broker.open(path) as broker:
        assert broker.queue_config("q").partitions == 5


def test_per_key_order_within_a_spark_partition(spark, tmp_path):
    path = tmp_path / "data"
    make_queue(path, partitions=4)
    df = (spark.range(0, 3000, 1, 6)
          .select(F.concat(F.lit("k"), (F.col("id") % 10).cast("string")).alias("key"),
                  F.col("id").cast("string").alias("seq"), F.col("id"))
          .repartition(3, "key").sortWithinPartitions("id"))
    save(df, path, keyColumn="key", payloadColumn="seq", batchSize=64)
    per_key: dict[str, list[int]] = {}
    for _, key, payload in all_messages(path, "q"):
        per_key.setdefault(key, []).append(int(payload))
    assert len(per_key) == 10
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), key
        assert len(seqs) == 300


# ---------------------------------------------------------------------- exactly once
def test_a_retried_task_yields_each_row_exactly_once(spark, tmp_path):
    path = tmp_path / "data"
    reports = tmp_path / "reports"
    reports.mkdir()
    make_queue(path, partitions=4)
    register_faulty(spark, "partq_fail_once", fail_partition=1, failing_attempts=1,
                    report_dir=str(reports))
    df = keyed_frame(spark, 1000)       # 4 Spark partitions of 250 rows, Arrow batches of 50
    (df.write.format("partq_fail_once").option("path", str(path)).option("queue", "q")
       .option("keyColumn", "key").option("payloadColumn", "body").option("batchSize", "10")
       .mode("append").save())
    [report] = [json.loads(p.read_text()) for p in reports.iterdir()]
    assert report == {"attempt": 0, "staged": 50}     # the failed attempt had staged rows
    payloads = [v for _, _, v in all_messages(path, "q")]
    assert len(payloads) == 1000
    assert set(payloads) == {f"payload-{i}".encode() for i in range(1000)}
    assert no_stages(path)


def test_a_failed_job_is_aborted_leaving_the_queue_unchanged(spark, tmp_path):
    path = tmp_path / "data"
    make_queue(path, partitions=4)
    with partq.Broker.open(path) as broker:
        broker.publish_many("q", [(b"before-1", "a"), (b"before-2", "b")])
    before = read_queue(path, "q")
    register_faulty(spark, "partq_fail_always", fail_partition=1, failing_attempts=99)
    with pytest.raises(Exception, match="injected task failure"):
        (keyed_frame(spark, 1000).write.format("partq_fail_always").option("path", str(path))
         .option("queue", "q").option("keyColumn", "key").option("payloadColumn", "body")
         .option("batchSize", "10").mode("append").save())
    assert read_queue(path, "q") == before
    # a cancelled straggler task may still be exiting: its stage goes when it has
    wait_until(lambda: no_stages(path), 10, "every stage of the aborted job to be dropped",
               interval=0.1)


def test_a_bound_consumer_sees_nothing_until_the_job_commits(spark, tmp_path):
    path = tmp_path / "data"
    gate = tmp_path / "gate"
    make_queue(path, partitions=4)
    register_faulty(spark, "partq_gated", fail_partition=-1, failing_attempts=0, gate=str(gate))
    broker = partq.Broker.open(path)
    try:
        flow = broker.bind("q", name="watcher")
        assert flow.partitions == frozenset(range(4))
        errors: list[BaseException] = []

        def job():
            try:
                # Spark looks data sources up in the JVM thread's active session, which a new
                # Python thread does not have.
                spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
                # two Spark partitions: local[2] runs both at once, so both can wait at the gate
                (keyed_frame(spark, 400, partitions=2).write.format("partq_gated").option("path", str(path))
                 .option("queue", "q").option("keyColumn", "key").option("payloadColumn", "body")
                 .mode("append").save())
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)
        thread = threading.Thread(target=job)
        thread.start()
        wait_until(lambda: sum(s.rows for s in staging.list_stages(broker)) >= 400 or errors,
                   120, "both tasks to stage every row", interval=0.1)
        assert errors == []
        assert sum(s.rows for s in staging.list_stages(broker)) == 400    # every row staged ...
        assert flow.receive(100, timeout=0.5) == []                       # ... none delivered
        assert broker.queue_status("q").depth == 0
        gate.write_text("go")
        thread.join(120)
        assert not thread.is_alive() and errors == []
        got = []

        def received_all() -> bool:
            msgs = flow.receive(500, timeout=0.5)
            flow.ack_many(msgs)
            got.extend(msgs)
            return len(got) >= 400
        wait_until(received_all, 10, "the committed job's 400 rows to be delivered", interval=0)
        assert sorted(m.payload for m in got) == sorted(f"payload-{i}".encode() for i in range(400))
        assert not any(m.redelivered for m in got)
    finally:
        gate.write_text("go")
        broker.close()


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize("options, message", [
    ({"queue": "q"}, "option path is missing"),
    ({"path": None}, "option queue is missing"),
    ({"path": None, "queue": "q", "keyColumn": "nope"}, "keyColumn 'nope' is not a column"),
    ({"path": None, "queue": "q", "payloadColumn": "nope"}, "payloadColumn 'nope' is not a column"),
    ({"path": None, "queue": "q", "keyColumn": "id"},
     "keyColumn 'id' has type bigint; partq keys are strings: cast it"),
    ({"path": None, "queue": "q", "payloadColumn": "id"},
     "payloadColumn 'id' has type bigint; it must be binary or string"),
    ({"path": None, "queue": "q", "batchSize": "0"}, "option batchSize must be a positive integer"),
    ({"path": None, "queue": "nope"}, "no queue named 'nope'.*partitions"),
    ({"path": None, "queue": "q", "keyColum": "key"},
     "unknown option.*keycolum.*known: path, queue, .*keyColumn"),
], ids=["no-path", "no-queue", "no-key-column", "no-payload-column", "int-key", "int-payload",
        "bad-batch-size", "missing-queue", "misspelt-option"])
def test_bad_options_fail_with_a_clear_message(spark, tmp_path, options, message):
    path = tmp_path / "data"
    make_queue(path)
    writer = keyed_frame(spark, 10).write.format("partq").mode("append")
    for k, v in options.items():
        writer = writer.option(k, str(path) if v is None else v)
    with pytest.raises(Exception, match=message):
        writer.save()
    assert all_messages(path, "q") == []


def test_a_missing_directory_without_partitions_is_an_error(spark, tmp_path):
    with pytest.raises(Exception, match="does not exist.*partitions"):
        save(keyed_frame(spark, 10), tmp_path / "absent", keyColumn="key", payloadColumn="body")
    assert not (tmp_path / "absent").exists()


def test_only_append_mode_is_supported(spark, tmp_path):
    path = tmp_path / "data"
    make_queue(path)
    with pytest.raises(Exception, match="only appends: use .mode\\('append'\\)"):
        (keyed_frame(spark, 10).write.format("partq").option("path", str(path))
         .option("queue", "q").mode("overwrite").save())


def test_a_null_payload_fails_the_job_and_publishes_nothing(spark, tmp_path):
    path = tmp_path / "data"
    make_queue(path)
    df = spark.createDataFrame([("k", b"x"), ("k", None)], "key string, body binary").coalesce(1)
    with pytest.raises(Exception, match="payloadColumn 'body' is null"):
        save(df, path, keyColumn="key", payloadColumn="body")
    assert all_messages(path, "q") == []
    assert no_stages(path)
