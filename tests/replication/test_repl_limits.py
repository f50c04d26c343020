"""Issue 16, points 7 and 11: what one bad peer may cost the primary (connections, threads, the
snapshot work and its disk space) and the port after ``close()``. The legitimate standby goes
on, and ends byte-identical to the primary."""
from __future__ import annotations

import os
import socket
import tempfile
import threading

import pytest
from helpers import wait_until
from repl_helpers import compare_stores, free_port
from sec_helpers import TOKEN, Pump, RawStandby, fill, host_port, primary, snapshot_dirs, wait_caught_up

import partq
from partq.replication.protocol import DEFAULT_LIMITS


def _identical(tmp_path) -> None:
    diffs = compare_stores(tmp_path / "primary", tmp_path / "standby")
    assert not diffs, "\n".join(diffs)


@pytest.mark.timeout(120)
def ended(sock: socket.socket, timeout: float) -> bool:
    """Whether the listener closes ``sock`` within ``timeout`` (its hello may come first)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_slow_connections_are_bounded_and_dropped(tmp_path):
    """150 connections that never finish the handshake hold at most ``max_handshakes`` threads,
    each for at most the handshake timeout: every new one cuts off the oldest, so the rest end
    at once and a standby gets in while the last of them still stall."""
    p = primary(tmp_path / "primary")
    s = None
    stalled: list[socket.socket] = []
    try:
        fill(p, 0, 300)
        host, port = host_port(p.replication_address)
        threads_before = threading.active_count()
        for _ in range(150):
            stalled.append(socket.create_connection((host, port)))
        limit = DEFAULT_LIMITS.max_handshakes
        cut = sum(1 for sock in stalled[:150 - limit] if ended(sock, 10))
        assert cut >= 150 - limit - 4          # a few may still be on their way in
        wait_until(lambda: threading.active_count() - threads_before <= limit + 2, 30,
                   "the cut-off connections' threads ending")
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_caught_up(p, timeout=40)
        for sock in stalled[150 - limit:]:     # the last ones: cut off at their deadline
            assert ended(sock, DEFAULT_LIMITS.handshake_timeout + 10)
        fill(p, 300, 300)
        wait_caught_up(p)
    finally:
        for sock in stalled:
            sock.close()
        if s is not None:
            s.close()
        p.close()
    _identical(tmp_path)


@pytest.mark.timeout(180)
def test_one_snapshot_at_a_time_inside_the_primarys_directory(tmp_path, monkeypatch):
    """Peers that ask for a snapshot and never read it make one copy at a time, in the
    primary's own directory (never the system's temporary directory), and lose their turn
    when they stop reading; the real standby then gets its snapshot."""
    monkeypatch.setattr("partq.replication.snapshot.SEND_TIMEOUT", 2.0)   # each loses it sooner
    pdir = tmp_path / "primary"
    p = primary(pdir)
    s = None
    peers = []
    system_tmp = set(os.listdir(tempfile.gettempdir()))
    most = [0]
    tick = threading.Event()

    def look() -> None:
        most[0] = max(most[0], len(snapshot_dirs(pdir)))
        tick.wait(0.005)                       # the sampling pace, not a wait

    watch = Pump(look)
    try:
        p.create_queue("q", partitions=3)
        blob = os.urandom(4 << 10)
        for i in range(0, 8000, 400):          # ~32 MiB: more than the sockets' buffers hold
            p.publish_many("q", [(blob, f"k{j}") for j in range(i, i + 400)])
        watch.start()
        for i in range(3):
            peers.append(RawStandby(p.replication_address, f"never-reads-{i}"))
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_until(lambda: s.replication_status().applied_lsn >= 0 and s.queues(), 90,
                   "the real standby's snapshot")
        fill(p, 0, 100)
        wait_until(lambda: any(link.standby_id not in {f"never-reads-{i}" for i in range(3)}
                               and link.connected and link.acked_lsn
                               >= p.replication_status().head_lsn
                               for link in p.replication_status().standbys), 30,
                   "the real standby to catch up")
        watch.end()
        assert most[0] == 1, f"{most[0]} snapshots were prepared at once"
        new = {n for n in set(os.listdir(tempfile.gettempdir())) - system_tmp
               if "snapshot" in n}
        assert not new, f"snapshot files in the system's temporary directory: {new}"
        assert not watch.errors, watch.errors
    finally:
        watch.end()
        for peer in peers:
            peer.close()
        if s is not None:
            s.close()
        p.close()
    assert not snapshot_dirs(pdir)
    _identical(tmp_path)


@pytest.mark.timeout(60)
def test_close_frees_the_replication_port_at_once(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    s = None
    try:
        p = primary(tmp_path / "primary", replication_listen=address)
        fill(p, 0, 200)
        s = partq.Broker.open(tmp_path / "standby", standby_of=address, replication_token=TOKEN)
        for round_ in range(5):
            wait_caught_up(p)
            p.close()                         # a linked standby and all: the port is free now
            p = primary(tmp_path / "primary", replication_listen=address)
            fill(p, 200 + round_ * 50, 50)
        wait_caught_up(p)
    finally:
        if s is not None:
            s.close()
        p.close()
    _identical(tmp_path)
