"""spark.readStream.format("partq") (rule `spark-stream`) end to end: real local-mode PySpark queries with a
checkpoint and a parquet sink, against real partq directories, one of them in a process killed
with SIGKILL mid-stream and restarted."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import drain, wait_until
from spark_helpers import all_messages

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")

import partq

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

STREAM_PROC = Path(__file__).resolve().parent / "stream_proc.py"


def publish(path, start: int, n: int, queue: str = "q") -> None:
    with partq.Broker.open(path, auto_tick=False) as broker:
        broker.publish_many(queue, [(f"m{i}".encode(), f"k{i % 31}") for i in range(start, start + n)])


def payloads(start: int, n: int) -> list[bytes]:
    return [f"m{i}".encode() for i in range(start, start + n)]


def depth(path, queue: str = "q") -> int:
    with partq.Broker.open(path, create=False, auto_tick=False) as broker:
        return broker.queue_status(queue).depth


def sink_rows(spark, sink) -> list[tuple[int, int, bytes]]:
    """(partition, seq, payload) of every row the sink holds, as Spark reads it (files of
    batches the query committed only: its _spark_metadata log)."""
    return sorted((r.partition, r.seq, bytes(r.payload))
                  for r in spark.read.parquet(str(sink)).select("partition", "seq", "payload").collect())


def checkpoint_batches(checkpoint, log: str) -> int:
    return len([f for f in glob.glob(os.path.join(checkpoint, log, "*")) if os.path.basename(f).isdigit()])


def offsets_written(checkpoint) -> list[dict]:
    """The source offset of every micro-batch in the checkpoint's offset log, in batch order."""
    out = []
    files = [f for f in glob.glob(os.path.join(checkpoint, "offsets", "*")) if os.path.basename(f).isdigit()]
    for f in sorted(files, key=lambda f: int(os.path.basename(f))):
        with open(f) as fh:
            out.append(json.loads(fh.read().splitlines()[-1]))
    return out


def stream(spark, path, queue: str = "q", **options):
    reader = spark.readStream.format("partq").option("path", str(path)).option("queue", queue)
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load()


def into_parquet(df, tmp_path, available_now: bool = False):
    writer = (df.writeStream.format("parquet").option("path", str(tmp_path / "sink"))
              .option("checkpointLocation", str(tmp_path / "checkpoint")))
    writer = (writer.trigger(availableNow=True) if available_now
              else writer.trigger(processingTime="100 milliseconds"))
    return writer.start()


def run_available_now(spark, path, tmp_path, **options) -> list[dict]:
    query = into_parquet(stream(spark, path, **options), tmp_path, available_now=True)
    query.awaitTermination(180)
    assert not query.isActive, "an available-now query did not finish in 180 s"
    assert query.exception() is None, query.exception()
    return query.recentProgress


def running(query):
    """For wait_until: fail at once with the query's error when it stopped."""
    def check():
        if not query.isActive:
            raise AssertionError(f"the query stopped: {query.exception()}")
    return check


def test_a_stream_into_parquet_reads_every_message_once_and_the_queue_drains_as_it_commits(
        spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.0)
    publish(path, 0, 2_000)
    query = into_parquet(stream(spark, path), tmp_path)
    try:
        alive = running(query)
        wait_until(lambda: alive() or depth(path) == 0, 90, "the running stream to drain the queue")
        publish(path, 2_000, 1_000)                  # more, while it runs
        wait_until(lambda: alive() or depth(path) == 0, 90, "the stream to drain what came next")
    finally:
        query.stop()
    publish(path, 3_000, 500)                        # more while it is stopped; run again
    run_available_now(spark, path, tmp_path)
    rows = sink_rows(spark, tmp_path / "sink")
    assert sorted(r[2] for r in rows) == sorted(payloads(0, 3_500))     # every message once
    assert len({(p, s) for p, s, _ in rows}) == len(rows)
    assert depth(path) == 0
    # one named consumer across both runs (kept in the checkpoint's offsets)
    assert len({o["consumer"] for o in offsets_written(tmp_path / "checkpoint")}) == 1
    with partq.Broker.open(path) as broker:          # committed means acked: nothing left
        assert drain(broker.bind("q", name="afterwards"), timeout=0.2) == []


def test_max_messages_per_trigger_bounds_each_micro_batch(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.0)
    publish(path, 0, 1_000)
    progress = run_available_now(spark, path, tmp_path, maxMessagesPerTrigger=300)
    sizes = [p["numInputRows"] for p in progress]
    assert sum(sizes) == 1_000 and max(sizes) <= 300, sizes
    assert len([n for n in sizes if n]) == 4, sizes                 # 300, 300, 300, 100
    rows = sink_rows(spark, tmp_path / "sink")
    assert sorted(r[2] for r in rows) == sorted(payloads(0, 1_000))
    assert depth(path) == 0


def test_another_consumer_of_the_queue_never_gets_the_streams_messages(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.0, max_handoff_time=0.5)
        other = broker.bind("q", name="other")
        query = into_parquet(stream(spark, path, consumer="the-stream"), tmp_path)
        try:
            alive = running(query)

            def shared():
                alive()
                holders = {p.partition: p.flow_name for p in broker.queue_status("q").partitions}
                return set(holders.values()) == {"other", "the-stream"} and holders
            holders = wait_until(shared, 90, "the stream and the other consumer to share the queue")
            assert other.partitions == {p for p, name in holders.items() if name == "other"}
            publish(path, 0, 2_000)
            got: list = []

            def done():
                alive()
                got.extend(drain(other, batch=500))
                return broker.queue_status("q").depth == 0
            wait_until(done, 90, "the stream and the other consumer to ack everything")
        finally:
            query.stop()
        other.unbind()
    theirs = {(m.partition, m.seq) for m in got}
    ours = {(p, s) for p, s, _ in sink_rows(spark, tmp_path / "sink")}
    assert theirs and ours and not theirs & ours
    assert len(theirs) + len(ours) == 2_000
    assert {p for p, _ in ours} == {p for p, name in holders.items() if name == "the-stream"}


class StreamProc:
    """stream_proc.py in its own process group (the JVM and Spark's Python workers with it), so
    that a SIGKILL takes all of it down at once, as a crash of the host would."""

    def __init__(self, tmp_path, name: str, *args: str) -> None:
        self.name = name
        self.err = open(tmp_path / f"{name}.err", "w+b")     # closed by kill
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
        self.proc = subprocess.Popen([sys.executable, str(STREAM_PROC), *args],
                                     stdout=subprocess.DEVNULL, stderr=self.err, env=env,
                                     start_new_session=True)

    def tail(self) -> str:
        with open(self.err.name, "rb") as f:
            return f.read()[-6000:].decode(errors="replace")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.err.close()


def test_every_message_lands_once_across_a_query_killed_mid_stream_and_restarted(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.0)
    publish(path, 0, 3_000)
    checkpoint, sink = tmp_path / "checkpoint", tmp_path / "sink"
    args = [str(path), "q", str(checkpoint), str(sink)]
    first = StreamProc(tmp_path, "first-run", *args, "--max", "150")
    try:
        # killed while a micro-batch runs: planned (in the offset log), not yet committed, with
        # earlier ones committed (in the sink and acked, or in the sink and not acked yet)
        wait_until(lambda: checkpoint_batches(checkpoint, "commits") >= 2 and
                   checkpoint_batches(checkpoint, "offsets") > checkpoint_batches(checkpoint, "commits"),
                   120, "the first run to commit two micro-batches and start another", procs=[first])
    finally:
        first.kill()
    killed_batch = checkpoint_batches(checkpoint, "commits")     # the first one not committed
    assert 0 < depth(path) < 3_000                 # mid-stream: some acked, some not
    publish(path, 3_000, 500)
    # restarted with the same checkpoint (here, in this process's warm session: a JVM less to
    # start); it runs the killed micro-batch again, then the rest
    progress = run_available_now(spark, path, tmp_path)
    assert progress[0]["batchId"] == killed_batch
    rows = sink_rows(spark, sink)
    assert sorted(r[2] for r in rows) == sorted(payloads(0, 3_500))
    assert len({(p, s) for p, s, _ in rows}) == len(rows)
    assert depth(path) == 0


def test_partitions_added_while_the_stream_runs_are_read_from_their_first_message(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0.0)
        broker.bind("q", name="owner").unbind()          # this process runs delivery
        publish(path, 0, 400)
        query = into_parquet(stream(spark, path), tmp_path)
        try:
            alive = running(query)
            wait_until(lambda: alive() or broker.queue_status("q").depth == 0, 90, "the first 400")
            broker.scale("q", 4)
            publish(path, 400, 400)
            wait_until(lambda: alive() or broker.queue_status("q").depth == 0, 90,
                       "the messages published after the scale-up")
        finally:
            query.stop()
    rows = sink_rows(spark, tmp_path / "sink")
    assert sorted(r[2] for r in rows) == sorted(payloads(0, 800))
    assert {p for p, _, _ in rows} == {0, 1, 2, 3}


def test_a_queue_deleted_under_a_running_stream_stops_it_with_one_error(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0.0)
        broker.bind("q", name="owner").unbind()          # this process runs delivery
        publish(path, 0, 100)
        query = into_parquet(stream(spark, path), tmp_path)
        try:
            alive = running(query)
            wait_until(lambda: alive() or broker.queue_status("q").depth == 0, 90, "the stream to run")
            broker.delete_queue("q")
            with pytest.raises(Exception, match="QueueNotFound: queue 'q' was deleted while this query"):
                query.awaitTermination(60)
            assert not query.isActive
        finally:
            query.stop()


@pytest.mark.parametrize("options, message", [
    ({"queue": "nope"}, "no queue named 'nope'"),
    ({"queue": "q", "parent": "true"}, "unknown option.*parent"),
    ({"queue": "q", "maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger must be a positive integer"),
    ({"queue": "q", "token": "a-token-of-more-than-16-bytes"}, "option token goes with option address"),
], ids=["unknown-queue", "batch-only-option", "bad-limit", "token-without-address"])
def test_bad_stream_input_fails_the_query_with_one_clear_error(spark, tmp_path, options, message):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=2)
    reader = spark.readStream.format("partq").option("path", str(path))
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=message):
        query = into_parquet(reader.load(), tmp_path, available_now=True)
        query.awaitTermination(60)
        raise AssertionError(f"the query ran: {query.exception()}")


def test_a_scale_down_that_drops_unread_messages_is_data_loss_unless_allowed(spark, tmp_path):
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.0)
    publish(path, 0, 400)
    run_available_now(spark, path, tmp_path)            # read and committed: all 400
    publish(path, 400, 400)
    second = set(payloads(400, 400))
    kept = [v for p, _, v in all_messages(path, "q") if p in (0, 1) and v in second]
    with partq.Broker.open(path) as broker:
        broker.scale("q", 2)                             # partitions 2 and 3 go, unread ones too
    with pytest.raises(Exception, match="PartitionNotFound: partition [23] of queue 'q' was removed"):
        run_available_now(spark, path, tmp_path)
    run_available_now(spark, path, tmp_path, failOnDataLoss="false")
    rows = sink_rows(spark, tmp_path / "sink")
    assert 0 < len(kept) < 400
    assert sorted(r[2] for r in rows) == sorted(payloads(0, 400) + kept)
