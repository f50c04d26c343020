"""Rule `key-ordering` with consumers coming and going, against a simple model, with Hypothesis:
flows of a two-partition queue with ``ordering="key"`` bind and unbind (so partitions are handed
off, gracefully or by timeout), receive, ack and nack (with and without delays) while messages
of a few keys (and unkeyed ones) are published and time passes. Checked at every delivery:

* it was published and is not acked;
* per key: every earlier unacked message of its key is held by the same flow (no two flows
  process one key at once, and no message overtakes an earlier one of its key);
* a message delivered before comes marked redelivered, its delivery count never lower.

At the end, with every delay and timeout passed, what is left is delivered and acked: nothing is
lost."""
from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

import partq

KEYS = ["a", "b", "c", "d", "e", None]
NAMES = ["f1", "f2", "f3"]


class KeyHandoffMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="partq-keyhandoff-")
        self.clock = partq.ManualClock(100.0)
        self.broker = partq.Broker.open(self.dir, clock=self.clock, seed=1)
        self.keys: dict[tuple[int, int], str | None] = {}       # (partition, seq) -> key
        self.acked: set[tuple[int, int]] = set()
        self.counts: dict[tuple[int, int], int] = {}            # last delivery count seen
        self.flows: dict[str, partq.Flow] = {}
        self.held: dict[str, dict[tuple[int, int], partq.Message]] = {}

    @initialize(handoff=st.sampled_from([0.5, 2.0]))
    def setup(self, handoff):
        self.broker.create_queue("q", partitions=2, rebalance_delay=0.5, ordering="key",
                                 max_handoff_time=handoff, max_poll_interval=0)
        self.bind("f1")

    def teardown(self) -> None:
        try:
            if not self.flows:
                self.bind("f1")
            for _ in range(300):
                self.clock.advance(5)
                self.broker.tick()
                progress = False
                for name, flow in list(self.flows.items()):
                    msgs = flow.receive(100)
                    self.on_received(name, msgs)
                    held = list(self.held[name].values())
                    if held:
                        self.ack_these(name, held)
                        progress = True
                if not progress and len(self.acked) == len(self.keys):
                    break
            assert self.acked == set(self.keys), \
                f"lost: {sorted(set(self.keys) - self.acked)[:10]}"
        finally:
            self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ the model's checks
    def on_received(self, name: str, msgs) -> None:
        for m in msgs:
            pos = (m.partition, m.seq)
            assert pos in self.keys, f"{pos} was never published"
            assert pos not in self.acked, f"{pos} delivered after its ack"
            assert m.key == self.keys[pos]
            for other, held in self.held.items():     # taken back from whoever held it
                if other != name:
                    held.pop(pos, None)
            if m.key is not None:
                for (p, s), k in self.keys.items():
                    if p == m.partition and k == m.key and s < m.seq \
                            and (p, s) not in self.acked:
                        assert (p, s) in self.held[name], (
                            f"{pos} (key {m.key!r}) delivered to {name} while {(p, s)} of its "
                            f"key is {'held by another flow' if self.holder(p, s) else 'pending'}")
            if pos in self.counts:
                assert m.redelivered, f"{pos} delivered again unmarked"
                assert m.delivery_count >= self.counts[pos]
            self.counts[pos] = m.delivery_count
            self.held[name][pos] = m

    def holder(self, p: int, s: int) -> str | None:
        return next((n for n, held in self.held.items() if (p, s) in held), None)

    def ack_these(self, name: str, msgs) -> None:
        try:
            self.flows[name].ack_many(msgs)
        except partq.FlowFenced as exc:       # moved away: those come back to another flow
            for m in exc.messages:
                self.held[name].pop((m.partition, m.seq), None)
            return
        for m in msgs:
            self.acked.add((m.partition, m.seq))
            self.held[name].pop((m.partition, m.seq), None)

    # ------------------------------------------------------------------ rules
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def publish(self, keys):
        for k in keys:
            r = self.broker.publish("q", b"m", key=k)
            self.keys[(r.partition, r.seq)] = k

    @precondition(lambda self: len(self.flows) < len(NAMES))
    @rule(data=st.data())
    def bind(self, name=None, data=None):
        if name is None:
            name = data.draw(st.sampled_from([n for n in NAMES if n not in self.flows]))
        self.flows[name] = self.broker.bind("q", name=name)
        self.held[name] = {}

    @precondition(lambda self: len(self.flows) > 1)
    @rule(data=st.data())
    def unbind(self, data):
        name = data.draw(st.sampled_from(sorted(self.flows)))
        self.flows.pop(name).unbind()
        self.held.pop(name)                   # what it held comes back to another flow

    @precondition(lambda self: self.flows)
    @rule(data=st.data(), n=st.integers(1, 10))
    def receive(self, data, n):
        name = data.draw(st.sampled_from(sorted(self.flows)))
        self.on_received(name, self.flows[name].receive(n))

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data())
    def ack(self, data):
        name = data.draw(st.sampled_from(sorted(n for n, h in self.held.items() if h)))
        held = list(self.held[name].values())
        self.ack_these(name, data.draw(st.lists(st.sampled_from(held), min_size=1,
                                                max_size=len(held), unique_by=id)))

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), delay=st.sampled_from([None, 0.0, 1.0]))
    def nack(self, data, delay):
        name = data.draw(st.sampled_from(sorted(n for n, h in self.held.items() if h)))
        msg = data.draw(st.sampled_from(list(self.held[name].values())))
        try:
            back = self.flows[name].nack(msg, delay)
        except partq.FlowFenced:
            self.held[name].pop((msg.partition, msg.seq), None)
            return
        for s in back:
            self.held[name].pop((msg.partition, s), None)

    @rule(seconds=st.sampled_from([0.3, 1.0, 2.5]))
    def tick(self, seconds):
        self.clock.advance(seconds)
        self.broker.tick()


KeyHandoffMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                               deadline=None)
TestKeyHandoff = KeyHandoffMachine.TestCase
