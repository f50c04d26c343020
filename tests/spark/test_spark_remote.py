"""The "partq" Spark source through ``partq serve`` (rule `spark-remote`): ``.option("address", "HOST:PORT")``
with a token instead of a directory. A real ``partq serve`` process on 127.0.0.1 with a token
file, and real local-mode PySpark reading, consuming and writing through it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from spark_helpers import all_messages

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")

import partq

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")

PARTQ_SCRIPT = os.path.join(os.path.dirname(sys.executable), "partq")
TOKEN = "a-spark-test-token-of-32-bytes!!"

@pytest.fixture
def served(tmp_path):
    """A directory with queue "q" (4 partitions, 1,000 messages) served by ``partq serve`` on
    127.0.0.1 with a token file: yields (path, address, token file)."""
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0.0)
        broker.publish_many("q", [(f"m{i}".encode(), f"k{i % 13}", {"i": i} if i % 100 == 0 else None)
                                  for i in range(1_000)])
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    err = open(tmp_path / "serve.err", "w+b")    # closed below
    proc = subprocess.Popen([PARTQ_SCRIPT, "--data", str(path), "serve", "--listen", "127.0.0.1:0",
                             "--token-file", str(token_file), "--json"],
                            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = proc.stdout.readline()            # printed once it listens
        assert line, f"partq serve exited: {open(err.name).read()[-3000:]}"
        yield path, json.loads(line)["listen"], token_file
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.close()


def rows(df) -> list[tuple]:
    return sorted((r.partition, r.seq, r.key, bytes(r.payload),
                   None if r.headers is None else tuple(sorted(r.headers.items())), r.publish_time)
                  for r in df.collect())


def depth(path) -> int:
    with partq.Broker.open(path, create=False, auto_tick=False) as broker:
        return broker.queue_status("q").depth


def test_a_batch_read_through_partq_serve_equals_the_local_read(spark, served):
    path, address, token_file = served
    remote = (spark.read.format("partq").option("address", address).option("tokenFile", str(token_file))
              .option("queue", "q").option("splitRows", "100").load())
    assert remote.rdd.getNumPartitions() >= 10
    local = spark.read.format("partq").option("path", str(path)).option("queue", "q").load()
    got = rows(remote)
    assert len(got) == 1_000 and got == rows(local)
    assert depth(path) == 1_000                          # a read changes nothing


def test_a_wrong_token_is_one_clear_error(spark, served):
    _, address, _ = served
    reader = (spark.read.format("partq").option("address", address)
              .option("token", "not-the-token-but-long-enough").option("queue", "q"))
    with pytest.raises(Exception, match="token"):
        reader.load().collect()


def test_a_stream_through_partq_serve_reads_every_message_once_and_acks_them(spark, served, tmp_path):
    path, address, _ = served
    query = (spark.readStream.format("partq").option("address", address).option("token", TOKEN)
             .option("queue", "q").option("maxMessagesPerTrigger", "400").load()
             .writeStream.format("parquet").option("path", str(tmp_path / "sink"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert not query.isActive and query.exception() is None, query.exception()
    sink = spark.read.parquet(str(tmp_path / "sink")).select("partition", "seq", "payload").collect()
    assert sorted(bytes(r.payload) for r in sink) == sorted(f"m{i}".encode() for i in range(1_000))
    assert len({(r.partition, r.seq) for r in sink}) == 1_000
    assert depth(path) == 0


def test_a_write_through_partq_serve_publishes_each_row_once(spark, served):
    path, address, token_file = served
    df = spark.range(0, 500, 1, 3).selectExpr("concat('w', cast(id as string)) AS body",
                                              "cast(id % 7 as string) AS k")
    (df.write.format("partq").option("address", address).option("tokenFile", str(token_file))
       .option("queue", "q").option("payloadColumn", "body").option("keyColumn", "k")
       .mode("append").save())
    assert depth(path) == 1_500
    written = [payload for _, _, payload in all_messages(path, "q") if payload.startswith(b"w")]
    assert sorted(written) == sorted(f"w{i}".encode() for i in range(500))


@pytest.fixture
def served_tls(tmp_path):
    """Queue "q" (1,000 messages) behind ``partq serve`` with TLS (a certificate for 127.0.0.1
    from a CA the test makes) and a token: yields (address, token file, CA file)."""
    import trustme
    path = tmp_path / "data"
    with partq.Broker.open(path) as broker:
        broker.create_queue("q", partitions=2)
        broker.publish_many("q", [(f"m{i}".encode(), f"k{i}") for i in range(1_000)])
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    proc = subprocess.Popen([PARTQ_SCRIPT, "--data", str(path), "serve", "--listen", "127.0.0.1:0",
                             "--token-file", str(token_file), "--tls-cert", str(tmp_path / "cert.pem"),
                             "--tls-key", str(tmp_path / "key.pem"), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert line, "partq serve exited"
        yield json.loads(line)["listen"], token_file, tmp_path / "ca.pem"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_batch_read_through_partq_serve_with_tls(spark, served_tls):
    address, token_file, ca = served_tls
    df = (spark.read.format("partq").option("address", address).option("tokenFile", str(token_file))
          .option("tls", "true").option("tlsCaFile", str(ca)).option("queue", "q").load())
    assert sorted(bytes(r.payload) for r in df.collect()) == sorted(f"m{i}".encode() for i in range(1_000))
    # without TLS the server's TLS listener drops the handshake: one clear error
    plain = (spark.read.format("partq").option("address", address).option("tokenFile", str(token_file))
             .option("queue", "q"))
    with pytest.raises(Exception, match="TLS|handshake"):
        plain.load().collect()
