"""Handoffs under ``ordering="key"`` in which a flow of another process takes part (rule
`key-ordering`): the new flow takes the keys its old flow does not hold at once, and only the
old flow's keys wait: into a flow of another process from the delivery owner's own flow or from
a flow of a third process, and from a flow of another process into the owner's own. (Before,
such a handoff held the whole partition as under "partition".) The seed's example with a
second key: B1, B2 at the old flow, B3, C1, C2 waiting in the moving partition.

"Another process" here is a second Broker of this process on the same directory ("peer"),
served by the first ("owner", which runs delivery) through the control socket like any other
process; a third process is a third Broker."""
from __future__ import annotations

import pytest
from helpers import wait_until

import partq
from partq.errors import FlowFenced

HANDOFF = 60.0


def key_in(partition: int, prefix: str) -> str:
    return next(k for k in (f"{prefix}{i}" for i in range(1000))
                if partq.key_partition(k, 2) == partition)


KEY_A, KEY_B, KEY_C = key_in(0, "a"), key_in(1, "b"), key_in(1, "c")


class Setup:
    """``owner`` runs delivery; ``old`` (on the broker ``ends[0]`` names) holds both partitions
    and has received B1, B2 unacked; ``new`` (on ``ends[1]``) bound: the handoff of partition 1
    from ``old`` to ``new`` has started."""

    def __init__(self, tmp_path, ordering: str, ends: tuple[str, str] = ("owner", "peer")
                 ) -> None:
        data = tmp_path / "d"
        self.clock = partq.ManualClock(100.0)
        self.owner = partq.Broker.open(data, clock=self.clock)
        self.brokers = {"owner": self.owner}
        for name in ("peer", "third"):
            if name in ends:
                self.brokers[name] = partq.Broker.open(data, clock=self.clock)
        self.owner.create_queue("q", partitions=2, rebalance_delay=0.0, ordering=ordering,
                                max_handoff_time=HANDOFF, consumer_timeout=600)
        self.owner.dispatcher.take_over("q")
        self.old = self.brokers[ends[0]].bind("q", name="old")
        wait_until(lambda: self.old.partitions == frozenset({0, 1}), 30, "old to hold both")
        self.owner.publish("q", b"A1", key=KEY_A)
        for payload, key in ((b"B1", KEY_B), (b"B2", KEY_B), (b"B3", KEY_B), (b"C1", KEY_C),
                             (b"C2", KEY_C)):
            self.owner.publish("q", payload, key=key)
        got: list[partq.Message] = []
        while not any(m.payload == b"B2" for m in got):
            got += wait_until(lambda: self.old.receive(1), 30, "old to receive")
        self.old.ack_many([m for m in got if m.partition == 0])
        self.bs = [m for m in got if m.partition == 1]
        assert [m.payload for m in self.bs] == [b"B1", b"B2"]
        self.new = self.brokers[ends[1]].bind("q", name="new")
        assert self.owner.dispatcher.owns("q")
        wait_until(lambda: self.owner.queue_status("q").rebalance_status == "Rebalancing", 30,
                   "the handoff to start")

    def __enter__(self) -> Setup:
        return self

    def __exit__(self, *exc) -> None:
        for broker in reversed(self.brokers.values()):
            broker.close()


@pytest.fixture(params=[("owner", "peer"), ("third", "peer"), ("peer", "owner")],
                ids=["owner-to-peer", "third-to-peer", "peer-to-owner"])
def ends(request):
    return request.param


def receive_all(flow, n: int) -> list[partq.Message]:
    got: list[partq.Message] = []
    while len(got) < n:
        got += wait_until(lambda: flow.receive(10, timeout=0.05), 30,
                          f"{n} messages (have {[m.payload for m in got]})")
    assert len(got) == n
    return got


def take_the_cs(s: Setup) -> None:
    """Under "key": the new flow gets C1 and C2 at once, first delivered, and acks them."""
    got = receive_all(s.new, 2)
    assert [(m.payload, m.redelivered) for m in got] == [(b"C1", False), (b"C2", False)]
    s.new.ack_many(got)


def test_under_partition_order_the_whole_partition_waits(tmp_path):
    with Setup(tmp_path, "partition") as s:
        assert s.new.receive(10, timeout=0.3) == []     # C waits with B
        s.old.ack_many(s.bs)                             # the handoff ends
        got = receive_all(s.new, 3)
        assert [m.payload for m in got] == [b"B3", b"C1", b"C2"]
        s.new.ack_many(got)


def test_under_key_order_only_the_old_flows_keys_wait(tmp_path, ends):
    with Setup(tmp_path, "key", ends) as s:
        take_the_cs(s)                  # their acks count, although the handoff goes on
        assert s.new.receive(10, timeout=0.3) == []     # B3 waits for B1 and B2
        # the owner's status shows the partition with its new flow, and what it holds back
        p1 = wait_until(lambda: (lambda p: p if p.flow == s.new.flow_id else None)(
            s.owner.queue_status("q").partitions[1]), 30, "the new flow shown on partition 1")
        assert (p1.status, p1.held_for, p1.held_keys, p1.held_messages) == \
            ("Ready", ["handoff"], 1, 3)               # B, with B1, B2 and B3
        s.owner.publish("q", b"C3", key=KEY_C)
        (c3,) = receive_all(s.new, 1)
        assert c3.payload == b"C3"
        s.new.ack(c3)
        s.old.ack(s.bs[0])
        assert s.new.receive(10, timeout=0.3) == []     # B2 still held
        s.old.ack(s.bs[1])                               # B drained: the handoff ends
        (b3,) = receive_all(s.new, 1)
        assert (b3.payload, b3.redelivered, b3.delivery_count) == (b"B3", False, 1)
        s.new.ack(b3)
        wait_until(lambda: s.new.partitions == frozenset({1}), 30,
                   "the handoff to end (as the store has it: a flow of another process reads "
                   "its partitions there)")
        assert s.owner.queue_status("q").depth == 0


def test_what_the_old_flow_still_holds_at_the_timeout_comes_first_marked(tmp_path, ends):
    with Setup(tmp_path, "key", ends) as s:
        take_the_cs(s)
        s.old.ack(s.bs[0])                               # B2 stays unacked
        s.clock.advance(HANDOFF + 1)
        s.owner.tick()                                   # the handoff times out
        again = receive_all(s.new, 2)
        assert [(m.payload, m.redelivered, m.delivery_count) for m in again] == \
            [(b"B2", True, 2), (b"B3", False, 1)]
        with pytest.raises(FlowFenced):
            s.old.ack(s.bs[1])                           # too late: the partition moved
        s.new.ack_many(again)
        assert s.new.receive(10, timeout=0.3) == [] and s.owner.queue_status("q").depth == 0


def test_an_old_flows_nack_with_a_delay_holds_its_key_past_the_handoff(tmp_path, ends):
    with Setup(tmp_path, "key", ends) as s:
        take_the_cs(s)
        s.old.ack(s.bs[1])
        s.old.nack(s.bs[0], delay=300)                   # B1 comes back, not before then
        s.clock.advance(HANDOFF + 1)
        s.owner.tick()                                   # the handoff times out
        assert s.new.receive(10, timeout=0.3) == []      # B1 and B3 wait out the delay
        s.owner.publish("q", b"C3", key=KEY_C)
        (c3,) = receive_all(s.new, 1)                    # C does not
        s.new.ack(c3)
        s.clock.advance(300)
        again = receive_all(s.new, 2)
        assert [(m.payload, m.redelivered) for m in again] == [(b"B1", True), (b"B3", False)]
        s.new.ack_many(again)


def test_a_handoff_called_off_gives_what_its_target_took_back_to_the_old_flow(tmp_path,
                                                                             ends):
    with Setup(tmp_path, "key", ends) as s:
        got = receive_all(s.new, 2)                      # C1, C2, not acked
        assert [m.payload for m in got] == [b"C1", b"C2"]
        s.new.unbind()                                   # the handoff is called off
        wait_until(lambda: s.owner.queue_status("q").rebalance_status == "Ready", 30,
                   "the handoff to be called off")
        again = receive_all(s.old, 3)
        assert [m.payload for m in again] == [b"B3", b"C1", b"C2"]
        assert [(m.redelivered, m.delivery_count) for m in again[1:]] == [(True, 2), (True, 2)]
        s.old.ack_many(s.bs + again)
        assert s.owner.queue_status("q").depth == 0
