#!/usr/bin/env python3
"""The least a socket server over partq does: the "limit" line of ``partq serve`` (bench/remote.py).

A threaded TCP server on 127.0.0.1 over the public ``partq.Broker`` API (``Broker.open(dir)``,
``publish_many``, ``bind`` -> ``receive`` / ``ack_many``), one thread per connection, frames
of a 4-byte big-endian length and a msgpack body, one request and one reply per batch:

* ``["pub", queue, [[payload, key], ...]]`` -> ``["ok", n]`` once ``publish_many`` returned
  (durable: the broker's default ``durability="sync"``, as ``partq serve``).
* ``["bind", queue, name]`` -> ``["ok"]``: this connection's flow.
* ``["fetch", n, timeout, acks]`` -> ``["msgs", [[partition, seq, key, payload], ...]]``: first
  ``ack_many`` of ``acks`` (``[[partition, seq], ...]`` of messages this connection received),
  then ``receive(n)``. When acks rode on the request and nothing is ready, the reply is
  immediate (empty) so the client knows when its last acks became durable; otherwise
  ``receive`` waits up to ``timeout``.

No authentication, no TLS, no flow control, no limits: a bound, not a product.

    .venv/bin/python bench/reference_server.py --data DIR [--listen 127.0.0.1:0]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import time

import msgpack

import partq

HEADER = struct.Struct(">I")


def send_frame(sock: socket.socket, obj) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(HEADER.pack(len(body)) + body)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket):
    (size,) = HEADER.unpack(_read_exact(sock, HEADER.size))
    return msgpack.unpackb(_read_exact(sock, size), raw=False)


# ---------------------------------------------------------------------------- the server
class Handler(socketserver.BaseRequestHandler):
    server: Server

    def handle(self) -> None:
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        broker, flow = self.server.broker, None
        held: dict[tuple[int, int], partq.Message] = {}
        try:
            while True:
                try:
                    req = recv_frame(sock)
                except ConnectionError:
                    return
                op = req[0]
                if op == "pub":
                    broker.publish_many(req[1], [(p, k) for p, k in req[2]])
                    send_frame(sock, ["ok", len(req[2])])
                elif op == "bind":
                    flow = broker.bind(req[1], name=req[2])
                    send_frame(sock, ["ok"])
                elif op == "fetch":
                    assert flow is not None, "fetch before bind"
                    n, timeout, acks = req[1], req[2], req[3]
                    acked = len(acks)
                    if acks:
                        try:
                            flow.ack_many([held.pop((p, s)) for p, s in acks])
                        except partq.FlowFenced as exc:     # a partition moved meanwhile
                            acked -= len(exc.messages)
                    msgs = flow.receive(n, timeout=0) if n else []
                    if not msgs and not acks and n:
                        msgs = flow.receive(n, timeout=timeout)
                    for m in msgs:
                        held[(m.partition, m.seq)] = m
                    send_frame(sock, ["msgs", [[m.partition, m.seq, m.key, m.payload]
                                               for m in msgs], acked])
                else:
                    send_frame(sock, ["error", f"unknown request {op!r}"])
        finally:
            if flow is not None:
                flow.unbind()


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], broker: partq.Broker) -> None:
        self.broker = broker
        super().__init__(address, Handler)


def serve(data: str, host: str, port: int) -> None:
    broker = partq.Broker.open(data)
    server = Server((host, port), broker)

    def stop(*_) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    print(json.dumps({"listen": "{}:{}".format(*server.server_address[:2])}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        broker.close()


# ---------------------------------------------------------------------------- the client
class RefClient:
    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, *req):
        send_frame(self.sock, list(req))
        reply = recv_frame(self.sock)
        if reply[0] == "error":
            raise RuntimeError(reply[1])
        return reply

    def publish_many(self, queue: str, items: list[tuple[bytes, str]]) -> int:
        return self.call("pub", queue, items)[1]

    def bind(self, queue: str, name: str) -> None:
        self.call("bind", queue, name)

    def fetch(self, n: int, timeout: float, acks: list) -> tuple[list, int]:
        """(the next batch, how many of ``acks`` were acked) in one round trip."""
        reply = self.call("fetch", n, timeout, acks)
        return reply[1], reply[2]

    def close(self) -> None:
        self.sock.close()


def ref_publisher(address: str, ready, go, out, seconds: float, queue: str,
                  payload: bytes) -> None:
    """Publish 100 per request for ``seconds``, each batch durable on its reply."""
    client = RefClient(address)
    ready.release()
    go.wait()
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        client.publish_many(queue, [(payload, f"k{n + i}") for i in range(100)])
        n += 100
    out.put(n)
    client.close()


def ref_consumer(address: str, ready, go, out, seconds: float, queue: str, name: str) -> None:
    """fetch(100) with the previous batch's acks riding on it, until drained or ``seconds``:
    puts (messages acked, when the last acks were durable), like remote.py's ``_consume``."""
    client = RefClient(address)
    client.bind(queue, name)
    ready.release()
    go.wait()
    n, last, end = 0, time.monotonic(), time.monotonic() + seconds
    acks: list[list[int]] = []
    while time.monotonic() < end:
        rode = acks
        got, acked = client.fetch(100, 0.2, rode)
        if rode:
            n, last = n + acked, time.monotonic()
        acks = [[p, s] for p, s, _, _ in got]
        if not got and not rode:
            break               # none came within 0.2 s: drained
    if acks:
        n, last = n + client.fetch(0, 0, acks)[1], time.monotonic()
    out.put((n, last))
    client.close()


class ReferenceServer:
    """This module's server in a child process, on a free loopback port over its own dir."""

    def __init__(self, data: str) -> None:
        self.data = data
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def start(self) -> None:
        from brokers import die_with_parent
        with partq.Broker.open(self.data) as broker:
            broker.create_queue("bench", partitions=8, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--data",
                                      self.data, "--listen", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=die_with_parent)    # SIGTERM if the bench dies
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference server exited with {self.proc.wait()}")
        self.address = json.loads(line)["listen"]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args(argv)
    host, port = args.listen.rsplit(":", 1)
    serve(args.data, host, int(port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
