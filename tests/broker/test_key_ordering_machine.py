"""Rule `key-ordering` against a simple model, with Hypothesis: one flow of a queue with
``ordering="key"`` receives, acks, nacks (with and without delays) in any order while messages of
a few keys (and unkeyed ones) are published and time passes. Checked at every step:

* every delivered message was published, and none acked is delivered again;
* per key, first deliveries come in publish order, and no message is delivered while the flow
  holds a later message of its key;
* a message delivered again is marked redelivered, its delivery count never goes down;
* at the end, with every delay passed, every unacked message is delivered again and acked once:
  nothing is lost.
"""
from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import partq

KEYS = ["a", "b", "c", None]


class KeyOrderMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="partq-keyorder-")
        self.clock = partq.ManualClock(100.0)
        self.broker = partq.Broker.open(self.dir, clock=self.clock)
        self.published: dict[int, str | None] = {}     # seq -> key (one partition)
        self.acked: set[int] = set()
        self.delivered: dict[int, int] = {}            # seq -> last delivery count seen
        self.held: dict[int, partq.Message] = {}       # what the flow holds unacked
        self.flow = None

    @initialize(max_unacked=st.sampled_from([3, 10, 100]))
    def setup(self, max_unacked):
        self.broker.create_queue("q", partitions=1, rebalance_delay=0, ordering="key",
                                 max_delivered_unacked_per_flow=max_unacked)
        self.flow = self.broker.bind("q")

    def teardown(self) -> None:
        try:
            if self.flow is not None:
                self.clock.advance(1000)
                for _ in range(200):
                    msgs = self.flow.receive(100)
                    self.on_received(msgs)
                    if msgs:
                        self.flow.ack_many(msgs)
                        self.acked.update(m.seq for m in msgs)
                        for m in msgs:
                            self.held.pop(m.seq, None)
                    elif not self.held:
                        break
                    else:
                        self.flow.ack_many(list(self.held.values()))
                        self.acked.update(self.held)
                        self.held.clear()
                assert self.acked == set(self.published), \
                    f"lost: {sorted(set(self.published) - self.acked)}"
        finally:
            self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def on_received(self, msgs) -> None:
        for m in msgs:
            assert m.seq in self.published and m.key == self.published[m.seq]
            assert m.seq not in self.acked, f"acked {m.seq} delivered again"
            if m.seq in self.delivered:
                assert m.redelivered, f"{m.seq} delivered again, not marked"
                assert m.delivery_count >= self.delivered[m.seq]
            else:
                assert not m.redelivered and m.delivery_count == 1
                if m.key is not None:
                    earlier = [s for s, k in self.published.items() if k == m.key and s < m.seq]
                    missing = [s for s in earlier if s not in self.delivered]
                    assert not missing, f"{m.seq} of key {m.key} before {missing}"
            if m.key is not None:
                # never while the consumer holds a later message of its key: key order holds
                # for the consumer, not only in the marks
                later = [s for s in self.held if s > m.seq and self.published[s] == m.key]
                assert not later, f"{m.seq} of key {m.key} while {later} are held"
            self.delivered[m.seq] = m.delivery_count
            self.held[m.seq] = m

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def publish(self, keys):
        results = self.broker.publish_many("q", [(b"m", k) for k in keys])
        for r, k in zip(results, keys, strict=True):
            self.published[r.seq] = k

    @rule(n=st.integers(1, 20))
    def receive(self, n):
        self.on_received(self.flow.receive(n))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data):
        seq = data.draw(st.sampled_from(sorted(self.held)))
        self.flow.ack(self.held.pop(seq))
        self.acked.add(seq)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), delay=st.sampled_from([None, 0.0, 0.5, 2.0]))
    def nack(self, data, delay):
        seq = data.draw(st.sampled_from(sorted(self.held)))
        msg = self.held[seq]
        back = self.flow.nack(msg, delay=delay)
        assert seq in back
        key = msg.key
        assert all(self.published[s] == key for s in back) if key is not None else back == [seq]
        for s in back:
            self.held.pop(s, None)

    @rule(seconds=st.sampled_from([0.3, 1.0, 3.0]))
    def tick(self, seconds):
        self.clock.advance(seconds)

    @invariant()
    def credit(self):
        if self.flow is not None:
            assert self.flow.unacked == len(self.held)


KeyOrderMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                             deadline=None)
test_key_order_machine = KeyOrderMachine.TestCase
