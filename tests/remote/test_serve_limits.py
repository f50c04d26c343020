"""What one client of ``partq serve`` may cost it: large messages reach remote consumers in
deliver frames of bounded size, a batch is bounded in items and every array of a request as it
is decoded, a connection is bounded in flows, answers the client does not read stop the server
reading its requests, and a named flow whose client reconnected before the server saw the old
connection end is taken over by the new connection. Real sockets on 127.0.0.1."""
from __future__ import annotations

import socket
import threading

import crc32c
import msgpack
import pytest
from helpers import drain, wait_until

import partq
from partq.remote.server import Server
from partq.wire.frames import HEADER, encode_frame
from partq.wire.handshake import client_handshake
from partq.wire.listener import Limits

TOKEN = b"a-test-token-of-32-bytes-or-so!!"


@pytest.fixture
def broker(tmp_path):
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=1, rebalance_delay=0.2, max_handoff_time=0.2)
        yield broker


def raw_client(address: str) -> socket.socket:
    """A connection that passed the real handshake, for requests the client API never sends."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)
    client_handshake(sock, "serve", TOKEN, 30, pid=1, host="raw")
    return sock


def closed(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        while True:
            if not sock.recv(1 << 20):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_large_messages_reach_a_remote_consumer(broker):
    payload = b"x" * (1 << 20)
    broker.publish_many("q", [(payload, f"k{i}") for i in range(100)])     # 100 MiB, one partition
    server = Server(broker, "127.0.0.1:0", token=TOKEN)
    try:
        with partq.connect(server.address, token=TOKEN) as client:
            flow = client.bind("q", name="big")
            got = drain(flow, timeout=1.0, batch=10, at_least=100)
            assert [m.key for m in got] == [f"k{i}" for i in range(100)]
            assert all(m.payload == payload for m in got)
            assert broker.queue_status("q").depth == 0
    finally:
        server.close()


def test_a_batch_is_bounded_in_items_and_in_decoded_arrays(broker):
    server = Server(broker, "127.0.0.1:0", token=TOKEN, limits=Limits(max_batch=100))
    try:
        with partq.connect(server.address, token=TOKEN) as client:
            with pytest.raises(partq.InvalidMessage, match="over this server's limit of 100"):
                client.publish_many("q", [b"m"] * 101)
            # three million empty items in one 14 MiB frame: refused as it is decoded, and the
            # connection that sent it ends; nobody else notices
            sock = raw_client(server.address)
            body = msgpack.packb({"op": "publish", "req": 1, "queue": "q",
                                  "items": [[b"", None, None]] * 3_000_000}, use_bin_type=True)
            sock.sendall(HEADER.pack(len(body), crc32c.crc32c(body)) + body)
            wait_until(lambda: closed(sock), 60, "the connection that sent it closed")
            sock.close()
            assert client.publish("q", b"after", key="k").seq == 0
            assert broker.queue_status("q").depth == 1
    finally:
        server.close()


def test_a_connection_is_bounded_in_flows(tmp_path):
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=8)
        server = Server(broker, "127.0.0.1:0", token=TOKEN, limits=Limits(max_flows=3))
        try:
            with partq.connect(server.address, token=TOKEN) as client:
                flows = [client.bind("q") for _ in range(3)]
                with pytest.raises(partq.InvalidConfig, match="3 flows bound"):
                    client.bind("q")
                flows[0].unbind()
                client.bind("q")                       # a slot was freed
        finally:
            server.close()


def test_answers_the_client_does_not_read_stop_its_requests_being_read(broker):
    """A client pipelines large requests and reads none of the answers: once the answers
    pending for it pass the bound, the server stops reading its requests (its sends block),
    and after the idle timeout it closes the connection."""
    limits = Limits(max_pending_bytes=64 << 10, idle_timeout=3.0)
    server = Server(broker, "127.0.0.1:0", token=TOKEN, limits=limits)
    sock = raw_client(server.address)
    request = encode_frame({"op": "status", "req": 0, "queue": "q", "pad": b"p" * 60_000})
    sock.settimeout(2.0)

    def send_blocks() -> bool:
        """Whether a request can no longer be sent (the kernel's buffers are full because
        the server reads no more); each try sends up to 50 whole requests."""
        for _ in range(50):
            try:
                sock.sendall(request)
            except TimeoutError:
                return True
        return False
    try:
        wait_until(send_blocks, 120, "the server to stop reading the client's requests")
        wait_until(lambda: server.listener.connections() == 0, 60,
                   "the server closing a connection that reads nothing")
    finally:
        sock.close()
        server.close()


class HalfProxy:
    """A TCP proxy whose client sides the test can cut while the server sides stay open: the
    server does not learn that the client went away (a dropped route, a NAT timeout)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.clients: list[socket.socket] = []
        self.servers: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.clients.append(client)
            self.servers.append(server)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket, to_server: bool) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        if not to_server:               # never pass a client's end on to the server
            try:
                b.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut_clients(self) -> None:
        for s in self.clients:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.cut_clients()
        for s in self.servers:
            s.close()
        self.sock.close()


def test_a_named_flow_that_reconnects_replaces_its_own_stale_session(broker):
    broker.publish_many("q", [(b"m%d" % i, "k") for i in range(10)])
    server = Server(broker, "127.0.0.1:0", token=TOKEN)
    proxy = HalfProxy(server.address)
    try:
        with partq.connect(proxy.address, token=TOKEN) as client:
            flow = client.bind("q", name="svc")
            first = drain(flow, timeout=0.5, at_least=10)
            assert len(first) == 10
            broker.publish_many("q", [(b"n%d" % i, "k") for i in range(5)])
            proxy.cut_clients()          # the server still holds the old session and its flow
            got = drain(flow, timeout=0.5, at_least=5)
            # the old connection may have been pushed some of them: they come again, marked
            assert [m.payload for m in got] == [b"n%d" % i for i in range(5)]
            assert not flow.closed
            assert [f.name for f in broker.queue_status("q").flows if f.bound] == ["svc"]
    finally:
        proxy.close()
        server.close()


def test_a_large_ack_many_goes_in_requests_within_the_servers_bound(broker, monkeypatch):
    from partq.remote import endpoint
    monkeypatch.setattr(endpoint, "ACK_CHUNK", 100)
    broker.publish_many("q", [(b"m%d" % i, "k") for i in range(250)])
    server = Server(broker, "127.0.0.1:0", token=TOKEN)
    try:
        with partq.connect(server.address, token=TOKEN) as client:
            flow = client.bind("q", name="acker")
            got = drain(flow, ack=False, timeout=0.5, at_least=250)
            assert len(got) == 250
            flow.ack_many(got)                              # three requests, one answer
            assert flow.unacked == 0
            assert broker.queue_status("q").depth == 0
    finally:
        server.close()
