"""Consumers and publishers on other hosts (rules `serve`, `liveness` and `listener-security`):
``partq serve`` and ``partq.connect``
over real sockets on 127.0.0.1, with a token proven by challenge-response, real TLS with a
certificate made by the test, and connections cut by a real TCP proxy in between."""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import subprocess
import threading

import pytest
import trustme
from helpers import drain, wait_until
from tools_helpers import PARTQ_SCRIPT

import partq
import partq.aio
from partq.remote.server import Server
from partq.wire.listener import Limits

TOKEN = "a-test-token-of-32-bytes-or-so!!"


@pytest.fixture
def served(tmp_path):
    """A broker with a queue, and ``serve(**kw)`` starting a Server on 127.0.0.1:0."""
    broker = partq.Broker.open(tmp_path / "data")
    broker.create_queue("q", partitions=4, rebalance_delay=1.0, max_handoff_time=0.5)
    servers: list[Server] = []

    def serve(**kw) -> Server:
        kw.setdefault("token", TOKEN.encode())
        server = Server(broker, "127.0.0.1:0", **kw)
        servers.append(server)
        return server
    yield broker, serve
    for server in servers:
        server.close()
    broker.close()


class Proxy:
    """A TCP proxy on 127.0.0.1 whose connections the test can cut (a network drop); with
    ``drop_on`` set, the next connection whose client sends those bytes is cut as they pass
    (once: a network that drops again while the client recovers)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.drop_on: bytes | None = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.pairs.append((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b, a is client),
                                 daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket, upstream: bool) -> None:
        try:
            while data := a.recv(65536):
                if upstream and self.drop_on is not None and self.drop_on in data:
                    self.drop_on = None
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Cut the connections open now (taken before the first is cut: the client's
        reconnect, which may come before this returns, is not cut too)."""
        pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.cut()
        self.sock.close()


def test_publish_and_consume_through_the_server(served):
    broker, serve = served
    server = serve()
    with partq.connect(server.address, token=TOKEN) as client:
        first = client.publish("q", b"one", key="k1")
        assert not first.discarded
        results = client.publish_many("q", [(b"two", "k2"), b"three", (b"four", "k4", {"h": 1})])
        assert len(results) == 3
        pending = [client.publish_async("q", b"p%d" % i, key=f"k{i}") for i in range(200)]
        assert len({(r.partition, r.seq) for r in (p.result() for p in pending)}) == 200
        assert broker.queue_status("q").depth == 204            # durable on the server
        flow = client.bind("q", name="remote")
        assert flow.partitions == frozenset(range(4))
        got = drain(flow, timeout=0.5, at_least=204)
        assert sorted(m.payload for m in got) == sorted(
            [b"one", b"two", b"three", b"four"] + [b"p%d" % i for i in range(200)])
        assert next(m for m in got if m.payload == b"four").headers == {"h": 1}
        assert client.queue_status("q").depth == 0
        status = broker.queue_status("q")
        assert [f.name for f in status.flows] == ["remote"] and status.flows[0].bound
    wait_until(lambda: not broker.queue_status("q").flows[0].bound, timeout=10,
               what="the closed connection unbinds its flow")


def test_a_connection_busy_with_its_acks_holds_up_no_other_connections_pushes(served):
    """The server's one pump thread pushes to every connection. While a connection's own
    thread serves its flow (after its client's acks, whose commit may be slow: a slow disk,
    another process holding the write lock), the pump thread passes that flow by instead of
    waiting for it, and comes back to it afterwards."""
    broker, serve = served
    broker.create_queue("other", partitions=1)
    server = serve()
    with partq.connect(server.address, token=TOKEN) as a, \
            partq.connect(server.address, token=TOKEN) as b:
        flow_a, flow_b = a.bind("q"), b.bind("other")
        pumps = server.pumps._pumps           # the test stands in for A's connection thread:
        wait_until(lambda: len(pumps) == 2, 10, "both flows served")
        busy = next(p for p in pumps if p.flow.queue == "q")
        with busy._serving:                   # A's thread inside its acks' commit, for long
            broker.publish("q", b"for a", key="ka")
            broker.publish("other", b"for b", key="kb")
            assert [m.payload for m in flow_b.receive(10, timeout=30.0)] == [b"for b"]
            assert flow_a.receive(10, timeout=0.2) == []     # A's pushes wait for its thread
        got = flow_a.receive(10, timeout=30.0)
        assert [m.payload for m in got] == [b"for a"]      # and come once it is done


def test_a_wrong_token_or_none_is_refused_and_reads_nothing(served):
    broker, serve = served
    broker.publish("q", b"secret", key="k")
    server = serve()
    with pytest.raises(partq.AuthenticationFailed, match="refused the token"):
        partq.connect(server.address, token="x" * 32)
    with pytest.raises(partq.AuthenticationFailed, match="needs a token"):
        partq.connect(server.address)
    # a raw peer that skips the handshake gets nothing but the server's hello
    with socket.create_connection(("127.0.0.1", int(server.address.split(":")[1]))) as raw:
        raw.settimeout(10)
        body = b'\x81\xa2op\xa7publish'
        raw.sendall(struct.pack(">II", len(body), 0) + body)
        data = b""
        try:
            while chunk := raw.recv(65536):
                data += chunk
        except OSError:
            pass
    assert b"secret" not in data
    assert broker.queue_status("q").depth == 1 and not broker.queue_status("q").flows


def test_protected_mode_without_a_token_serves_loopback(served):
    broker, serve = served
    server = serve(token=None)
    with partq.connect(server.address) as client:
        assert not client.publish("q", b"x").discarded
    with pytest.raises(partq.AuthenticationFailed, match="protected mode"):
        partq.connect(server.address, token=TOKEN)


def test_tls_with_a_certificate_made_by_the_test(served, tmp_path):
    broker, serve = served
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    server = serve(ssl_context=server_context)
    with partq.connect(server.address, token=TOKEN, ssl=client_context) as client:
        client.publish("q", b"over-tls", key="k")
        flow = client.bind("q")
        assert [m.payload for m in drain(flow, timeout=0.5, at_least=1)] == [b"over-tls"]
    with pytest.raises(partq.ServerUnavailable):          # plaintext to a TLS listener
        partq.connect(server.address, token=TOKEN, timeout=3)
    untrusting = ssl.create_default_context()            # a CA the client does not trust
    with pytest.raises(partq.ServerUnavailable):
        partq.connect(server.address, token=TOKEN, ssl=untrusting, timeout=3)


def test_bad_frames_cost_only_their_own_connection(served):
    broker, serve = served
    server = serve(limits=Limits(max_frame=1 << 16, handshake_timeout=1.0))
    good = partq.connect(server.address, token=TOKEN)
    host, port = "127.0.0.1", int(server.address.split(":")[1])
    for junk in (b"\xff" * 64, struct.pack(">II", 1 << 30, 0), b"GET / HTTP/1.1\r\n\r\n"):
        with socket.create_connection((host, port)) as raw:
            raw.settimeout(10)
            raw.sendall(junk)
            try:
                while raw.recv(65536):
                    pass
            except OSError:
                pass
    with socket.create_connection((host, port)) as stall:      # stalls in the handshake
        stall.settimeout(10)
        stall.sendall(struct.pack(">II", 100, 0) + b"partial")
        assert stall.recv(65536)                               # the server's hello
        try:
            while stall.recv(65536):
                pass
        except OSError:
            pass
    with pytest.raises(partq.InvalidMessage):                  # over the limit: refused
        good.publish_many("q", [b"x" * (2 << 20)])
    assert not good.publish("q", b"still-served").discarded
    good.close()


def test_a_dropped_connection_reconnects_and_keeps_its_partitions(served):
    broker, serve = served
    server = serve()
    proxy = Proxy(server.address)
    try:
        local = broker.bind("q", name="local")
        client = partq.connect(proxy.address, token=TOKEN)
        remote = client.bind("q", name="remote")
        wait_until(lambda: len(remote.partitions) == 2 and broker.queue_status("q")
                   .rebalance_status == "Ready", timeout=30, what="a 2/2 split")
        before = remote.partitions
        proxy.cut()
        wait_until(lambda: any(f.name == "remote" and f.bound and f.flow != remote.flow_id
                               for f in broker.queue_status("q").flows) or
                   remote.flow_id not in {f.flow for f in broker.queue_status("q").flows},
                   timeout=30, what="the server saw the drop")
        wait_until(lambda: any(f.name == "remote" and f.bound
                               for f in broker.queue_status("q").flows),
                   timeout=30, what="the client bound again")
        assert remote.partitions == before and local.partitions == frozenset(range(4)) - before
        broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(40)])
        got: set[bytes] = set()        # split between the two flows: drained until all came
        wait_until(lambda: got.update(m.payload for m in drain(remote) + drain(local))
                   or len(got) >= 40, timeout=30, what="the 40 messages")
        assert len(got) == 40
        client.close()
    finally:
        proxy.close()


def test_a_connection_dropped_again_while_the_client_binds_again_loses_no_flow(served):
    broker, serve = served
    proxy = Proxy(serve().address)
    try:
        client = partq.connect(proxy.address, token=TOKEN)
        remote = client.bind("q", name="remote")
        proxy.drop_on = b"bind"             # the next bind request (the rebind) is cut
        proxy.cut()
        wait_until(lambda: proxy.drop_on is None, timeout=30, what="the rebind cut")
        wait_until(lambda: any(f.name == "remote" and f.bound
                               for f in broker.queue_status("q").flows),
                   timeout=30, what="the client bound again on a third connection")
        broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(20)])
        assert len({m.payload for m in drain(remote, timeout=0.5, at_least=20)}) == 20
        client.close()
    finally:
        proxy.close()


def test_no_server_and_another_protocol_are_one_line_errors(tmp_path):
    spare = socket.create_server(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()
    with pytest.raises(partq.ServerUnavailable, match="cannot reach"):
        partq.connect(f"127.0.0.1:{port}", token=TOKEN, timeout=2)
    with socket.create_server(("127.0.0.1", 0)) as other:     # not partq: speaks first, junk
        def speak():
            conn, _ = other.accept()
            conn.sendall(struct.pack(">II", 3, 0) + b"abc")
            conn.close()
        threading.Thread(target=speak, daemon=True).start()
        with pytest.raises((partq.ProtocolMismatch, partq.ServerUnavailable)):
            partq.connect(f"127.0.0.1:{other.getsockname()[1]}", token=TOKEN, timeout=2)


def test_a_queue_deleted_while_bound_closes_the_remote_flow(served):
    broker, serve = served
    server = serve()
    with partq.connect(server.address, token=TOKEN) as client:
        flow = client.bind("q")
        broker.delete_queue("q")
        with pytest.raises(partq.FlowClosed, match="deleted"):
            for _ in range(100):               # each receive waits at most 0.2 s
                flow.receive(10, timeout=0.2)


def test_the_asyncio_client(served):
    broker, serve = served
    server = serve()

    async def main() -> list[bytes]:
        async with await partq.aio.connect(server.address, token=TOKEN) as client:
            await client.publish("q", b"a1", key="k")
            await client.publish_many("q", [(b"a2", "k"), (b"a3", "k")])
            flow = await client.bind("q", name="aio")
            got = []
            async for msg in flow:
                got.append(msg.payload)
                await flow.ack(msg)
                if len(got) == 3:
                    await flow.unbind()
            return got
    assert asyncio.run(main()) == [b"a1", b"a2", b"a3"]
    assert broker.queue_status("q").depth == 0


def test_partq_serve_runs_until_sigterm(tmp_path):
    data = tmp_path / "data"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2)
    proc = subprocess.Popen([PARTQ_SCRIPT, "--data", str(data), "serve", "--listen",
                             "127.0.0.1:0", "--token-file", str(token_file), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
        assert started["token"] and started["queues"] == ["q"]
        with partq.connect(started["listen"], token=TOKEN) as client:
            client.publish("q", b"via-serve", key="k")
            flow = client.bind("q")
            assert [m.payload for m in drain(flow, timeout=0.5, at_least=1)] == [b"via-serve"]
        proc.send_signal(15)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "connected" in err and "disconnected" in err and "bound flow" in err


def test_ack_through_over_the_connection(served):
    broker, serve = served
    server = serve()
    broker.publish_many("q", [(b"m%d" % i, "one-key") for i in range(10)])
    with partq.connect(server.address, token=TOKEN) as client:
        flow = client.bind("q", name="ranges")
        p = partq.key_partition("one-key", 4)
        flow.ack_through(p, 5).result()
        assert broker.queue_status("q").partitions[p].ack_floor == 6
        assert [m.seq for m in drain(flow, timeout=0.5, at_least=4)] == [6, 7, 8, 9]
