"""A hypothesis state machine driving a real Broker (LMDB directory, ManualClock) through binds
(named or not), unbinds, rebinds with a hint, keyed publishes, receives, acks, nacks, clock jumps
and broker restarts, against a small model.

Checked after every step:
* rule `one-flow-per-partition`: no partition is held by two live flows; queue_status agrees with the flows'
  own view, and no partition is Unassigned while a flow is bound;
* rule `max-unacked`: no flow holds more than max_delivered_unacked_per_flow unacked;
* no acked message is ever delivered again;
* rule `partition-order`: a first-time delivery of (p, seq) happens only after every earlier message of
  partition p (hence of its key) was delivered, and a message delivered before is always marked redelivered
  (a first delivery is marked only after a restart: the documented false positive);
* the broker's per-flow unacked count equals the model's (messages of a partition that moved
  away are forgotten and go to the new owner);
* rules `bind-hint` and `named-flows`: a rebind by name, or with a hint equal to a ghost's set, within the
  delay gets exactly that set; named consumers re-bound right after a restart get their partitions back.
Checked when the `settle` rule runs (clock far ahead, timers run): balance (rule `balanced`), every
partition
held, statuses Ready. At teardown everything is drained: every published message was delivered
and acked (nothing lost). `bind_while_busy` scales out while every consumer holds unacked
messages, so handoffs regularly have to wait (Paused) for acks or max_handoff_time.
"""
from __future__ import annotations

import shutil
import tempfile

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

DELAY = 5.0
HANDOFF = 3.0
KEYS = ["k0", "k1", "k2", "k3", "k4", None]
SLOTS = range(5)          # consumer slots; more slots than partitions gives standbys


class BrokerMachine(RuleBasedStateMachine):
    def __init__(self, partitioner: str = "random") -> None:
        super().__init__()
        self.partitioner = partitioner                   # where unkeyed messages go
        self.dir = tempfile.mkdtemp(prefix="partq-sm-")
        self.clock = partq.ManualClock(100.0)
        self.broker: partq.Broker | None = None
        self.flows: dict[int, partq.Flow] = {}           # slot -> live flow
        self.named: dict[int, bool] = {}                 # slot -> bound with a name
        self.hints: dict[int, frozenset[int]] = {}       # slot -> partitions when it left
        self.held: dict[int, list[partq.Message]] = {}   # slot -> received, not acked/nacked
        self.published: dict[tuple[int, int], str | None] = {}   # (p, seq) -> key
        self.by_partition: dict[int, list[int]] = {}     # p -> seqs in publish order
        self.by_key: dict[str, list[tuple[int, int]]] = {}
        self.delivered: set[tuple[int, int]] = set()
        self.counts: dict[tuple[int, int], int] = {}     # the last delivery count seen
        self.acked: set[tuple[int, int]] = set()
        self.n = 0
        self.max_unacked = 0

    # ------------------------------------------------------------------ setup
    @initialize(n=st.sampled_from([3, 2, 4, 1]), max_unacked=st.sampled_from([5, 2, 1000]),
                initial=st.sampled_from([2, 1, 0, 3]), messages=st.integers(0, 12))
    def setup(self, n, max_unacked, initial, messages):
        self.n = n
        self.max_unacked = max_unacked
        self.broker = partq.Broker.open(self.dir, clock=self.clock, seed=7)
        self.broker.create_queue("q", partitions=n, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                                 max_delivered_unacked_per_flow=max_unacked,
                                 partitioner=self.partitioner,
                                 # the model has no hung consumers: ~23 settles pass the default
                                 # 300 s (that rule: test_endpoint_contract.py, a flow whose handler hangs)
                                 max_poll_interval=0)
        # Start from a busy queue: some consumers bound, messages waiting.
        for slot in range(initial):
            self.do_bind(slot, named=slot % 2 == 0)
        if messages:
            self.publish([KEYS[i % len(KEYS)] for i in range(messages)], batch=True)

    def teardown(self) -> None:
        try:
            if self.broker is not None and self.n:
                self.final_drain()
        finally:
            if self.broker is not None:
                self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    def status(self):
        return self.broker.queue_status("q")

    def ghost_with(self, pred):
        for f in self.status().flows:
            if not f.bound and f.partitions and pred(f):
                return f
        return None

    def on_received(self, slot: int, msgs) -> None:
        flow = self.flows[slot]
        parts = flow.partitions
        for m in msgs:
            mid = (m.partition, m.seq)
            assert mid in self.published, f"delivered a message never published: {mid}"
            assert m.key == self.published[mid]
            assert mid not in self.acked, f"acked message {mid} delivered again"
            assert m.partition in parts, f"{mid} delivered to a flow not holding partition {m.partition}"
            if mid in self.delivered:
                assert m.redelivered, f"{mid} delivered before but not marked redelivered"
                assert m.delivery_count >= self.counts[mid], f"the delivery count of {mid} went down"
            else:
                # every restart here is a clean close: counts and marks stay exact (rule `delivery-count`)
                assert not m.redelivered, f"first delivery of {mid} marked redelivered"
                assert m.delivery_count == 1, f"first delivery of {mid} counted {m.delivery_count}"
                earlier = [s for s in self.by_partition[m.partition] if s < m.seq]
                missing = [s for s in earlier if (m.partition, s) not in self.delivered]
                assert not missing, (f"first delivery of {mid} before earlier messages "
                                     f"{missing} of its partition (rule `partition-order`)")
                if m.key is not None:
                    before = self.by_key[m.key][: self.by_key[m.key].index(mid)]
                    assert all(x in self.delivered for x in before), f"key order broken at {mid}"
                self.delivered.add(mid)
            self.counts[mid] = m.delivery_count
        got = {(m.partition, m.seq) for m in msgs}
        for other, held in self.held.items():       # the broker now counts them against `slot`
            if other != slot:
                self.held[other] = [m for m in held if (m.partition, m.seq) not in got]
        mine = [m for m in self.held.get(slot, []) if (m.partition, m.seq) not in got]
        self.held[slot] = mine + list(msgs)
        assert flow.unacked <= self.max_unacked

    def prune_held(self) -> None:
        """Keep `held` equal to what the broker counts as in flight per flow: messages of a
        partition the flow no longer owns were forgotten when the partition moved (they will be
        redelivered to the new owner)."""
        for slot, flow in self.flows.items():
            parts = flow.partitions
            self.held[slot] = [m for m in self.held.get(slot, []) if m.partition in parts]
            assert len(self.held[slot]) == flow.unacked, (self.held[slot], flow.unacked)

    def do_bind(self, slot: int, named: bool, hint=None) -> None:
        name = f"c{slot}" if named else None
        expect = None
        st_ = self.status() if self.broker.dispatcher.owns("q") else None
        if st_ is not None and st_.rebalance_status == "Holddown":
            if named:
                g = self.ghost_with(lambda f: f.name == name)
                expect = None if g is None else frozenset(g.partitions)
            elif hint is not None:
                g = self.ghost_with(lambda f: frozenset(f.partitions) == hint)
                expect = None if g is None else hint
        flow = self.broker.bind("q", name=name, hint=hint)
        self.flows[slot] = flow
        self.named[slot] = named
        self.held[slot] = []
        if expect is not None:
            assert flow.partitions == expect, "a returning consumer did not get its partitions back"

    def settle_clock(self) -> None:
        self.clock.advance(DELAY + HANDOFF + 1)
        self.broker.tick()
        self.clock.advance(HANDOFF + 1)
        self.broker.tick()

    # ------------------------------------------------------------------ rules
    @precondition(lambda self: len(self.flows) < len(SLOTS))
    @rule(data=st.data(), named=st.booleans())
    def bind(self, data, named):
        slot = data.draw(st.sampled_from([s for s in SLOTS if s not in self.flows]), label="slot")
        self.do_bind(slot, named)

    @precondition(lambda self: len(self.flows) < len(SLOTS))
    @rule(data=st.data(), named=st.booleans())
    def bind_while_busy(self, data, named):
        """Scale out while every consumer holds unacked messages, then let the delay pass: the
        handoffs this starts have to wait for acks or for max_handoff_time (rule `handoff`)."""
        for slot, flow in list(self.flows.items()):
            self.on_received(slot, flow.receive(20))
        slot = data.draw(st.sampled_from([s for s in SLOTS if s not in self.flows]), label="slot")
        self.do_bind(slot, named)
        self.clock.advance(DELAY)
        self.broker.tick()

    @precondition(lambda self: self.flows)
    @rule(data=st.data())
    def unbind(self, data):
        slot = data.draw(st.sampled_from(sorted(self.flows)), label="slot")
        flow = self.flows.pop(slot)
        self.hints[slot] = flow.partitions
        flow.unbind()
        self.held.pop(slot, None)

    @precondition(lambda self: set(self.hints) - set(self.flows))
    @rule(data=st.data())
    def rebind_with_hint(self, data):
        slot = data.draw(st.sampled_from(sorted(set(self.hints) - set(self.flows))), label="slot")
        self.do_bind(slot, False, hint=self.hints[slot])

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), batch=st.booleans())
    def publish(self, keys, batch):
        items = [(b"m", k) for k in keys]
        if batch:
            results = self.broker.publish_many("q", items)
        else:
            results = [self.broker.publish("q", b"m", key=k) for _, k in items]
        for r, k in zip(results, keys, strict=True):
            mid = (r.partition, r.seq)
            assert mid not in self.published
            if k is not None:
                assert r.partition == partq.key_partition(k, self.n)
                self.by_key.setdefault(k, []).append(mid)
            self.published[mid] = k
            self.by_partition.setdefault(r.partition, []).append(r.seq)

    @precondition(lambda self: self.flows)
    @rule(data=st.data(), count=st.integers(1, 6))
    def receive(self, data, count):
        slot = data.draw(st.sampled_from(sorted(self.flows)), label="slot")
        self.on_received(slot, self.flows[slot].receive(count))

    @precondition(lambda self: self.flows)
    @rule()
    def receive_everywhere(self):
        """Every live flow takes what it can and acks nothing (so handoffs have to wait)."""
        for slot, flow in list(self.flows.items()):
            self.on_received(slot, flow.receive(20))

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), pick=st.lists(st.booleans(), min_size=1, max_size=8))
    def ack(self, data, pick):
        slot = data.draw(st.sampled_from(sorted(s for s, h in self.held.items() if h)), label="slot")
        self.prune_held()
        held = self.held[slot]
        chosen = [m for m, take in zip(held, pick, strict=False) if take]
        if not chosen:
            return
        self.flows[slot].ack_many(chosen)
        ids = {(m.partition, m.seq) for m in chosen}
        self.acked |= ids
        for other in self.held:
            self.held[other] = [m for m in self.held[other] if (m.partition, m.seq) not in ids]
        self.prune_held()

    @precondition(lambda self: any(self.held.values()))
    @rule(data=st.data(), index=st.integers(0, 7))
    def nack(self, data, index):
        slot = data.draw(st.sampled_from(sorted(s for s, h in self.held.items() if h)), label="slot")
        self.prune_held()
        held = self.held[slot]
        if not held:
            return
        m = held[index % len(held)]
        self.flows[slot].nack(m)
        # It and every later message of its partition will come again.
        self.held[slot] = [x for x in held if not (x.partition == m.partition and x.seq >= m.seq)]
        self.prune_held()

    @rule(seconds=st.sampled_from([0.1, 1.0, HANDOFF / 2, HANDOFF, DELAY - 0.5, DELAY, 20.0]))
    def tick(self, seconds):
        self.clock.advance(seconds)
        self.broker.tick()

    @rule()
    def restart(self):
        before = {slot: f.partitions for slot, f in self.flows.items()}
        self.broker.close()
        self.clock.advance(0.5)
        self.broker = partq.Broker.open(self.dir, clock=self.clock, seed=7)
        named = sorted(s for s in self.flows if self.named[s])
        for slot in list(self.flows):
            self.hints[slot] = before[slot]
        self.flows.clear()
        self.held.clear()
        # unnamed flows left when the broker closed: their partitions may have gone to named ones
        left = frozenset().union(*(p for s, p in before.items() if not self.named[s]))
        for slot in named:
            self.do_bind(slot, True)
            got = self.flows[slot].partitions
            assert before[slot] <= got <= before[slot] | left, \
                f"named consumer c{slot} lost its partitions across a restart (rule `named-flows`)"

    @rule()
    def settle(self):
        self.settle_clock()
        self.check_settled()

    # ------------------------------------------------------------------ invariants
    @invariant()
    def one_owner_per_partition(self):
        if self.broker is None or not self.n:
            return
        self.prune_held()
        seen: dict[int, int] = {}
        for slot, flow in self.flows.items():
            for p in flow.partitions:
                assert p not in seen, \
                    f"partition {p} held by c{seen[p]} and c{slot} (rule `one-flow-per-partition`)"
                assert 0 <= p < self.n
                seen[p] = slot
            assert flow.unacked <= self.max_unacked
        if self.flows:
            st_ = self.status()
            by_id = {f.flow_id: f for f in self.flows.values()}
            for ps in st_.partitions:
                assert ps.status != "Unassigned", f"partition {ps.partition} unassigned with flows bound"
                if ps.flow in by_id:
                    assert ps.partition in by_id[ps.flow].partitions
                    assert ps.status in ("Ready", "Paused")
                else:
                    assert ps.status == "Unbound", (ps, st_.flows)
            assert st_.rebalance_status in ("Ready", "Holddown", "Rebalancing")

    def check_settled(self):
        st_ = self.status() if self.flows else None
        if not self.flows:
            return
        assert st_.rebalance_status == "Ready"
        assert all(p.status == "Ready" for p in st_.partitions), st_.partitions
        counts = sorted((len(f.partitions) for f in self.flows.values()), reverse=True)
        assert sum(counts) == self.n, "every partition is held when a flow is bound"
        active = counts[: self.n]
        assert max(active) - min(active) <= 1, f"unbalanced after settling: {counts} (rule `balanced`)"
        assert sum(1 for c in counts if c) == min(self.n, len(counts))

    # ------------------------------------------------------------------ the end
    def final_drain(self):
        if not self.flows:
            self.do_bind(99, False)
        for _ in range(200):
            self.settle_clock()
            self.check_settled()
            progressed = False
            for slot, flow in list(self.flows.items()):
                got = flow.receive(1000)
                if got:
                    progressed = True
                    self.on_received(slot, got)
                self.prune_held()      # what moved away is fenced (rule `fencing`): the new owner acks it
                held = self.held.get(slot, [])
                if held:
                    progressed = True
                    flow.ack_many(held)
                    self.acked |= {(m.partition, m.seq) for m in held}
                    self.held[slot] = []
            if not progressed:
                break
        missing = set(self.published) - self.acked
        assert not missing, f"messages never delivered and acked: {sorted(missing)}"
        assert self.delivered >= set(self.published)
        assert self.status().depth == 0


SETTINGS = settings(max_examples=100, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_broker_machine(partitioner):
    """The machine once per unkeyed partitioner (tests/broker/conftest.py)."""
    run_state_machine_as_test(lambda: BrokerMachine(partitioner), settings=SETTINGS)
