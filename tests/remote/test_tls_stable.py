"""TLS connections to ``partq serve`` stay up under ordinary use (rule `serve`): a client that
receives, acks and publishes over TLS from several threads at once, with large messages that
fill the socket's buffers, keeps its one connection, as over plain TCP. A reading and a writing
thread shared one TLS object; a read that found no data beside a write was taken for the end of
the connection, a few times a second (``partq.wire.tls``)."""
from __future__ import annotations

import asyncio
import logging
import ssl
import threading

import pytest
import trustme
from helpers import wait_until

import partq
import partq.aio
from partq.remote.server import Server
from partq.wire.tls import SerialTLS

TOKEN = "a-test-token-of-32-bytes-or-so!!"
ROUNDS = 1500          # receive + ack + publish rounds per client thread


@pytest.fixture
def tls_server(tmp_path):
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    broker = partq.Broker.open(tmp_path / "data")
    for name in ("a", "b", "c"):
        broker.create_queue(name, partitions=4, rebalance_delay=1.0)
    server = Server(broker, "127.0.0.1:0", token=TOKEN.encode(), ssl_context=server_context)
    yield broker, server, client_context
    server.close()
    broker.close()


def _lost(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name in ("partq.client", "partq.server") and
            ("lost the connection" in r.getMessage() or "disconnected" in r.getMessage())]


def test_mixed_traffic_over_tls_keeps_its_connection(tls_server, caplog):
    broker, server, context = tls_server
    caplog.set_level(logging.INFO)
    failures: list[BaseException] = []

    def loop(queue: str, payload: bytes) -> None:
        try:
            with partq.connect(server.address, token=TOKEN, ssl=context) as client:
                flow = client.bind(queue)
                client.publish_many(queue, [(payload, str(i)) for i in range(50)])
                for i in range(ROUNDS):
                    for msg in flow.receive(max_messages=10, timeout=0.01):
                        flow.ack(msg)
                    client.publish(queue, payload, key=str(i))
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=loop, args=("a", b"s" * 100)),
               threading.Thread(target=loop, args=("b", b"m" * 2000)),
               threading.Thread(target=loop, args=("c", b"L" * 300_000))]  # fills the buffers
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not failures, failures
    # each client closed its own connection once, at its end, and nothing else ended one
    assert [m for m in _lost(caplog) if "closed the connection" not in m] == []


def test_the_asyncio_client_over_tls_keeps_its_connection(tls_server, caplog):
    broker, server, context = tls_server
    caplog.set_level(logging.INFO)

    async def main() -> int:
        got = 0
        async with await partq.aio.connect(server.address, token=TOKEN, ssl=context) as client:
            flow = await client.bind("a")
            for i in range(ROUNDS // 2):
                await client.publish("a", b"x" * 1000, key=str(i % 7))
                for msg in await flow.receive(max_messages=10, timeout=0.01):
                    await flow.ack(msg)
                    got += 1
        return got
    assert asyncio.run(main()) > 0
    assert [m for m in _lost(caplog) if "closed the connection" not in m] == []


def test_a_connection_ended_by_the_server_says_why(tls_server, caplog):
    """The error that ended a connection reaches the log: never hidden."""
    broker, server, context = tls_server
    caplog.set_level(logging.INFO)
    client = partq.connect(server.address, token=TOKEN, ssl=context)
    try:
        server.listener.close()         # every connection ends from the server's side
        wait_until(lambda: any("lost the connection" in m for m in _lost(caplog)), 10,
                   "the client to see its connection end")
        lost = next(m for m in _lost(caplog) if "lost the connection" in m)
        assert "(" in lost and "reconnecting" in lost       # the reason, in brackets
    finally:
        client.close()


def test_serial_tls_refuses_to_be_used_as_a_writable_file(tls_server):
    broker, server, context = tls_server
    import socket
    raw = socket.create_connection(("127.0.0.1", int(server.address.rsplit(":", 1)[1])))
    conn = SerialTLS(context.wrap_socket(raw, server_hostname="127.0.0.1"))
    try:
        with pytest.raises(ValueError):
            conn.makefile("wb")
        assert conn.gettimeout() is None
        conn.settimeout(0.2)
        with pytest.raises(TimeoutError):     # the server's hello is read; then nothing comes
            stream = conn.makefile("rb", 1 << 16)
            for _ in range(100_000):
                stream.read(1)
    finally:
        conn.close()
