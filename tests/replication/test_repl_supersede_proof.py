"""Issue 41, point 2, over real sockets on 127.0.0.1: only a standby that followed a primary, and
was promoted, may mark it superseded. A peer that read the primary's timeline history over a
first connection (protected mode, or with the token) and invents one timeline on top is
refused, as is a peer with a slot of its own that read nothing, and one that claims a real
standby's id; the primary goes on taking writes. The real promoted standby still supersedes
it, and `partq dr clear-superseded` gives an operator the directory back."""
from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest
from helpers import wait_until
from sec_helpers import TOKEN, RawStandby, fill, host_port, slot_ids, wait_caught_up
from tools_helpers import PARTQ_SCRIPT

import partq
from partq.replication.protocol import MAX_FRAME
from partq.wire.frames import recv_frame
from partq.wire.handshake import client_handshake


def _open_primary(path, token: str | None) -> partq.Broker:
    return partq.Broker.open(path, replication_listen="127.0.0.1:0", replication_token=token)


def _supersede(address: str, token: str | None, standby_id: str, history: list, **extra) -> dict:
    """Say ``supersedes`` with ``history`` as a promoted standby would; return the answer."""
    with socket.create_connection(host_port(address), timeout=10) as sock:
        client_handshake(sock, "replication", token.encode() if token else None, 10,
                         standby_id=standby_id, applied_lsn=None, timeline=history[-1][0],
                         applied_crc=None, supersedes=history, **extra)
        sock.settimeout(30)
        return recv_frame(sock, MAX_FRAME)


def _refuses_writes(broker: partq.Broker) -> bool:
    try:
        broker.publish("q", b"probe", key="k")
    except partq.Superseded:
        return True
    return False


def _still_a_primary(p: partq.Broker) -> None:
    assert not p.replication_status().superseded
    p.publish("q", b"still taking writes", key="k")


def _partq(*args, data) -> subprocess.CompletedProcess:
    return subprocess.run([PARTQ_SCRIPT, "--data", str(data), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("token", [None, TOKEN], ids=["protected-mode", "token-holder"])
def test_a_peer_that_read_the_history_cannot_supersede_the_primary(tmp_path, token):
    p = _open_primary(tmp_path / "primary", token)
    try:
        fill(p, 0, 50)
        # a first connection posing as a standby: the start frame gives the history away
        reader = RawStandby(p.replication_address, "reader", token=token)
        assert reader.start["type"] == "start"
        history, head = reader.start["timelines"], reader.start["head"]
        reader.close()
        fill(p, 50, 50)                           # commits with LSNs: a slot exists now
        newest = p.replication_status().head_lsn
        assert newest > head
        for fork in (head, newest, 0):
            for extra in ({}, {"slot_secret": os.urandom(32)}):
                reply = _supersede(p.replication_address, token, "reader",
                                   history + [["invented", fork]], **extra)
                assert reply["type"] == "refused", reply
        _still_a_primary(p)
    finally:
        p.close()


@pytest.mark.timeout(120)
def test_a_peer_with_a_slot_of_its_own_that_read_nothing_cannot_supersede(tmp_path):
    from partq.replication.supersede import verifier
    p = _open_primary(tmp_path / "primary", TOKEN)
    try:
        fill(p, 0, 50)
        secret = os.urandom(32)
        squatter = RawStandby(p.replication_address, "squatter", verifier=verifier(secret))
        history = squatter.start["timelines"]
        squatter.close()                          # it never reads the snapshot nor acks
        assert "squatter" in slot_ids(p)
        fill(p, 50, 50)
        newest = p.replication_status().head_lsn
        for fork in (0, newest // 2, newest):
            reply = _supersede(p.replication_address, TOKEN, "squatter",
                               history + [["invented", fork]], slot_secret=secret)
            assert reply["type"] == "refused", reply
            assert "cannot check" in reply["reason"], reply
        _still_a_primary(p)
    finally:
        p.close()


@pytest.mark.timeout(120)
def test_a_standby_that_read_its_snapshot_whole_supersedes_though_its_ack_was_lost(tmp_path):
    from partq.replication.supersede import verifier
    p = _open_primary(tmp_path / "primary", TOKEN)
    try:
        fill(p, 0, 50)
        secret = os.urandom(32)
        peer = RawStandby(p.replication_address, "lost-ack", verifier=verifier(secret))
        history = peer.start["timelines"]
        while (frame := peer.frame())["type"] != "snapshot_end":
            if frame["type"] == "snapshot":
                lsn = frame["lsn"]
        proof = frame["proof"]
        peer.close()                 # no ack: the primary never learns that it has the snapshot
        fill(p, 50, 10)
        claim = history + [["promoted", lsn]]
        for secret_given, proof_given in ((secret, None), (secret, os.urandom(32)),
                                          (os.urandom(32), proof)):
            reply = _supersede(p.replication_address, TOKEN, "lost-ack", claim,
                               slot_secret=secret_given, snapshot_lsn=lsn,
                               snapshot_proof=proof_given)
            assert reply["type"] == "refused", reply
            _still_a_primary(p)
        reply = _supersede(p.replication_address, TOKEN, "lost-ack", claim, slot_secret=secret,
                           snapshot_lsn=lsn, snapshot_proof=proof)
        assert reply["type"] == "superseded", reply
        assert _refuses_writes(p)
    finally:
        p.close()


@pytest.mark.timeout(120)
def test_an_impostor_of_a_real_standby_can_neither_supersede_nor_take_its_slot(tmp_path):
    p = _open_primary(tmp_path / "primary", TOKEN)
    s = None
    try:
        fill(p, 0, 100)
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_caught_up(p)
        [sid] = slot_ids(p)
        reader = RawStandby(p.replication_address, "reader")
        history = reader.start["timelines"]
        reader.close()
        fork = p.replication_status().head_lsn
        for extra in ({}, {"slot_secret": os.urandom(32)}):
            reply = _supersede(p.replication_address, TOKEN, sid,
                               history + [["invented", fork]], **extra)
            assert reply["type"] == "refused", reply
        # the real standby's id without its secret: refused, the real standby keeps its link
        impostor = RawStandby(p.replication_address, sid)
        assert impostor.start["type"] == "refused", impostor.start
        assert "drop-slot" in impostor.start["reason"]
        impostor.close()
        _still_a_primary(p)
        fill(p, 100, 50)
        wait_caught_up(p)
        assert s.queue_status("q").depth == 151      # with _still_a_primary's message
    finally:
        if s is not None:
            s.close()
        p.close()


@pytest.mark.timeout(180)
def test_the_promoted_standby_supersedes_and_clear_superseded_gives_writes_back(tmp_path):
    p = _open_primary(tmp_path / "primary", TOKEN)
    s = None
    try:
        fill(p, 0, 100)
        s = partq.Broker.open(tmp_path / "standby", standby_of=p.replication_address,
                              replication_token=TOKEN)
        wait_caught_up(p)
        [sid] = slot_ids(p)
        s.promote()                       # the old primary is up: it is told at once
        wait_until(lambda: _refuses_writes(p), 30, "the old primary to be told it is superseded")
        assert p.replication_status().superseded
        # the operator takes the directory back; a script without --yes is refused
        unconfirmed = _partq("dr", "clear-superseded", data=tmp_path / "primary")
        assert unconfirmed.returncode == 1 and "--yes" in unconfirmed.stderr, unconfirmed.stderr
        assert _refuses_writes(p)
        cleared = _partq("dr", "clear-superseded", "--yes", "--json", data=tmp_path / "primary")
        assert cleared.returncode == 0, cleared.stdout + cleared.stderr
        doc = json.loads(cleared.stdout)
        assert doc["cleared"] is True and doc["dropped_slot"] == sid, doc
        _still_a_primary(p)                       # at once, in the process that serves it
        assert sid not in slot_ids(p)             # the promoted standby's secret is spent
        again = _partq("dr", "clear-superseded", "--yes", data=tmp_path / "primary")
        assert again.returncode == 1 and "not marked superseded" in again.stderr, again.stderr
        s.publish("q", b"on the new primary", key="k")
    finally:
        if s is not None:
            s.close()
        p.close()
