"""Issue 16, points 1 to 3, over real sockets on 127.0.0.1: who may read the replication stream,
whose acks count in sync mode, and who may feed a standby. Each attack is refused or bounded,
the legitimate standby goes on, and its data ends byte-identical to the primary's."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

import crc32c
import pytest
import trustme
from helpers import wait_until
from repl_helpers import compare_stores
from sec_helpers import (
    MARKER,
    TOKEN,
    Pump,
    RawStandby,
    closed_by_peer,
    declare_huge_frame,
    fill,
    host_port,
    non_loopback_ip,
    primary,
    read_until_closed,
    rss_bytes,
    slot_ids,
    snapshot_dirs,
    wait_caught_up,
)

import partq
from partq.replication import ReplicationTimeout
from partq.wire.frames import recv_frame, send_frame
from partq.wire.handshake import HANDSHAKE_FRAME, NONCE_BYTES


def _identical(tmp_path, standby="standby") -> None:
    diffs = compare_stores(tmp_path / "primary", tmp_path / standby)
    assert not diffs, "\n".join(diffs)


# ---------------------------------------------------------------------- point 1
@pytest.mark.timeout(60)
def test_a_peer_without_the_token_reads_nothing_and_gets_no_slot(tmp_path):
    p = primary(tmp_path / "primary")
    s = None
    try:
        fill(p, 0, 600)
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_caught_up(p)
        legit = slot_ids(p)
        host, port = host_port(p.replication_address)
        # today's attack: one hello of the old protocol, any standby id
        with socket.create_connection((host, port)) as raw:
            send_frame(raw, {"type": "hello", "standby_id": "evil", "applied_lsn": None})
            data = read_until_closed(raw)
        assert MARKER not in data and len(data) < HANDSHAKE_FRAME
        # the real handshake with a wrong token, or none
        with pytest.raises(partq.AuthenticationFailed, match="refused the token"):
            RawStandby(p.replication_address, "evil", token="not-the-token-0123456789")
        with pytest.raises(partq.AuthenticationFailed, match="needs a token"):
            RawStandby(p.replication_address, "evil", token=None)
        # a replayed exchange: the server's nonce is fresh, so a recorded proof is worthless
        with socket.create_connection((host, port)) as raw:
            raw.settimeout(10)
            hello = recv_frame(raw)
            send_frame(raw, {"op": "hello", "proto": "partq", "v": 1, "role": "replication",
                             "nonce": b"\0" * NONCE_BYTES, "proof": b"\0" * 32,
                             "standby_id": "evil"})
            data = read_until_closed(raw)
        assert hello["auth"] is True and b"refused" in data and MARKER not in data
        assert slot_ids(p) == legit, "a peer that failed the handshake got a slot"
        fill(p, 600, 300)
        wait_caught_up(p)
    finally:
        if s is not None:
            s.close()
        p.close()
    _identical(tmp_path)


@pytest.mark.timeout(60)
def test_protected_mode_admits_loopback_peers_only(tmp_path, caplog):
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this host has no address other than loopback")
    caplog.set_level(logging.WARNING)
    p = partq.Broker.open(tmp_path / "primary", replication_listen="0.0.0.0:0")
    port = host_port(p.replication_address)[1]
    remote = local = None
    try:
        assert any("protected mode" in r.getMessage() for r in caplog.records)
        fill(p, 0, 300)
        with pytest.raises(partq.PeerRefused, match="protected mode"):
            RawStandby(f"{ip}:{port}", "remote", token=None)
        remote = partq.Broker.open(tmp_path / "remote", standby_of=f"{ip}:{port}")
        wait_until(lambda: "protected mode" in (remote.replication_status().last_error or ""),
                   10, "the remote standby to be refused")
        assert remote.queues() == [] and slot_ids(p) == []
        local = partq.Broker.open(tmp_path / "standby", standby_of=f"127.0.0.1:{port}")
        wait_caught_up(p)
        assert remote.queues() == []
    finally:
        for b in (remote, local):
            if b is not None:
                b.close()
        p.close()
    _identical(tmp_path)


@pytest.mark.timeout(60)
def test_tls_with_a_token(tmp_path):
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    p = primary(tmp_path / "primary", replication_ssl=server)
    brokers = []
    try:
        fill(p, 0, 500)
        good = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                                 replication_token=TOKEN, replication_ssl=client)
        plain = partq.Broker.open(tmp_path / "plain", standby_of=p.replication_address,
                                  replication_token=TOKEN)
        untrusting = partq.Broker.open(tmp_path / "untrusting", standby_of=p.replication_address,
                                       replication_token=TOKEN,
                                       replication_ssl=ssl.create_default_context())
        brokers = [good, plain, untrusting]
        wait_caught_up(p)
        assert good.replication_status().tls and p.replication_status().tls
        for b in (plain, untrusting):
            wait_until(lambda b=b: b.replication_status().last_error, 10, "a refusal")
            assert b.queues() == []
        assert len(slot_ids(p)) == 1
    finally:
        for b in brokers:
            b.close()
        p.close()
    _identical(tmp_path)


# ---------------------------------------------------------------------- point 2
@pytest.mark.timeout(90)
def test_forged_acks_never_release_sync_publishes(tmp_path, procs, caplog):
    caplog.set_level(logging.WARNING, logger="partq.replication")
    p = primary(tmp_path / "primary", replication_mode="sync", sync_timeout=1.0)
    try:
        standby = procs.start("standby", "proc_standby.py", tmp_path / "standby",
                              p.replication_address, tmp_path / "s.json", f"token={TOKEN}")
        wait_until(lambda: p.replication_status().connected, 30, "the standby", procs=[standby])
        fill(p, 0, 400)
        # an insider acks far above anything it was sent, then leaves
        liar = RawStandby(p.replication_address, "liar")
        liar.skip_snapshot()
        liar.frame()
        liar.ack(2 ** 62)
        assert liar.closed_by_peer(), "the primary kept a peer that acked what it never sent"
        liar.close()
        assert any("acked LSN 4611686018427387904" in r.getMessage() for r in caplog.records)
        # with the real standby stalled, nothing releases a sync publish: it times out
        standby.pause()
        started = time.monotonic()
        with pytest.raises(ReplicationTimeout):
            p.publish("q", b"while-stalled", key="k")
        assert time.monotonic() - started >= 0.9
        standby.kill()
        with pytest.raises(ReplicationTimeout):
            p.publish("q", b"no-standby", key="k")
        standby = procs.start("standby2", "proc_standby.py", tmp_path / "standby",
                              p.replication_address, tmp_path / "s2.json", f"token={TOKEN}")
        wait_until(lambda: p.replication_status().connected, 30, "the standby back",
                   procs=[standby])
        p.publish("q", b"after", key="k")
        assert standby.stop() == 0
    finally:
        p.close()
    _identical(tmp_path)


@pytest.mark.timeout(90)
def test_a_silent_peer_does_not_stall_sync_publishes(tmp_path, procs):
    """ANY 1: a peer that takes the stream and never acks holds no one while a healthy
    standby acks (point 7's first attack)."""
    p = primary(tmp_path / "primary", replication_mode="sync", sync_timeout=20.0)
    silent = None
    try:
        standby = procs.start("standby", "proc_standby.py", tmp_path / "standby",
                              p.replication_address, tmp_path / "s.json", f"token={TOKEN}")
        wait_until(lambda: p.replication_status().connected, 30, "the standby", procs=[standby])
        p.create_queue("q", partitions=3)
        silent = RawStandby(p.replication_address, "silent")
        silent.skip_snapshot()                          # then reads on, never acking
        drain = Pump(lambda: silent.frame())
        drain.start()
        latencies = []
        deadline = time.monotonic() + 2.0
        i = 0
        while time.monotonic() < deadline:
            started = time.monotonic()
            p.publish("q", b"x" * 256, key=f"k{i}")
            latencies.append(time.monotonic() - started)
            i += 1
        assert max(latencies) < 2.0, max(latencies)
        assert standby.stop() == 0
    finally:
        if silent is not None:
            silent.close()
        p.close()
    _identical(tmp_path)


# ---------------------------------------------------------------------- point 3
class FakePrimary:
    """A listener that is not the real primary: it speaks the handshake as well as it can
    without the token (``auth``: claim to check tokens and accept any proof, or claim not to
    check them), then offers ``snapshot`` (a CRC-valid copy of another store) and records how
    far the standby let it go."""

    def __init__(self, auth: bool, snapshot: bytes, announced: int | None = None) -> None:
        self.auth, self.snapshot, self.announced = auth, snapshot, announced
        self.sent = 0                   # the most snapshot bytes one connection took
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            try:
                self._serve(conn)
            except Exception:        # the standby hung up: what it let through is recorded
                pass
            finally:
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        send_frame(conn, {"op": "hello", "proto": "partq", "v": 1, "role": "replication",
                          "nonce": os.urandom(NONCE_BYTES), "auth": self.auth,
                          "max_frame": 4096})
        recv_frame(conn)
        send_frame(conn, {"op": "welcome", "proof": b"\1" * 32 if self.auth else None})
        send_frame(conn, {"type": "start", "timelines": [["fake", 0]], "head": 1})
        size = self.announced if self.announced is not None else len(self.snapshot)
        send_frame(conn, {"type": "snapshot", "size": size, "lsn": 1, "crc_at_lsn": None})
        data, sent = memoryview(self.snapshot), 0
        while data:
            send_frame(conn, {"type": "chunk", "data": bytes(data[:1 << 20])})
            sent += len(data[:1 << 20])
            self.sent = max(self.sent, sent)
            data = data[1 << 20:]
        send_frame(conn, {"type": "snapshot_end", "crc": crc32c.crc32c(self.snapshot)})
        recv_frame(conn)

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(10)


def _other_store_snapshot(tmp_path) -> bytes:
    with partq.Broker.open(tmp_path / "other") as other:
        other.create_queue("planted", partitions=1)
        other.publish("planted", b"not yours")
        (tmp_path / "other-copy").mkdir()
        other.store.snapshot(str(tmp_path / "other-copy"))
    return (tmp_path / "other-copy" / "data.mdb").read_bytes()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("auth", [True, False], ids=["fake-proof", "claims-no-token"])
def test_a_standby_with_a_token_never_takes_a_fake_primarys_store(tmp_path, auth):
    fake = FakePrimary(auth, _other_store_snapshot(tmp_path))
    s = partq.Broker.open(tmp_path / "standby", standby_of=fake.address,
                          replication_token=TOKEN)
    try:
        wait_until(lambda: fake.connections and s.replication_status().last_error, 10,
                   "the standby to refuse the fake")
        error = s.replication_status().last_error
        assert ("could not prove" in error) if auth else ("does not check tokens" in error)
        assert s.queues() == [] and not snapshot_dirs(tmp_path / "standby")
        assert s.replication_status().applied_lsn == 0
    finally:
        s.close()
        fake.close()


@pytest.mark.timeout(60)
def test_a_snapshot_longer_than_announced_is_cut_off_at_once(tmp_path):
    """In protected mode (no token on either side) a peer on this host is trusted to be the
    primary; even so, a snapshot that runs past its announced size is abandoned as soon as it
    does, and a size the standby cannot hold is refused before a byte is written."""
    huge = b"\0" * (300 << 20)
    fake = FakePrimary(False, huge, announced=100)
    s = partq.Broker.open(tmp_path / "standby", standby_of=fake.address)
    try:
        wait_until(lambda: "longer than the 100 bytes" in (s.replication_status().last_error
                                                           or ""), 30, "the standby to cut it off")
        assert fake.sent < (64 << 20), f"the standby read {fake.sent} bytes of a 100-byte snapshot"
        assert s.queues() == [] and not snapshot_dirs(tmp_path / "standby")
    finally:
        s.close()
        fake.close()
    fake = FakePrimary(False, b"x" * 100, announced=1 << 50)
    s = partq.Broker.open(tmp_path / "standby2", standby_of=fake.address,
                          max_map_size=1 << 30)
    try:
        wait_until(lambda: "size" in (s.replication_status().last_error or ""), 10,
                   "the standby to refuse the size")
        assert fake.sent <= 100 and not snapshot_dirs(tmp_path / "standby2")
    finally:
        s.close()
        fake.close()


@pytest.mark.timeout(60)
def test_oversized_declared_frames_are_refused_before_they_are_read(tmp_path):
    """Peers that declare 256 MiB frames, in the handshake or past it, lose their connection
    and the primary never allocates them (point 7's memory attack)."""
    p = primary(tmp_path / "primary")
    s = None
    try:
        fill(p, 0, 300)
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_caught_up(p)
        before = rss_bytes()
        host, port = host_port(p.replication_address)
        raws = []
        for _ in range(4):
            raw = socket.create_connection((host, port))
            recv_frame(raw)
            declare_huge_frame(raw)
            raws.append(raw)
        peers = []
        for i in range(4):
            peer = RawStandby(p.replication_address, f"big-frames-{i}")
            peer.skip_snapshot()
            peer.frame()
            declare_huge_frame(peer.sock)
            peers.append(peer)
        for peer in peers:
            assert peer.closed_by_peer()
            peer.close()
        for raw in raws:
            assert closed_by_peer(raw)
            raw.close()
        assert rss_bytes() - before < 64 << 20
        fill(p, 300, 300)
        wait_caught_up(p)
    finally:
        if s is not None:
            s.close()
        p.close()
    _identical(tmp_path)


@pytest.mark.timeout(90)
def test_partq_standby_with_a_token_file_and_tls(tmp_path):
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    (tmp_path / "token").write_text(TOKEN + "\n")
    partq_cli = os.path.join(os.path.dirname(sys.executable), "partq")
    p = primary(tmp_path / "primary", replication_ssl=server)
    proc = None
    try:
        fill(p, 0, 300)
        proc = subprocess.Popen([partq_cli, "--data", str(tmp_path / "standby"), "standby",
                                 "--primary", p.replication_address, "--token-file",
                                 str(tmp_path / "token"), "--tls-ca", str(tmp_path / "ca.pem"),
                                 "--interval", "0.2", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_caught_up(p)
        doc = json.loads(proc.stdout.readline())
        assert doc["token"] is True and doc["tls"] is True
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        p.close()
    _identical(tmp_path)
