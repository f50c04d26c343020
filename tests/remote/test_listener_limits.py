"""Slow and silent peers cannot lock legitimate ones out of a listener: the handshake has one
deadline in all (a peer trickling a byte at a time is cut off when it is up), connections still
in their handshake are bounded and the oldest gives way to a new one, and they never take the
slots of peers that passed the handshake. Real sockets on 127.0.0.1, ``partq serve``'s listener
and the replication listener (the same class)."""
from __future__ import annotations

import socket
import ssl
import threading

import pytest
import trustme
from helpers import wait_until

import partq
from partq.remote.server import Server
from partq.wire.listener import Limits

TOKEN = b"a-test-token-of-32-bytes-or-so!!"


@pytest.fixture
def broker(tmp_path):
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("q", partitions=2)
        yield broker


class Trickle:
    """``n`` connections that each send one byte of a frame header every ``every`` seconds:
    never silent long enough for a per-read timeout, never done."""

    def __init__(self, address: str, n: int, every: float, first: bytes = b"") -> None:
        host, port = address.rsplit(":", 1)
        self.socks = [socket.create_connection((host, int(port))) for _ in range(n)]
        for sock in self.socks:
            sock.sendall(first)
        self.cut = [False] * n
        self._stop = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            for i, sock in enumerate(self.socks):
                if self.cut[i]:
                    continue
                try:
                    sock.sendall(b"\x00")
                except OSError:
                    self.cut[i] = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.socks:
            sock.close()


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_a_trickling_handshake_is_cut_off_at_its_deadline(broker):
    # the per-read timeout (1 s) is never reached: a byte comes every 0.2 s
    server = Server(broker, "127.0.0.1:0", token=TOKEN,
                    limits=Limits(handshake_timeout=1.0, max_handshakes=4))
    trickle = Trickle(server.address, 1, every=0.2)
    try:
        wait_until(lambda: closed_by_peer(trickle.socks[0]), 30,
                   "the trickling peer cut off once its handshake deadline passed")
    finally:
        trickle.close()
        server.close()


def test_the_oldest_tls_handshake_gives_way_to_a_new_connection(broker):
    """The oldest of too many connections in their TLS handshake is cut off at once, long
    before its deadline: TLS takes the connection's descriptor over when it wraps it, so the
    listener cuts it off through a descriptor of its own. Each trickler sends a TLS record
    header that announces 16 KiB, then a byte every 0.2 s."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server = Server(broker, "127.0.0.1:0", token=TOKEN, ssl_context=context,
                    limits=Limits(handshake_timeout=60.0, max_handshakes=2))
    first = Trickle(server.address, 1, every=0.2, first=b"\x16\x03\x01\x40\x00")
    wait_until(lambda: server.listener.connections() == 1, 30, "the first in its handshake")
    later = Trickle(server.address, 2, every=0.2, first=b"\x16\x03\x01\x40\x00")
    try:
        wait_until(lambda: closed_by_peer(first.socks[0]), 20,
                   "the oldest TLS handshake cut off to admit a new one")
        assert not any(closed_by_peer(sock) for sock in later.socks)
    finally:
        first.close()
        later.close()
        server.close()


def test_trickling_peers_never_keep_a_client_out_of_serve(broker):
    limits = Limits(handshake_timeout=30.0, max_handshakes=16, max_connections=4)
    server = Server(broker, "127.0.0.1:0", token=TOKEN, limits=limits)
    trickle = Trickle(server.address, 64, every=0.5)       # four times the handshake slots
    clients = []
    try:
        wait_until(lambda: server.listener.connections() >= 16, 30, "the slots held")
        for i in range(4):      # every authenticated slot, while the attackers keep trickling
            client = partq.connect(server.address, token=TOKEN, ssl=None)
            clients.append(client)
            assert client.publish("q", b"legit %d" % i, key="k").seq >= 0
        assert broker.queue_status("q").depth == 4
        # a fifth client is over max_connections: refused with a reason, not hung
        with pytest.raises(partq.PeerRefused, match="connections already"):
            partq.connect(server.address, token=TOKEN, ssl=None)
    finally:
        for client in clients:
            client.close()
        trickle.close()
        server.close()


def test_trickling_peers_never_keep_a_standby_out(tmp_path):
    primary = partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0",
                                replication_token=TOKEN.decode())
    try:
        primary.create_queue("q", partitions=1)
        primary.publish("q", b"before the standby")
        address = primary.replication_address
        trickle = Trickle(address, 128, every=0.5)
        try:
            wait_until(lambda: sum(trickle.cut) > 0, 60, "the listener cutting off the oldest")
            with partq.Broker.open(tmp_path / "standby", standby_of=address,
                                   replication_token=TOKEN.decode()) as standby:
                wait_until(lambda: standby.replication_status().connected, 60,
                           "the standby connected past the trickling peers")
                # connected comes before the snapshot is loaded: until then there is no queue
                wait_until(lambda: any(c.name == "q" for c in standby.queues())
                           and standby.queue_status("q").depth == 1, 60, "the standby caught up")
        finally:
            trickle.close()
    finally:
        primary.close()


def test_closing_a_listener_ends_connections_still_in_their_handshake(broker):
    server = Server(broker, "127.0.0.1:0", token=TOKEN, limits=Limits(handshake_timeout=60.0))
    trickle = Trickle(server.address, 3, every=0.2)
    wait_until(lambda: server.listener.connections() == 3, 30, "three in their handshake")
    server.close()
    assert all(closed_by_peer(sock) for sock in trickle.socks)
    trickle.close()
