"""Fuzzing the replication wire (issue 16): thousands of generated inputs against the frame
decoder, and against a live primary's listener at each stage of a connection (raw bytes, the
handshake's hello, frames after authentication). The decoder only ever returns a value or
raises ``FrameError``; the listener never fails (no error logged, its accept loop alive), and
the legitimate standby, linked all along, ends byte-identical to the primary."""
from __future__ import annotations

import logging
import socket
import struct
import threading

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from repl_helpers import compare_stores
from sec_helpers import (
    TOKEN,
    RawStandby,
    fill,
    host_port,
    primary,
    read_until_closed,
    wait_caught_up,
)

import partq
from partq.replication.timeline import read_history
from partq.wire.frames import FrameError, encode_frame, read_frame, recv_frame

HEADER = struct.Struct(">II")
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
    | st.text(max_size=40) | st.binary(max_size=64),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=6),
    max_leaves=20)
FIELDS = ["nonce", "proof", "standby_id", "applied_lsn", "timeline", "applied_crc", "type", "lsn"]
hellos = st.fixed_dictionaries(
    {"op": st.sampled_from(["hello", "welcome", "x"]),
     "proto": st.sampled_from(["partq", "other"]),
     "v": st.sampled_from([1, 2, "1"]),
     "role": st.sampled_from(["replication", "serve"])},
    optional={name: msgpack_values for name in FIELDS})


def _framed(body: bytes, crc_ok: bool, length_delta: int) -> bytes:
    crc = crc32c.crc32c(body) ^ (0 if crc_ok else 1)
    return HEADER.pack(max(0, len(body) + length_delta), crc) + body


frames = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda v: encode_frame(v), msgpack_values),
    st.builds(_framed, st.binary(max_size=200), st.booleans(), st.integers(-8, 8)),
    st.builds(lambda n: HEADER.pack(n, 0), st.integers(0, (1 << 32) - 1)),
)


def _decode_all(data: bytes, limit: int) -> None:
    a, b = socket.socketpair()
    try:
        a.sendall(data)
        a.shutdown(socket.SHUT_WR)
        b.settimeout(5)
        stream = b.makefile("rb")
        for reader in (lambda: recv_frame(b, limit), lambda: read_frame(stream, limit)):
            try:
                while True:
                    reader()
            except FrameError:
                pass
    finally:
        a.close()
        b.close()


@settings(max_examples=3000, deadline=None)
@given(data=st.lists(frames, max_size=4).map(b"".join), limit=st.sampled_from([64, 4096, 1 << 20]))
def test_the_frame_decoder_returns_or_raises_frame_error(data, limit):
    _decode_all(data, limit)


def _exchange(host: str, port: int, payload: bytes, after_hello: bool) -> bytes:
    with socket.create_connection((host, port), timeout=10) as sock:
        if after_hello:
            recv_frame(sock)
        sock.sendall(payload)
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        return read_until_closed(sock)


@pytest.mark.timeout(600)
def test_a_live_listener_survives_fuzzed_peers(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    p = primary(tmp_path / "primary")
    s = None
    try:
        fill(p, 0, 300)
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_caught_up(p)
        host, port = host_port(p.replication_address)
        no_health = [HealthCheck.too_slow, HealthCheck.data_too_large]

        @settings(max_examples=1500, deadline=None, suppress_health_check=no_health)
        @given(data=st.lists(frames, max_size=3).map(b"".join), after_hello=st.booleans())
        def raw_bytes(data, after_hello):
            got = _exchange(host, port, data, after_hello)
            assert b"msg-00000" not in got

        @settings(max_examples=800, deadline=None, suppress_health_check=no_health)
        @given(hello=hellos)
        def handshakes(hello):
            got = _exchange(host, port, encode_frame(hello), after_hello=True)
            assert b"msg-00000" not in got

        with p.store.read() as r:
            timeline = read_history(r)[-1][0]

        @settings(max_examples=300, deadline=None, suppress_health_check=no_health)
        @given(sent=st.lists(frames, min_size=1, max_size=3))
        def after_authentication(sent):
            head = p.replication_status().head_lsn
            peer = RawStandby(p.replication_address, "fuzz", applied_lsn=head, timeline=timeline)
            try:
                peer.frame()                       # the first heartbeat, then the fuzz
                for frame in sent:
                    peer.sock.sendall(frame)
                peer.sock.shutdown(socket.SHUT_WR)
                peer.closed_by_peer(timeout=30)
            except OSError:
                pass
            finally:
                peer.close()

        raw_bytes()
        handshakes()
        after_authentication()

        assert any(t.name == "partq-replication-accept" and t.is_alive()
                   for t in threading.enumerate())
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, errors[:5]
        fill(p, 300, 300)
        wait_caught_up(p)
        # a well-behaved client still gets served after all that
        peer = RawStandby(p.replication_address, "fuzz", applied_lsn=None)
        assert peer.start["type"] == "start"
        peer.skip_snapshot()
        peer.close()
    finally:
        if s is not None:
            s.close()
        p.close()
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)
