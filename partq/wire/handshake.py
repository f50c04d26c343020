"""The handshake every TCP listener (``partq serve``, replication) runs before it reads anything
else, after TLS when it is configured.

The server says hello with a fresh nonce and whether it needs a token; the client answers with
its own nonce and, when a token is needed, HMAC-SHA256(token, "client" || server nonce || client
nonce); the server checks it in constant time and proves it knows the token too (HMAC over
"server" || client nonce || server nonce). The token never crosses the wire, and a recorded
exchange is worth nothing on the next connection.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import stat
from collections.abc import Callable

from partq.errors import HandshakeFailed
from partq.wire.frames import MAX_FRAME, recv_frame, send_frame

log = logging.getLogger("partq.listener")

PROTOCOL = "partq"
WIRE_VERSION = 1
NONCE_BYTES = 32
HANDSHAKE_FRAME = 4096


def _proof(token: bytes, side: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(token, side + first + second, hashlib.sha256).digest()


def server_handshake(sock: socket.socket, role: str, token: bytes | None,
                     timeout: float, max_frame: int = MAX_FRAME,
                     admit: Callable[[], str | None] | None = None) -> dict:
    """Run the server side of the handshake; return the client's hello. Raises
    ``HandshakeFailed`` (after telling the client why) on a wrong token, another protocol or
    version, or a client that stalls past ``timeout``."""
    sock.settimeout(timeout)
    nonce = os.urandom(NONCE_BYTES)
    send_frame(sock, {"op": "hello", "proto": PROTOCOL, "v": WIRE_VERSION, "role": role,
                      "nonce": nonce, "auth": token is not None, "max_frame": max_frame})
    hello = recv_frame(sock, HANDSHAKE_FRAME)
    if not isinstance(hello, dict) or hello.get("op") != "hello" \
            or hello.get("proto") != PROTOCOL:
        raise _refuse(sock, "not a partq client")
    if hello.get("v") != WIRE_VERSION or hello.get("role") != role:
        raise _refuse(sock, f"this is a partq {role} listener speaking wire version "
                            f"{WIRE_VERSION}; the client speaks {hello.get('role')!r} version "
                            f"{hello.get('v')!r}: use the same partq version on both sides")
    client_nonce = hello.get("nonce")
    if not isinstance(client_nonce, bytes) or len(client_nonce) != NONCE_BYTES:
        raise _refuse(sock, "malformed hello")
    proof = None
    if token is not None:
        given = hello.get("proof")
        if not isinstance(given, bytes) or not hmac.compare_digest(
                given, _proof(token, b"client", nonce, client_nonce)):
            raise refuse(sock, "authentication failed: wrong or missing token", kind="auth")
        proof = _proof(token, b"server", client_nonce, nonce)
    refusal = admit() if admit is not None else None
    if refusal is not None:
        raise refuse(sock, refusal, kind="busy")
    send_frame(sock, {"op": "welcome", "proof": proof})
    sock.settimeout(None)
    return hello


def client_handshake(sock: socket.socket, role: str, token: bytes | None, timeout: float,
                     **info) -> dict:
    """Run the client side of the handshake; return the server's hello. Raises
    ``AuthenticationFailed`` or ``ProtocolMismatch`` with one line saying what to do."""
    from partq.errors import AuthenticationFailed, PeerRefused, ProtocolMismatch
    sock.settimeout(timeout)
    hello = recv_frame(sock, HANDSHAKE_FRAME)
    if isinstance(hello, dict) and hello.get("op") == "refused":
        raise PeerRefused(f"the listener refused the connection: {hello.get('reason')}")
    if not isinstance(hello, dict) or hello.get("proto") != PROTOCOL:
        raise ProtocolMismatch("the peer is not a partq listener (check the address and port)")
    if hello.get("v") != WIRE_VERSION or hello.get("role") != role:
        raise ProtocolMismatch(f"the peer is a partq {hello.get('role')!r} listener speaking wire "
                               f"version {hello.get('v')!r}, not {role!r} version "
                               f"{WIRE_VERSION}: check the address, and use the same partq "
                               f"version on both sides")
    server_nonce = hello.get("nonce")
    if not isinstance(server_nonce, bytes) or len(server_nonce) != NONCE_BYTES:
        raise ProtocolMismatch("the peer's hello is malformed")
    if hello.get("auth") and token is None:
        raise AuthenticationFailed("the server needs a token: pass token=... (or --token-file)")
    if not hello.get("auth") and token is not None:
        raise AuthenticationFailed("the server does not check tokens (it runs in protected mode, "
                                   "loopback only); connect without a token, or start it with "
                                   "--token-file")
    nonce = os.urandom(NONCE_BYTES)
    send_frame(sock, {"op": "hello", "proto": PROTOCOL, "v": WIRE_VERSION, "role": role,
                      "nonce": nonce, "proof": _proof(token, b"client", server_nonce, nonce)
                      if token is not None else None, **info})
    reply = recv_frame(sock, HANDSHAKE_FRAME)
    if not isinstance(reply, dict) or reply.get("op") != "welcome":
        reason = reply.get("reason") if isinstance(reply, dict) else None
        kind = reply.get("kind") if isinstance(reply, dict) else None
        if kind == "auth":
            raise AuthenticationFailed(f"the server refused the token: {reason}")
        if kind == "busy":
            raise PeerRefused(f"the listener refused the connection: {reason}")
        raise ProtocolMismatch(f"the server refused the connection: {reason or 'no reason'}")
    if token is not None:
        proof = reply.get("proof")
        if not isinstance(proof, bytes) or not hmac.compare_digest(
                proof, _proof(token, b"server", nonce, server_nonce)):
            raise AuthenticationFailed("the server could not prove it knows the token: it is "
                                       "not the server you meant")
    sock.settimeout(None)
    return hello


def _refuse(sock: socket.socket, reason: str) -> HandshakeFailed:
    return refuse(sock, reason, kind="protocol")


def refuse(sock: socket.socket, reason: str, kind: str = "busy") -> HandshakeFailed:
    """Tell a peer why it is refused (one frame, best effort) and return the error to raise.
    ``kind`` says what the client raises: ``"busy"`` (full, protected mode: ``PeerRefused``, a
    ``ServerUnavailable`` worth retrying), ``"auth"`` (``AuthenticationFailed``) or
    ``"protocol"`` (``ProtocolMismatch``)."""
    try:
        send_frame(sock, {"op": "refused", "reason": reason, "kind": kind})
    except OSError:
        pass
    return HandshakeFailed(reason)


def read_token(token: str | bytes | None = None, token_file: str | None = None) -> bytes | None:
    """The shared token as bytes, given directly or as a file (its first line); None for none.
    A token shorter than 16 bytes is refused: it could be guessed. A token file that users other
    than its owner may read gets a warning (as ssh warns of a private key others may read)."""
    from partq.errors import InvalidConfig
    if token is not None and token_file is not None:
        raise InvalidConfig("pass a token or a token file, not both")
    if token_file is not None:
        try:
            with open(token_file, "rb") as f:
                mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
                lines = f.read().splitlines()
        except OSError as exc:
            raise InvalidConfig(f"cannot read the token file {token_file}: {exc.strerror}") \
                from None
        token = lines[0] if lines else b""
        if mode & 0o077:
            log.warning("the token file %s may be read by other users (mode %04o): anyone who "
                        "reads it can connect as a client or a standby; run `chmod 600 %s`",
                        token_file, mode, token_file)
    if token is None:
        return None
    raw = token.encode() if isinstance(token, str) else bytes(token)
    raw = raw.strip()
    if len(raw) < 16:
        raise InvalidConfig("a token must be at least 16 bytes (e.g. `openssl rand -hex 32`)")
    return raw
