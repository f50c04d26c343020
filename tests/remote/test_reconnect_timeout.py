"""A client whose server is gone for good stops trying after ``reconnect_timeout``: its flows
(``async for`` of partq.aio included) end with ``FlowClosed`` saying why, its requests raise
``ServerUnavailable``. Real servers on 127.0.0.1."""
from __future__ import annotations

import asyncio

import pytest

import partq
import partq.aio
from partq.remote.server import Server

TOKEN = b"a-test-token-of-32-bytes-or-so!!"


@pytest.fixture
def served(tmp_path):
    broker = partq.Broker.open(tmp_path / "data")
    broker.create_queue("q", partitions=2)
    server = Server(broker, "127.0.0.1:0", token=TOKEN)
    yield broker, server
    server.close()
    broker.close()


def test_a_sync_client_gives_up_and_says_so(served):
    broker, server = served
    client = partq.connect(server.address, token=TOKEN, reconnect_timeout=0.5, timeout=60)
    flow = client.bind("q", name="c")
    server.close()
    with pytest.raises(partq.FlowClosed, match="could not reach partq serve"):
        for _ in range(1000):
            flow.receive(10, timeout=0.5)
    with pytest.raises(partq.ServerUnavailable, match="could not reach partq serve"):
        client.publish("q", b"x")
    client.close()


def test_async_for_ends_once_the_client_gave_up(served):
    broker, server = served

    async def consume():
        client = await partq.aio.connect(server.address, token=TOKEN, reconnect_timeout=0.5)
        flow = await client.bind("q", name="a")
        await client.publish("q", b"one", key="k")
        got = []
        with pytest.raises(partq.FlowClosed, match="could not reach partq serve"):
            async for msg in flow:
                got.append(msg.payload)
                await flow.ack(msg)
                server.close()              # the server goes away for good
        assert got == [b"one"]
        await client.close()
    asyncio.run(asyncio.wait_for(consume(), timeout=120))


def test_a_reconnect_timeout_must_be_positive(served):
    with pytest.raises(partq.InvalidConfig, match="reconnect_timeout"):
        partq.connect(served[1].address, token=TOKEN, reconnect_timeout=0)
