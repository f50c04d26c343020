"""Helpers of the replication security tests: the shared token, a primary filled with data whose
payloads are recognisable in a byte dump, and hand-written peers that speak the real wire
(``partq.wire``'s handshake and frames) to play the attacker: a standby that lies, a primary
that is not the real one."""
from __future__ import annotations

import os
import socket
import ssl
import struct
import threading

from helpers import wait_until
from repl_helpers import key, payload

import partq
from partq.replication import list_slots
from partq.replication.protocol import MAX_FRAME
from partq.wire.frames import recv_frame, send_frame
from partq.wire.handshake import client_handshake

TOKEN = "replication-token-for-tests-0123456789"
MARKER = b"msg-00000"          # every payload starts with it (repl_helpers.payload)


def primary(path, **kwargs) -> partq.Broker:
    kwargs.setdefault("replication_listen", "127.0.0.1:0")
    kwargs.setdefault("replication_token", TOKEN)
    return partq.Broker.open(path, **kwargs)


def fill(broker: partq.Broker, start: int, count: int, queue: str = "q", batch: int = 200) -> None:
    if not any(q.name == queue for q in broker.queues()):
        broker.create_queue(queue, partitions=3)
    for i in range(start, start + count, batch):
        broker.publish_many(queue, [(payload(j), key(j)) for j in range(i, min(i + batch,
                                                                              start + count))])


def caught_up(p: partq.Broker, n: int = 1) -> bool:
    st = p.replication_status()
    linked = [s for s in st.standbys if s.connected]
    return len(linked) >= n and all(s.acked_lsn >= max(st.head_lsn, 0) for s in linked)


def wait_caught_up(p: partq.Broker, n: int = 1, timeout: float = 30, procs=()) -> None:
    wait_until(lambda: caught_up(p, n), timeout, f"{n} standby(s) to catch up", procs=procs)


def host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def non_loopback_ip() -> str | None:
    """An address of this host that is not loopback (None when it has none)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))          # no packet is sent: it picks the route
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def slot_ids(broker: partq.Broker) -> list[str]:
    return [s["standby_id"] for s in list_slots(broker.store)
            if s["state"] == "active"]


def closed_by_peer(sock: socket.socket, timeout: float = 10) -> bool:
    """Whether the other end ends the connection within ``timeout`` (reading what it sends)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(1 << 16):
            pass
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False
    return True


def read_until_closed(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything the other end sends until it closes (or errs, or ``timeout`` passes)."""
    data = b""
    sock.settimeout(timeout)
    try:
        while chunk := sock.recv(1 << 16):
            data += chunk
    except OSError:
        pass
    return data


def declare_huge_frame(sock: socket.socket) -> None:
    """Send a header that declares a 256 MiB frame and the first MiB of its body. The primary
    may drop the connection before the body is out: a reset here is its refusal, seen early."""
    try:
        sock.sendall(struct.pack(">II", 256 << 20, 0) + b"\0" * (1 << 20))
    except (ConnectionResetError, BrokenPipeError):
        pass


class RawStandby:
    """A peer that passes the handshake (it has the token: an insider, or a stolen token) and
    then does what the test says, frame by frame."""

    def __init__(self, address: str, standby_id: str, token: str | None = TOKEN,
                 applied_lsn: int | None = None, timeline: str | None = None,
                 context: ssl.SSLContext | None = None, **hello) -> None:
        host, port = host_port(address)
        sock = socket.create_connection((host, port), timeout=10)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)
        client_handshake(sock, "replication", token.encode() if token else None, 10,
                         standby_id=standby_id, applied_lsn=applied_lsn, timeline=timeline,
                         **hello)
        sock.settimeout(30)
        self.sock = sock
        self.start = recv_frame(sock, MAX_FRAME)

    def frame(self):
        return recv_frame(self.sock, MAX_FRAME)

    def skip_snapshot(self) -> int:
        """Read (and drop) the snapshot the primary sends; return its LSN."""
        while True:
            frame = self.frame()
            if frame["type"] == "snapshot":
                lsn = frame["lsn"]
            elif frame["type"] == "snapshot_end":
                return lsn

    def ack(self, lsn: int) -> None:
        send_frame(self.sock, {"type": "ack", "lsn": lsn})

    def closed_by_peer(self, timeout: float = 10) -> bool:
        """Whether the primary ends the connection within ``timeout`` (reading what it sends)."""
        return closed_by_peer(self.sock, timeout)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Pump(threading.Thread):
    """Calls ``fn`` until stopped; records what it raised."""

    def __init__(self, fn) -> None:
        super().__init__(daemon=True)
        self.fn = fn
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.fn()
            except BaseException as exc:   # reported by the test
                self.errors.append(exc)
                return

    def end(self) -> None:
        self.stop.set()
        self.join(30)


def snapshot_dirs(path) -> list[str]:
    try:
        return [n for n in os.listdir(path) if n.startswith(".snapshot-")]
    except FileNotFoundError:
        return []


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
