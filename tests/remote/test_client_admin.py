"""``partq.connect``'s queue verbs (``create_queue``, ``update_queue``, ``delete_queue``,
``queue_config``, ``queues``, ``scale``, ``kill_message``, ``ack_message``), and ``partq.aio``'s,
against a real ``partq serve`` subprocess on 127.0.0.1: the results a ``Broker`` gives and the
same typed errors with the same words, compared with a ``Broker`` of the same directory in this
process. Each change is logged by the server with the client that made it."""
from __future__ import annotations

import asyncio

import pytest
from serve_process import TOKEN, serving

import partq
import partq.aio
from partq.errors import (
    AuthenticationFailed,
    DeliveryLocked,
    InvalidConfig,
    PartitionNotFound,
    PartqError,
    QueueExists,
    QueueNotFound,
)


@pytest.fixture
def host(tmp_path):
    """A served directory, a client of it and a Broker of it in this process."""
    data = str(tmp_path / "data")
    partq.Broker.open(data).close()
    with serving(data) as served:
        with partq.connect(served.address, token=TOKEN) as client, \
                partq.Broker.open(data) as broker:
            yield served, client, broker


def same_error(remote, local, cls: type[PartqError]) -> str:
    """Both calls raise ``cls`` with the same message; returns it."""
    with pytest.raises(cls) as got:
        remote()
    with pytest.raises(cls) as want:
        local()
    assert str(got.value) == str(want.value)
    return str(got.value)


def test_create_show_update_list_delete_as_the_broker_does(host):
    served, client, broker = host
    config = client.create_queue("orders", partitions=3, max_redelivery=4,
                                 dead_message_queue="orders.dead")
    assert isinstance(config, partq.QueueConfig)
    assert (config.partitions, config.max_redelivery) == (3, 4)
    assert broker.queue_config("orders") == config == client.queue_config("orders")
    same_error(lambda: client.create_queue("orders"), lambda: broker.create_queue("orders"),
               QueueExists)
    assert client.create_queue("orders", partitions=9, exist_ok=True) == config
    same_error(lambda: client.create_queue("x", partitions=0),
               lambda: broker.create_queue("x", partitions=0), InvalidConfig)
    same_error(lambda: client.create_queue("x", colour="red"),
               lambda: broker.create_queue("x", colour="red"), InvalidConfig)
    same_error(lambda: client.create_queue("bad name!"), lambda: broker.create_queue("bad name!"),
               InvalidConfig)

    updated = client.update_queue("orders", ingress_enabled=False, redelivery_delay=2.5)
    assert (updated.ingress_enabled, updated.redelivery_delay) == (False, 2.5)
    assert broker.queue_config("orders") == updated
    same_error(lambda: client.update_queue("orders", partitions=5),
               lambda: broker.update_queue("orders", partitions=5), InvalidConfig)
    same_error(lambda: client.update_queue("nope", ingress_enabled=True),
               lambda: broker.update_queue("nope", ingress_enabled=True), QueueNotFound)

    client.create_queue("orders.dead")
    assert [c.name for c in client.queues()] == [c.name for c in broker.queues()]
    assert all(isinstance(c, partq.QueueConfig) for c in client.queues())

    client.delete_queue("orders")
    assert [c.name for c in broker.queues()] == ["orders.dead"]
    same_error(lambda: client.queue_config("orders"), lambda: broker.queue_config("orders"),
               QueueNotFound)
    same_error(lambda: client.delete_queue("orders"), lambda: broker.delete_queue("orders"),
               QueueNotFound)

    client.close()
    served.proc.terminate()
    served.proc.wait(timeout=60)
    log = served.proc.stderr.read() if served.proc.stderr else ""
    for line in ("created queue 'orders' (3 partitions", "updated queue 'orders':",
                 "deleted queue 'orders'"):
        assert any(line in entry and "127.0.0.1" in entry for entry in log.splitlines()), log


def test_delete_is_refused_while_another_process_delivers_the_queue(host):
    _, client, broker = host
    client.create_queue("busy")
    flow = broker.bind("busy")        # this process runs its delivery, not the server
    with pytest.raises(DeliveryLocked) as refused:
        client.delete_queue("busy")
    assert "queue 'busy' is delivered by pid" in str(refused.value)
    flow.unbind()


def test_kill_and_ack_a_message_by_its_position(host):
    _, client, broker = host
    client.create_queue("jobs", partitions=2, dead_message_queue="jobs.dead")
    client.create_queue("jobs.dead")
    first = client.publish("jobs", b"poison", key="k")
    second = client.publish("jobs", b"next", key="k")
    assert client.kill_message("jobs", first.partition, first.seq) is True
    assert client.kill_message("jobs", first.partition, first.seq) is False
    assert client.ack_message("jobs", second.partition, second.seq) is True
    assert client.ack_message("jobs", second.partition, second.seq) is False
    assert broker.queue_status("jobs.dead").depth == 1
    same_error(lambda: client.kill_message("jobs", 7, 0), lambda: broker.kill_message("jobs", 7, 0),
               PartitionNotFound)
    same_error(lambda: client.ack_message("jobs", -1, 0), lambda: broker.ack_message("jobs", -1, 0),
               InvalidConfig)
    same_error(lambda: client.ack_message("jobs", 0, 1 << 64),
               lambda: broker.ack_message("jobs", 0, 1 << 64), InvalidConfig)
    same_error(lambda: client.kill_message("nope", 0, 0), lambda: broker.kill_message("nope", 0, 0),
               QueueNotFound)


def test_scale_online_and_its_errors(host):
    _, client, broker = host
    client.create_queue("q", partitions=2)
    steps: list[str] = []
    config = client.scale("q", 4, progress=steps.append, online=True)
    assert config.partitions == 4 == broker.queue_config("q").partitions
    assert steps, "the steps reach progress()"
    same_error(lambda: client.scale("q", 0, online=True), lambda: broker.scale("q", 0, online=True),
               InvalidConfig)
    same_error(lambda: client.scale("nope", 2), lambda: broker.scale("nope", 2), QueueNotFound)


def test_admin_verbs_need_the_token(tmp_path):
    data = str(tmp_path / "data")
    partq.Broker.open(data).close()
    with serving(data) as served:
        with pytest.raises(AuthenticationFailed):
            partq.connect(served.address, token="not-the-token-but-long-enough!!")
        with pytest.raises(AuthenticationFailed):
            partq.connect(served.address)


def test_aio_client_has_the_same_verbs(host):
    served, _, broker = host

    async def main() -> None:
        async with await partq.aio.connect(served.address, token=TOKEN) as client:
            config = await client.create_queue("a", partitions=2)
            assert config == await client.queue_config("a")
            assert [c.name for c in await client.queues()] == ["a"]
            assert (await client.update_queue("a", max_redelivery=3)).max_redelivery == 3
            assert (await client.scale("a", 3, online=True)).partitions == 3
            got = await client.publish("a", b"x")
            assert await client.kill_message("a", got.partition, got.seq) is True
            assert await client.ack_message("a", got.partition, got.seq) is False
            with pytest.raises(QueueNotFound):
                await client.queue_config("b")
            await client.delete_queue("a")
    asyncio.run(main())
    assert broker.queues() == []
