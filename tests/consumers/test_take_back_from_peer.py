"""A partition the delivery owner takes from a flow of another process and gives to one of its
own flows: an ack that flow of the other process committed before the move was stored is never
delivered again (found by the crash harness, seed 1424722252: messages delivered after their ack
returned).

The other process's ack is fenced in its own write transaction against the *stored*
assignment (rule `fencing`). The owner moves the partition in memory first and stores the move
in a later commit; a receive that ran the rebalance timer itself (or any receive while another
thread's tick waited for that commit) read the partition's ack state from a snapshot taken
before that commit. An ack of the old holder committed in between passed its fence and was
missing from the owner's cursor, which then delivered those messages to its own flow, again
after a nack. The owner now delivers such a partition only from a snapshot that already holds
the move (no ack of the old holder can commit after it), and merges that ack state with its own.

Here the "other process" is a second Broker of this process on the same directory (served by
the first through the control socket, like any other process) and the commit order is pinned
by holding the shared group-commit thread in a write until the owner has read its snapshot."""
from __future__ import annotations

import threading

import pytest
from helpers import wait_until

import partq


@pytest.mark.parametrize("mover", ["receive", "tick"])
def test_an_ack_of_the_old_holder_committed_before_the_move_is_not_delivered_again(tmp_path,
                                                                                  mover):
    """``mover``: who runs the due rebalance: the receive of the owner's flow itself (as in the
    harness), or a tick of another thread while that flow receives."""
    data = tmp_path / "d"
    clock = partq.ManualClock(100.0)
    owner = partq.Broker.open(data, clock=clock)
    peer = partq.Broker.open(data, clock=clock)     # shares the store, not the delivery
    early: list = []                               # what ``own`` got before the move was stored
    try:
        owner.create_queue("q", partitions=2, rebalance_delay=1.0, max_handoff_time=0.0,
                           consumer_timeout=600, redelivery_delay=0)   # a nack: back at once
        x = owner.bind("q", name="x")                  # this broker runs delivery
        b = peer.bind("q", name="b")                   # served by it: reads and acks itself
        x.unbind()                                     # a ghost until the delay ends ...
        clock.advance(1.1)
        owner.tick()                                   # ... then b holds both partitions
        assert b.partitions == frozenset({0, 1})
        owner.publish_many("q", [(b"m%d" % i, None) for i in range(40)])
        got = wait_until(lambda: b.receive(100), 30, "the peer flow to receive")
        ones = sorted((m for m in got if m.partition == 1), key=lambda m: m.seq)
        assert len(ones) >= 4, got
        acked, kept = ones[:len(ones) // 2], ones[len(ones) // 2:]   # the chunk stays stored
        own = owner.bind("q", name="own")              # a flow of the owner: holddown ...
        clock.advance(1.1)                             # ... due: the next look rebalances

        writer = owner.store._writer                   # the one group-commit thread of both
        gate = threading.Event()
        blocked = owner.store.submit(lambda w: gate.wait(60))
        try:
            wait_until(lambda: not writer._pending, 30, "the writer to hold the gate write")
            pending_ack = b.ack_many_async(acked)      # queued: b still holds partition 1
            if mover == "receive":
                target = lambda: early.extend(own.receive(100, timeout=30))
            else:
                target = owner.tick
            thread = threading.Thread(target=target)
            thread.start()
            # the rebalance moved partition 1 from b to ``own`` and queued that state write ...
            wait_until(lambda: len(writer._pending) >= 2, 30, "the move's state write")
            with owner.dispatcher._lock:               # ... and the receive read its snapshot
                pass
            if mover == "tick":
                early += own.receive(100, timeout=0)
        finally:
            gate.set()
        blocked.result()
        pending_ack.result()                           # b's ack committed (before the move)
        thread.join(60)
        assert not thread.is_alive()
        assert own.partitions == frozenset({1})
        acked_seqs = {m.seq for m in acked}
        assert {m.partition for m in early} <= {1}, early
        later = own.receive(100, timeout=0)
        assert not acked_seqs & {m.seq for m in early + later}, "acked messages delivered again"
        delivered = sorted(early + later, key=lambda m: m.seq)
        assert [m.seq for m in delivered] == [m.seq for m in kept]
        own.nack(delivered[0])                         # everything unacked comes back ...
        again = own.receive(100)
        assert not acked_seqs & {m.seq for m in again}, "delivered after the ack returned"
        assert [m.seq for m in again] == [m.seq for m in kept]
        own.ack_many(again)
        status = {p.partition: p for p in owner.queue_status("q").partitions}
        assert status[1].ack_floor == kept[-1].seq + 1
    finally:
        peer.close()
        owner.close()
