"""Framing shared by partq's sockets: ``u32 length | u32 crc32c(body) | msgpack body``.

A bad checksum, an oversized length or a truncated frame raises ``FrameError``; the connection
that carried it ends (the peer reconnects and resumes). Nothing reads a frame it could not
verify.
"""
from __future__ import annotations

import socket
import struct

import crc32c
import msgpack

from partq.errors import PartqError

HEADER = struct.Struct(">II")
MAX_FRAME = 256 << 20
CHUNK = 1 << 20


class FrameError(Exception):
    """A frame failed its checks; the connection that carried it ends."""


def send_frame(sock: socket.socket, obj) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(HEADER.pack(len(body), crc32c.crc32c(body)) + body)


def recv_frame(sock: socket.socket, max_frame: int = MAX_FRAME):
    length, crc = HEADER.unpack(recv_exact(sock, HEADER.size))
    if length > max_frame:
        raise FrameError(f"frame of {length} bytes exceeds {max_frame}")
    body = recv_exact(sock, length)
    if crc32c.crc32c(body) != crc:
        raise FrameError("frame crc32c mismatch")
    try:
        return msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise FrameError(f"undecodable frame ({type(exc).__name__})") from None


def recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, CHUNK))
        if not chunk:
            raise FrameError(f"connection closed mid-frame ({got} of {n} bytes)")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (an empty host means 127.0.0.1) as a (host, port) pair."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise PartqError(f"address {address!r} must be HOST:PORT, e.g. 127.0.0.1:7010")
    return host or "127.0.0.1", int(port)
