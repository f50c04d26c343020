"""A flow of another process that lets a partition go for a handoff writes its settle (exact
delivery counts and mark, ``Writer.settle``) with no read snapshot open. When another process
has meanwhile written past this process's map, that commit must first adopt the grown map,
which waits until no snapshot of this process is open; before, the settle was written inside
the receive's own snapshot, and the receive never returned. Real LMDB in a real second process
grows the map, at the moment the receive has its snapshot open."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from helpers import wait_until

import partq
from partq.delivery.peers.peer_flow import PeerFlow

GROW = """
import sys, lmdb
env = lmdb.open(sys.argv[1], map_size=1 << 30, max_dbs=32, subdir=True)
db = env.open_db(b"meta", create=False)
with env.begin(write=True) as txn:          # past the other process's map (64 MiB at first)
    txn.put(b"test-ballast", b"x" * (96 << 20), db=db)
with env.begin(write=True) as txn:          # freed again: the store is as it was, its file larger
    txn.delete(b"test-ballast", db=db)
"""


@pytest.mark.timeout(120)
def test_a_handoff_settle_commits_when_another_process_grew_the_map(tmp_path, monkeypatch):
    data = tmp_path / "d"
    clock = partq.ManualClock(100.0)
    owner = partq.Broker.open(data, clock=clock)
    peer = partq.Broker.open(data, clock=clock)     # shares the store, not the delivery
    try:
        owner.create_queue("q", partitions=2, rebalance_delay=1.0, max_handoff_time=600,
                           consumer_timeout=600)
        x = owner.bind("q", name="x")
        b = peer.bind("q", name="b")
        x.unbind()
        clock.advance(1.1)
        owner.tick()
        wait_until(lambda: b.partitions == frozenset({0, 1}), 30, "b to hold both partitions")
        owner.publish_many("q", [(b"m", f"k{i}") for i in range(20)])
        got = wait_until(lambda: b.receive(100, timeout=0), 30, "b to receive")
        assert got                                  # held unacked: a handoff has to settle
        owner.bind("q", name="y")
        clock.advance(1.1)
        owner.tick()                                # a partition of b's is paused for y

        grown = []
        settle = PeerFlow.settle

        def settle_after_growth(self, partitions=None):
            if partitions and not grown:            # inside the receive's snapshot
                grown.append(subprocess.run([sys.executable, "-c", GROW, str(data)],
                                            capture_output=True, timeout=60))
            return settle(self, partitions)
        monkeypatch.setattr(PeerFlow, "settle", settle_after_growth)

        done = threading.Event()
        receiver = threading.Thread(target=lambda: (b.receive(100, timeout=0), done.set()),
                                    daemon=True)
        receiver.start()
        assert done.wait(30), "the receive that settles the handoff never returned"
        assert grown and grown[0].returncode == 0, grown
        b.ack_many(got)
        clock.advance(0.1)
        owner.tick()
        wait_until(lambda: owner.queue_status("q").rebalance_status == "Ready", 30,
                   "the handoff to end")
    finally:
        monkeypatch.undo()
        peer.close()
        owner.close()
