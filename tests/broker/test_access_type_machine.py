"""A hypothesis state machine over exclusive/non-exclusive changes of a real Broker (LMDB
directory, ManualClock): publish, bind, unbind, receive, ack, change of access type, restart.

The model: every message lives in one log (a partition, or PARENT). Checked after every step:
* an exclusive queue has at most one active flow, holding exactly {PARENT};
* a partitioned queue's flows hold only partitions, each at most once;
* a change of access type closes every flow bound before it;
* nothing acked is delivered again, and the parent log of an exclusive queue is delivered in
  publish order;
* queue_status depth and parent_depth equal the model's unacked messages in the delivered logs
  and in the parent log.
At teardown the queue is made exclusive and drained: every parent message not acked comes out
(nothing stranded is lost), and partitions' messages are removed with the partitions.
"""
from __future__ import annotations

import shutil
import tempfile

from broker_helpers import drain
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import partq
from partq import PARENT

N = 3
KEYS = ["a", "b", "c", "d", None]


class AccessMachine(RuleBasedStateMachine):
    def __init__(self, partitioner: str = "random") -> None:
        super().__init__()
        self.partitioner = partitioner               # where unkeyed messages go while partitioned
        self.dir = tempfile.mkdtemp(prefix="partq-access-")
        self.clock = partq.ManualClock(100.0)
        self.broker: partq.Broker | None = None
        self.exclusive = False
        self.flows: list[partq.Flow] = []
        self.closed: list[partq.Flow] = []
        self.held: list[tuple[partq.Flow, partq.Message]] = []
        self.unacked: dict[int, set[int]] = {}      # log -> seqs published, not acked, not removed
        self.acked: set[tuple[int, int]] = set()
        self.parent_next = 0                        # next parent seq an exclusive flow may get first

    @initialize(exclusive=st.booleans())
    def setup(self, exclusive):
        self.broker = partq.Broker.open(self.dir, clock=self.clock, seed=3)
        self.broker.create_queue("q", partitions=N, rebalance_delay=0.0,
                                 access_type="exclusive" if exclusive else "non-exclusive",
                                 partitioner=self.partitioner)
        self.exclusive = exclusive

    def teardown(self) -> None:
        try:
            if self.broker is not None:
                if not self.exclusive:
                    self.change()
                for flow in self.flows:
                    flow.unbind()       # their unacked messages come back to the drainer
                got = drain(self.broker.bind("q"), batch=100)
                assert sorted(m.seq for m in got) == sorted(self.unacked.get(PARENT, ()))
        finally:
            if self.broker is not None:
                self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ rules
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=5), batch=st.booleans())
    def publish(self, keys, batch):
        items = [(b"x", k) for k in keys]
        results = (self.broker.publish_many("q", items) if batch
                   else [self.broker.publish("q", p, key=k) for p, k in items])
        for (_, key), res in zip(items, results, strict=True):
            if self.exclusive:
                assert res.partition == PARENT
            else:
                assert 0 <= res.partition < N
                if key is not None:
                    assert res.partition == partq.key_partition(key, N)
            self.unacked.setdefault(res.partition, set()).add(res.seq)

    @rule()
    def bind(self):
        self.flows.append(self.broker.bind("q"))

    @precondition(lambda self: self.flows)
    @rule(data=st.data())
    def unbind(self, data):
        flow = self.flows.pop(data.draw(st.integers(0, len(self.flows) - 1)))
        flow.unbind()
        self.held = [(f, m) for f, m in self.held if f is not flow]

    @precondition(lambda self: self.flows)
    @rule(count=st.integers(1, 7))
    def receive(self, count):
        for flow in self.flows:
            got = flow.receive(count)
            for m in got:
                assert (m.partition, m.seq) not in self.acked, f"acked {m} delivered again"
                assert m.seq in self.unacked.get(m.partition, ()), f"unknown {m}"
                if m.partition == PARENT and not m.redelivered:
                    assert m.seq >= self.parent_next, f"parent order broken at {m}"
                    self.parent_next = m.seq + 1
            self.held += [(flow, m) for m in got]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data):
        picks = data.draw(st.lists(st.booleans(), min_size=len(self.held), max_size=len(self.held)))
        acked = [fm for fm, pick in zip(self.held, picks, strict=False) if pick]
        self.held = [fm for fm, pick in zip(self.held, picks, strict=False) if not pick]
        for flow, m in acked:
            try:
                flow.ack(m)
            except partq.FlowFenced:
                # a flow closed by a change acks a parent message after the queue became
                # exclusive again: the parent log is delivered anew, the ack is fenced (rule `fencing`)
                assert self.exclusive and m.partition == PARENT and flow.closed
                continue
            if m.seq in self.unacked.get(m.partition, ()):
                self.unacked[m.partition].discard(m.seq)
                self.acked.add((m.partition, m.seq))

    @rule()
    def change(self):
        self.broker.update_queue("q", access_type="non-exclusive" if self.exclusive else "exclusive")
        self.exclusive = not self.exclusive
        for flow in self.flows:
            assert flow.closed, "a flow bound before a change of access type is still open"
        self.closed += self.flows
        self.flows = []
        self.held = [(f, m) for f, m in self.held if m.partition == PARENT]  # may still be acked
        if self.exclusive:
            for p in range(N):
                self.unacked.pop(p, None)        # removed with their partitions (rule `scaling`)
            self.parent_next = 0                 # redelivery of the parent starts over

    @rule()
    def restart(self):
        self.broker.close()
        self.broker = partq.Broker.open(self.dir, clock=self.clock, seed=3)
        self.flows, self.held = [], []
        self.parent_next = 0

    # ------------------------------------------------------------------ invariants
    @invariant()
    def assignments(self):
        if self.broker is None:
            return
        held = [f.partitions for f in self.flows]
        if self.exclusive:
            assert sum(1 for h in held if h) <= 1
            assert all(h in (frozenset(), frozenset({PARENT})) for h in held)
            if self.flows:
                assert any(held), "an exclusive queue with flows bound has no active flow"
        else:
            every = [p for h in held for p in h]
            assert len(every) == len(set(every)) and set(every) <= set(range(N))

    @invariant()
    def depths(self):
        if self.broker is None:
            return
        st_ = self.broker.queue_status("q")
        parent = len(self.unacked.get(PARENT, ()))
        delivered = parent if self.exclusive else sum(len(self.unacked.get(p, ())) for p in range(N))
        assert (st_.depth, st_.parent_depth) == (delivered, parent)
        assert st_.access_type == ("exclusive" if self.exclusive else "non-exclusive")


SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_access_machine(partitioner):
    """The machine once per unkeyed partitioner (tests/broker/conftest.py)."""
    run_state_machine_as_test(lambda: AccessMachine(partitioner), settings=SETTINGS)
