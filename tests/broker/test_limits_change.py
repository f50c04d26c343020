"""A queue's message limits changed by another process hold at once in every process that has
the queue open (rule `limits`): after `partq queue update q --max-message-size 1000
--max-key-size 8` run as a real command, a process that had published (so cached the queue's
config) refuses a too-large message or key with ``InvalidMessage`` on every publish path, and
so does ``partq serve`` for its clients; a raised limit holds at once too. Real LMDB
directories, the real ``partq`` command in subprocesses, a real listener on 127.0.0.1."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import partq
from partq.jobs.staging import new_job_id, stage_rows

PARTQ_SCRIPT = os.path.join(os.path.dirname(sys.executable), "partq")
TOKEN = "a-limits-test-token-of-32-bytes!"
BIG = b"x" * (1 << 20)          # 1 MiB
LONG_KEY = "k" * 200


def update_queue(data, *options) -> None:
    """``partq queue update q OPTIONS`` in a process of its own."""
    env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    done = subprocess.run([PARTQ_SCRIPT, "--data", str(data), "queue", "update", "q",
                           *map(str, options)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr


def lower(data) -> None:
    update_queue(data, "--max-message-size", 1000, "--max-key-size", 8)


def raise_again(data) -> None:
    update_queue(data, "--max-message-size", 2 << 20, "--max-key-size", 1024)


def refused(call, *args) -> str:
    """The message of the ``InvalidMessage`` that ``call(*args)`` raises."""
    with pytest.raises(partq.InvalidMessage) as info:
        call(*args)
    return str(info.value)


def publish_each(broker: partq.Broker, payload: bytes, key: str) -> None:
    """``publish_each_async`` of a small message and this one: the small one goes in whatever
    happens; this one's error, when it has one, is raised."""
    results = broker.publish_each_async("q", [(b"fits", "k", None), (payload, key, None)]).result()
    assert not results[0].discarded
    if isinstance(results[1], partq.PartqError):
        raise results[1]


PATHS = {
    "publish": lambda b, payload, key: b.publish("q", payload, key=key),
    "publish_async": lambda b, payload, key: b.publish_async("q", payload, key=key).result(),
    "publish_many": lambda b, payload, key: b.publish_many("q", [(b"fits", "k"), (payload, key)]),
    "publish_many_async": lambda b, payload, key: b.publish_many_async(
        "q", iter([(payload, key)])).result(),
    "checkpointed": lambda b, payload, key: b.publish_many("q", [(payload, key)],
                                                           checkpoint=("copy", 1)),
    "publish_each": publish_each,
    "stage": lambda b, payload, key: stage_rows(b, "q", new_job_id(), 0, 1, [(payload, key)]),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("what", ["payload", "key"])
def test_limits_lowered_by_another_process_hold_at_once_on_every_publish_path(tmp_path, what):
    data = tmp_path / "data"
    brokers = {name: partq.Broker.open(data) for name in PATHS}
    try:
        brokers["publish"].create_queue("q", partitions=2)
        for broker in brokers.values():             # each has the queue's config cached
            broker.publish("q", BIG, key=LONG_KEY)
        lower(data)
        payload, key = (BIG, "k") if what == "payload" else (b"small", LONG_KEY)
        expected = "max_message_size=1000" if what == "payload" else "max_key_size=8"
        depth = brokers["publish"].queue_status("q").depth
        for name, call in PATHS.items():
            assert expected in refused(call, brokers[name], payload, key), name
        # nothing of the refused publishes went in but publish_each's small one
        assert brokers["publish"].queue_status("q").depth == depth + 1
        assert brokers["checkpointed"].checkpoint("q", "copy") is None
        # raised again by another process: the lowered limits this process now knows give way
        raise_again(data)
        for name, call in PATHS.items():
            call(brokers[name], BIG, LONG_KEY)
    finally:
        for broker in brokers.values():
            broker.close()


@pytest.mark.timeout(120)
def test_partq_serve_refuses_what_limits_lowered_by_another_process_refuse(tmp_path):
    from partq.remote.server import Server
    from partq.spark.access import RemoteJobs
    from partq.spark.options import Where
    data = tmp_path / "data"
    broker = partq.Broker.open(data)
    server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
    try:
        broker.create_queue("q", partitions=2)
        with partq.connect(server.address, token=TOKEN) as client, \
                RemoteJobs(Where("q", address=server.address, token=TOKEN.encode())) as jobs:
            client.publish("q", BIG, key=LONG_KEY)          # the server caches the config
            client.publish_many("q", [(BIG, LONG_KEY)] * 2)
            stager = jobs.stager(new_job_id(), 0, 1, 100)
            stager.add_many([BIG], [LONG_KEY])
            assert stager.close() == 1
            depth = broker.queue_status("q").depth
            lower(data)
            assert "max_message_size=1000" in refused(lambda: client.publish("q", BIG, key="k"))
            assert "max_key_size=8" in refused(lambda: client.publish("q", b"s", key=LONG_KEY))
            assert "max_message_size=1000" in refused(
                lambda: client.publish_many("q", [(b"fits", "k"), (BIG, "k")]))
            stager = jobs.stager(new_job_id(), 0, 1, 100)
            stager.add_many([b"s"], [LONG_KEY])
            assert "max_key_size=8" in refused(stager.close)
            assert broker.queue_status("q").depth == depth
            client.publish("q", b"fits", key="k")
            raise_again(data)
            client.publish("q", BIG, key=LONG_KEY)
            assert broker.queue_status("q").depth == depth + 2
    finally:
        server.close()
        broker.close()
