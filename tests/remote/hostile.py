"""Hostile and careless clients of one ``partq serve``, all at once, for the hostile-clients test
and ``bench/hostile.py``: each attack runs in threads of its own until ``stop``; the legitimate
clients publish and consume meanwhile and record every latency and error.

Attacks (each bounded in count; every socket is on 127.0.0.1):
- ``trickle``: connections that send a byte of the handshake every half second;
- ``unread``: an authenticated client that pipelines large requests and reads no answer;
- ``giant``: publishes of three million empty items in one 14 MiB frame, over and over;
- ``hoarder``: binds a flow of a queue with a large backlog and never reads its deliveries;
- ``flows``: binds as many flows as one connection may, over and over.
"""
from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import crc32c
import msgpack

import partq
from partq.wire.frames import HEADER, encode_frame
from partq.wire.handshake import client_handshake

TOKEN = "a-test-token-of-32-bytes-or-so!!"


def start_serve(partq_cmd: str, data: str, token_file: str) -> tuple[subprocess.Popen, str]:
    """``partq serve`` on 127.0.0.1:0 in a process of its own; (the process, its address)."""
    import json
    proc = subprocess.Popen([partq_cmd, "--data", data, "serve", "--listen", "127.0.0.1:0",
                             "--token-file", token_file, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    started = json.loads(proc.stdout.readline())
    return proc, started["listen"]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def raw_session(address: str) -> socket.socket:
    """A connection to ``partq serve`` at ``address`` past its handshake (with ``TOKEN``), on
    which a test writes frames of its own making."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    client_handshake(sock, "serve", TOKEN.encode(), 10, pid=os.getpid(), host="attacker")
    return sock


class Attacks:
    def __init__(self, address: str, stop: threading.Event) -> None:
        self.address, self.stop = address, stop
        self.threads = [threading.Thread(target=f, daemon=True) for f in (
            self.trickle, self.unread, self.giant, self.hoarder, self.flows)]
        self.socks: list[socket.socket] = []
        # what each attack saw the server do to it
        self.seen = {"trickle_cut": 0, "unread_sent": 0, "unread_blocked": 0,
                     "giant_dropped": 0, "flows_refused": 0, "hoarder_bound": 0}

    def all_seen(self) -> bool:
        """Every attack under way: the unread one has sent 300 requests (the server stops
        reading it after about ten thousand status answers, 4 MiB)."""
        return self.seen["unread_sent"] >= 300 and all(
            n for k, n in self.seen.items() if k != "unread_blocked")

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        for s in self.socks:
            s.close()

    def _keep(self, sock: socket.socket) -> socket.socket:
        self.socks.append(sock)
        return sock

    def trickle(self, n: int = 128) -> None:
        host, port = self.address.rsplit(":", 1)
        socks = []
        while not self.stop.is_set():
            while len(socks) < n:
                try:
                    socks.append(self._keep(socket.create_connection((host, int(port)))))
                except OSError:
                    break
            for s in list(socks):
                try:
                    s.sendall(b"\x00")
                except OSError:
                    socks.remove(s)      # cut off: open another in its place
                    self.seen["trickle_cut"] += 1
            self.stop.wait(0.5)

    def unread(self) -> None:
        request = encode_frame({"op": "status", "req": 0, "queue": "q", "pad": b"p" * 60_000})
        while not self.stop.is_set():
            try:
                sock = raw_session(self.address)
            except (OSError, partq.PartqError):     # refused while the trickle holds every
                self.stop.wait(0.2)                 # connection slot: try again
                continue
            sock.settimeout(1.0)
            blocked = False
            try:
                while not self.stop.is_set():
                    try:
                        sock.sendall(request)
                        self.seen["unread_sent"] += 1
                    except TimeoutError:            # the server reads no more of them
                        if not blocked:
                            blocked = True
                            self.seen["unread_blocked"] += 1
            except OSError:
                pass                                # the server dropped the connection
            finally:
                sock.close()

    def giant(self) -> None:
        body = msgpack.packb({"op": "publish", "req": 1, "queue": "q",
                              "items": [[b"", None, None]] * 3_000_000}, use_bin_type=True)
        frame = HEADER.pack(len(body), crc32c.crc32c(body)) + body
        for _ in range(20):
            if self.stop.is_set():
                return
            try:
                sock = self._keep(raw_session(self.address))
                sock.sendall(frame)
                sock.settimeout(30)
                while sock.recv(65536):
                    pass
                self.seen["giant_dropped"] += 1
            except OSError:
                self.seen["giant_dropped"] += 1
            self.stop.wait(0.2)

    def hoarder(self) -> None:
        sock = self._keep(raw_session(self.address))
        sock.sendall(encode_frame({"op": "bind", "req": 1, "queue": "backlog", "name": "hoarder"}))
        self.seen["hoarder_bound"] += 1
        while not self.stop.is_set():            # beats keep it alive; deliveries are never read
            try:
                sock.sendall(encode_frame({"op": "beat"}))
            except OSError:
                return
            self.stop.wait(1.0)

    def flows(self) -> None:
        while not self.stop.is_set():
            try:
                with partq.connect(self.address, token=TOKEN, timeout=10) as client:
                    for _ in range(100):
                        client.bind("other")
            except partq.PartqError:
                self.seen["flows_refused"] += 1     # refused past the limit: the point
            self.stop.wait(0.5)


class Legit:
    """A publisher (batches of 100, each latency recorded) and a consumer (receive + ack)."""

    def __init__(self, address: str, stop: threading.Event) -> None:
        self.address, self.stop = address, stop
        self.latencies: list[float] = []
        self.errors: list[BaseException] = []
        self.published = 0
        self.consumed = 0
        self.threads = [threading.Thread(target=self.publish, daemon=True),
                        threading.Thread(target=self.consume, daemon=True)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def publish(self) -> None:
        try:
            with partq.connect(self.address, token=TOKEN, timeout=30) as client:
                while not self.stop.is_set():
                    batch = [(b"legit-%d" % (self.published + i), f"k{i % 8}") for i in range(100)]
                    t0 = time.perf_counter()
                    client.publish_many("q", batch)
                    self.latencies.append(time.perf_counter() - t0)
                    self.published += len(batch)
        except BaseException as exc:  # recorded: the test fails on any
            self.errors.append(exc)

    def consume(self) -> None:
        try:
            with partq.connect(self.address, token=TOKEN, timeout=30) as client:
                flow = client.bind("q", name="legit-consumer")
                while not self.stop.is_set():
                    msgs = flow.receive(100, timeout=0.2)
                    if msgs:
                        flow.ack_many(msgs)
                        self.consumed += len(msgs)
        except BaseException as exc:  # recorded: the test fails on any
            self.errors.append(exc)
