"""A Hypothesis state machine of transactions (rule `transactions`) against a model: inputs
published, received, then transactions of acks, nacks and publishes that commit, abort (an
exception in the block) or are refused (an ack of a message consumed already). After every
step the store holds exactly the model's outputs and the model's unconsumed inputs."""
from __future__ import annotations

import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import partq
from partq.ops.browse import browse


class Aborted(Exception):
    pass


class Transactions(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.broker = partq.Broker.open(self.dir.name)
        self.broker.create_queue("in", partitions=2, rebalance_delay=0.0)
        self.broker.create_queue("out", partitions=1)
        self.flow = self.broker.bind("in")
        self.n = 0
        self.held: list[partq.Message] = []     # received, in flight
        self.consumed: list[partq.Message] = []
        self.inputs: set[bytes] = set()          # published, not consumed
        self.outputs: list[bytes] = []

    @rule(k=st.integers(1, 5))
    def publish(self, k: int) -> None:
        items = [(b"%d" % (self.n + i), f"k{(self.n + i) % 3}") for i in range(k)]
        self.n += k
        self.broker.publish_many("in", items)
        self.inputs |= {p for p, _ in items}

    @rule()
    def receive(self) -> None:
        self.held += self.flow.receive(10, timeout=0.5 if self.inputs - self.in_flight() else 0)

    def in_flight(self) -> set[bytes]:
        return {m.payload for m in self.held}

    @precondition(lambda self: self.held)
    @rule(data=st.data(), outcome=st.sampled_from(["commit", "abort", "nack"]))
    def transaction(self, data, outcome: str) -> None:
        picked = data.draw(st.lists(st.sampled_from(self.held), min_size=1, unique_by=id))
        try:
            with self.broker.transaction() as tx:
                for m in picked:
                    if outcome == "nack":
                        tx.nack(m, delay=0)
                    else:
                        tx.publish("out", b"o" + m.payload)
                        tx.ack(m)
                if outcome == "abort":
                    raise Aborted
        except Aborted:
            return
        if outcome == "nack":       # given back: the partitions' later ones too
            back = {(m.partition) for m in picked}
            self.held = [m for m in self.held if m.partition not in back]
            return
        self.outputs += [b"o" + m.payload for m in picked]
        self.consumed += picked
        self.inputs -= {m.payload for m in picked}
        self.held = [m for m in self.held if all(m is not p for p in picked)]

    @precondition(lambda self: self.consumed)
    @rule(data=st.data())
    def consume_again(self, data) -> None:
        m = data.draw(st.sampled_from(self.consumed))
        try:
            with self.broker.transaction() as tx:
                tx.publish("out", b"again")
                tx.ack(m)
        except partq.FlowFenced:
            return
        raise AssertionError("a message consumed twice")

    @invariant()
    def store_matches_the_model(self) -> None:
        store = self.broker.store
        out = sorted(m["payload"] for m in browse(store, "out", limit=0))
        assert out == sorted(self.outputs)
        left = sorted(m["payload"] for m in browse(store, "in", limit=0) if not m["acked"])
        assert left == sorted(self.inputs)

    def teardown(self) -> None:
        self.broker.close()
        self.dir.cleanup()


Transactions.TestCase.settings = settings(max_examples=25, stateful_step_count=20,
                                          deadline=None)
test_transactions_machine = Transactions.TestCase
