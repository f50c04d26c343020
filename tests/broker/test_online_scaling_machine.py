"""A hypothesis state machine over online scaling (rule `online-scaling`) of a real Broker (LMDB directory,
ManualClock): keyed and unkeyed publishes, receive, ack, unbind/rebind, online scale up and down,
restart.

The model keeps every message published: its key, partition, sequence and whether it was acked.
Nothing is ever dropped: an online scale-down retires the removed partitions (no new publishes,
still delivered, removed once drained), so the model keeps their messages as any other's.
Checked at every delivery, the per-key order rule across the cut-over: when a message of key k
is delivered, every earlier message of k in another partition has been acked or dropped, and
every earlier one in the same partition has been delivered since the last restart (or acked).
At teardown everything is drained: nothing is lost, nothing is delivered after its ack, the
retired partitions are gone and the queue Ready, and the cut-over record is gone once every old
partition drained.
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass

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
from partq.errors import FlowFenced, InvalidConfig

KEYS = ["a", "b", "c", "d", "e", "f", None]
NAMES = ("c1", "c2")


@dataclass
class Msg:
    key: str | None
    partition: int
    seq: int
    delivered: bool = False     # since the last restart
    acked: bool = False
    dropped: bool = False

    @property
    def done(self) -> bool:
        return self.acked or self.dropped


class OnlineScalingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="partq-online-")
        self.clock = partq.ManualClock(100.0)
        self.broker: partq.Broker | None = None
        self.flows: dict[str, partq.Flow] = {}
        self.held: list[tuple[str, partq.Message]] = []
        self.msgs: list[Msg] = []                       # publish order
        self.by_id: dict[tuple[int, int], Msg] = {}
        self.count = 3

    @initialize(count=st.integers(1, 4))
    def setup(self, count):
        self.count = count
        self.broker = partq.Broker.open(self.dir, clock=self.clock, seed=5)
        self.broker.create_queue("q", partitions=count, rebalance_delay=0.0, max_handoff_time=0.0)
        for name in NAMES:
            self.flows[name] = self.broker.bind("q", name=name)

    def teardown(self) -> None:
        try:
            if self.broker is not None:
                self.finish()
        finally:
            if self.broker is not None:
                self.broker.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def finish(self) -> None:
        """Ack what is held, then drain with every flow until nothing comes: every message not
        dropped was delivered and acked, and the cut-over is gone."""
        for name, m in self.held:
            self.ack_one(name, m)
        self.held = []
        for name in NAMES:
            if name not in self.flows:
                self.flows[name] = self.broker.bind("q", name=name)
        for _ in range(200):
            got = 0
            for name, flow in self.flows.items():
                batch = flow.receive(50)
                self.check_delivered(batch)
                for m in batch:
                    self.ack_one(name, m)
                got += len(batch)
            if not got:
                break
        lost = [m for m in self.msgs if not m.done]
        assert not lost, f"never delivered: {lost[:5]}"
        self.broker.tick()
        assert self.broker.queue_status("q").scaling_status == "Ready", "a drained scale-down"
        assert self.broker.queue_status("q").cutover is None, "the cut-over outlived its drain"

    # ------------------------------------------------------------------ checks
    def check_delivered(self, batch: list[partq.Message]) -> None:
        for m in batch:
            msg = self.by_id.get((m.partition, m.seq))
            assert msg is not None, f"unknown message {m}"
            assert not msg.done, f"acked or dropped message delivered again: {m}"
            if m.key is not None:
                for e in self.msgs:
                    if e is msg:
                        break
                    if e.key != m.key or e.done:
                        continue
                    assert e.partition == m.partition, (
                        f"key {m.key!r}: {m.partition}/{m.seq} delivered while its earlier "
                        f"message {e.partition}/{e.seq} in another partition is not acked")
                    assert e.delivered, (f"key {m.key!r}: {m.partition}/{m.seq} delivered before "
                                         f"{e.partition}/{e.seq}")
            msg.delivered = True

    # ------------------------------------------------------------------ rules
    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=6))
    def publish(self, keys):
        results = self.broker.publish_many("q", [(b"x", k) for k in keys])
        for key, res in zip(keys, results, strict=True):
            assert 0 <= res.partition < self.count
            msg = Msg(key, res.partition, res.seq)
            self.msgs.append(msg)
            self.by_id[(res.partition, res.seq)] = msg

    @precondition(lambda self: self.flows)
    @rule(count=st.integers(1, 8))
    def receive(self, count):
        for name, flow in self.flows.items():
            got = flow.receive(count)
            self.check_delivered(got)
            self.held += [(name, m) for m in got]

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data):
        picks = data.draw(st.lists(st.booleans(), min_size=len(self.held), max_size=len(self.held)))
        keep = []
        for (name, m), pick in zip(self.held, picks, strict=True):
            if not pick:
                keep.append((name, m))
                continue
            self.ack_one(name, m)
        self.held = keep

    def ack_one(self, name: str, m: partq.Message) -> None:
        """Ack ``m``; a flow that lost its partition to a rebalance (a scaling moves partitions)
        is fenced (rule `fencing`): the message comes back to the partition's new flow."""
        msg = self.by_id[(m.partition, m.seq)]
        try:
            self.flows[name].ack(m)
        except FlowFenced:
            assert m.partition not in self.flows[name].partitions
            msg.delivered = False
            return
        msg.acked = True

    @precondition(lambda self: self.flows)
    @rule(name=st.sampled_from(NAMES))
    def unbind(self, name):
        flow = self.flows.pop(name, None)
        if flow is None:
            return
        flow.unbind()
        self.forget_held(lambda n, m: n == name)

    @rule(name=st.sampled_from(NAMES))
    def bind(self, name):
        if name not in self.flows:
            self.flows[name] = self.broker.bind("q", name=name)

    @rule(to=st.integers(1, 6))
    def scale_online(self, to):
        try:
            # a scale-down does not wait for its retired partitions to drain: the delivery
            # owner ends it when they have (a tick)
            self.broker.scale("q", to, online=True, wait=False)
        except InvalidConfig:
            st_ = self.broker.queue_status("q")
            assert st_.cutover is not None or st_.scaling_status == "ScalingDown", \
                "refused with no cut-over and no scale-down draining"
            return
        self.count = to

    @rule()
    def restart(self):
        self.broker.close()
        self.broker = partq.Broker.open(self.dir, clock=self.clock, seed=5)
        self.flows, self.held = {}, []
        for m in self.msgs:
            m.delivered = False
        for name in NAMES:
            self.flows[name] = self.broker.bind("q", name=name)

    def forget_held(self, gone) -> None:
        """Held messages no flow can ack any more come back undelivered (or are dropped)."""
        keep = []
        for name, m in self.held:
            if gone(name, m):
                self.by_id[(m.partition, m.seq)].delivered = False
            else:
                keep.append((name, m))
        self.held = keep

    # ------------------------------------------------------------------ invariants
    @invariant()
    def depth_and_holds(self):
        if self.broker is None:
            return
        st_ = self.broker.queue_status("q")
        assert st_.partition_count == self.count
        assert st_.depth == sum(1 for m in self.msgs if not m.done)
        if st_.cutover is not None:
            for old in st_.cutover["old_partitions"]:
                assert old["remaining"] >= 0 and old["held"] >= 0


SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def test_online_scaling_machine():
    run_state_machine_as_test(OnlineScalingMachine, settings=SETTINGS)
