"""Acks from a flow served by another process's delivery owner (rules `peer-flows` and
`fencing`), step by step: an ack batch that spans a partition the flow lost is refused whole,
and acking the rest afterwards is durable (a lost partition must not leave acks in the peer process's memory
that never commit). And a stopped owner, which every such flow waits for, is named in the queue's status."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from helpers import wait_until

import partq
from partq.delivery.peers.link import OwnerLink
from partq.delivery.peers.owner_channel import socket_path

HERE = os.path.dirname(os.path.abspath(__file__))
PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")


class Scripted:
    def __init__(self, data: str) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "scripted_proc.py"),
                                      data, "q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def __call__(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the scripted consumer exited with {self.proc.wait()}"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def test_an_ack_batch_over_a_lost_partition_then_the_rest(tmp_path):
    data = str(tmp_path / "data")
    clock = partq.ManualClock(100.0)
    owner = partq.Broker.open(data, clock=clock)
    b = Scripted(data)
    try:
        owner.create_queue("q", partitions=4, rebalance_delay=1.0, max_handoff_time=0.0,
                           consumer_timeout=600)
        owner.bind("q", name="a")                       # this process owns delivery
        assert b(op="bind", name="b")["ok"]
        clock.advance(1.1)
        owner.tick()                                    # the holddown ends: b gets 2 of 4
        mine = b(op="partitions")["partitions"]
        assert len(mine) == 2
        owner.publish_many("q", [(b"x", None) for _ in range(40)])
        got = b(op="receive", max=100)["messages"]
        assert {p for p, _ in got} == set(mine)
        c = owner.bind("q", name="c")                   # b loses one partition to c
        clock.advance(1.1)
        owner.tick()
        kept = set(b(op="partitions")["partitions"])
        lost = set(mine) - kept
        assert len(kept) == 1 and len(lost) == 1, (mine, kept)
        refused = b(op="ack", messages=got)
        assert refused == {"ok": False, "error": "FlowFenced",
                           "messages": [m for m in got if m[0] in lost]}
        (p_kept,) = kept
        rest = [m for m in got if m[0] == p_kept]
        assert b(op="ack", messages=rest) == {"ok": True}
        status = {p.partition: p for p in owner.queue_status("q").partitions}
        assert status[p_kept].ack_floor == max(s for _, s in rest) + 1, "the acks did not commit"
        c.unbind()
    finally:
        b.close()
        owner.close()


def test_a_stopped_delivery_owner_is_named_in_the_status(tmp_path):
    """The owner of a queue's delivery, stopped with SIGSTOP, keeps its lock, and consumers in
    other processes wait for it: `queue_status` from another process (and `partq queue show`)
    says so, and the warning goes once it continues."""
    data = str(tmp_path / "data")
    with partq.Broker.open(data) as admin:
        admin.create_queue("q", partitions=2)
    owner = Scripted(data)
    watcher = partq.Broker.open(data)
    try:
        assert owner(op="bind", name="a")["ok"]             # the scripted process owns delivery
        wait_until(lambda: watcher.queue_status("q").warnings == [], 30,
                   "the owner's control socket to answer")
        owner.proc.send_signal(signal.SIGSTOP)
        try:
            st = wait_until(lambda: (lambda s: s if s.warnings else None)(
                watcher.queue_status("q")), 30, "a warning about the stopped owner")
            [warning] = st.warnings
            assert f"pid {owner.proc.pid}" in warning and "is stopped" in warning, warning
            # its lease is not renewed (rule `owner-takeover`: the default consumer_timeout is
            # 10 s, longer than this test stops it)
            wait_until(lambda: watcher.queue_status("q").delivery_owner_beat_age > 1.0, 30,
                       "the owner's lease to age")
            shown = subprocess.run([PARTQ, "--data", data, "queue", "show", "q", "--json"],
                                   capture_output=True, text=True, timeout=60)
            assert "is stopped" in json.loads(shown.stdout)["status"]["warnings"][0], shown
            assert "is stopped" in shown.stderr, shown
        finally:
            owner.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: watcher.queue_status("q").warnings == [], 30,
                   "the warning to go once the owner continues")
        assert watcher.queue_status("q").delivery_owner_beat_age < 1.0
    finally:
        watcher.close()
        owner.close()


def test_a_dead_owners_socket_is_not_knocked_on_once_its_lock_is_free(tmp_path):
    """A killed owner's socket closes before the kernel releases its lock, so a process that
    follows it may find the lock still held, then only a dead socket. Once nobody holds the lock
    the link says so at once (OwnerLost: take delivery over) instead of knocking on the dead
    socket for CONNECT_TIMEOUT (bench/takeover.py: failover after SIGKILL 0.2 s, not 5 s)."""
    data = str(tmp_path / "data")
    with partq.Broker.open(data) as admin:
        admin.create_queue("q", partitions=2)
        qid = admin.queue_config("q").qid
    path = socket_path(data, qid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)                     # the file stays: connecting to it is refused
    dead.close()
    with pytest.raises(partq.OwnerLost, match="no process delivers queue 'q'"):
        OwnerLink(data, "q", qid, 10.0, lambda frame: None, lambda: None, lambda: [])
    with partq.Broker.open(data) as b:   # and a bind takes delivery over
        assert b.bind("q").partitions == frozenset({0, 1})
