"""Rebalance dry-run (rule `rebalance-dry-run`): the plan worked out on a copy of the state is what the real
broker then does, and working it out changes nothing."""
from __future__ import annotations

import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import partq
from partq.errors import InvalidConfig

DELAY, HANDOFF = 5.0, 3.0


def assignment(broker) -> dict[str, list[int]]:
    return {f.name: sorted(f.partitions) for f in broker.queue_status("q").flows if f.bound}


@st.composite
def scenarios(draw):
    partitions = draw(st.integers(1, 8))
    names = [f"f{i}" for i in range(draw(st.integers(0, 5)))]
    settle = draw(st.booleans())
    kind = draw(st.sampled_from(["none", "add", "remove", "consumers"]))
    change: dict = {}
    if kind == "add":
        change["add"] = [f"new{i}" for i in range(draw(st.integers(1, 3)))]
    elif kind == "remove" and names:
        change["remove"] = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    elif kind == "consumers":
        change["consumers"] = draw(st.integers(0, 7))
    unacked = draw(st.integers(0, 3))
    return partitions, names, settle, change, unacked


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_plan_is_what_happens(scenario):
    partitions, names, settle, change, unacked = scenario
    d = tempfile.mkdtemp(prefix="partq-plan-")
    clock = partq.ManualClock(100.0)
    try:
        with partq.Broker.open(d, clock=clock) as broker:
            broker.create_queue("q", partitions=partitions, rebalance_delay=DELAY,
                                max_handoff_time=HANDOFF)
            flows = {n: broker.bind("q", name=n) for n in names}
            broker.publish_many("q", [(b"x", f"k{i}") for i in range(4 * partitions)])
            if settle:
                clock.advance(DELAY + HANDOFF + 1)
                broker.tick()
            for flow in flows.values():
                if unacked:
                    flow.receive(unacked)      # handoffs then wait for these (until timeout)
            before = assignment(broker)
            plan = broker.rebalance_plan("q", **change)
            assert assignment(broker) == before, "the dry run changed the assignment"
            # now for real
            for name in change.get("remove", []):
                flows.pop(name).unbind()
            for name in change.get("add", []):
                flows[name] = broker.bind("q", name=name)
            if "consumers" in change:
                for c in plan["changes"]:
                    if c["kind"] == "add":
                        flows[c["name"]] = broker.bind("q", name=c["name"])
                    else:
                        flows.pop(c["name"]).unbind()
            for _ in range(3):                 # the holddown, then the handoffs' timeouts
                clock.advance(DELAY + HANDOFF + 1)
                broker.tick()
            actual = assignment(broker)
            planned = {f["name"]: f["partitions"] for f in plan["after"]}
            assert actual == planned, (plan, actual)
            changed = {p for p in range(partitions)
                       if _owner(before, p) != _owner(actual, p)}
            assert {s["partition"] for s in plan["steps"]} == changed, plan["steps"]
            assert plan["balanced"] == _balanced(actual)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _owner(assign: dict[str, list[int]], p: int) -> str | None:
    return next((n for n, ps in assign.items() if p in ps), None)


def _balanced(assign: dict[str, list[int]]) -> bool:
    counts = [len(ps) for ps in assign.values() if ps]
    return not counts or max(counts) - min(counts) <= 1


def test_a_handoff_shows_its_unacked_messages(broker, clock):
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF)
    a = broker.bind("q", name="a")
    broker.publish_many("q", [(b"x", f"k{i}") for i in range(20)])
    got = a.receive(100)
    plan = broker.rebalance_plan("q", add=["b"])
    (step,) = plan["steps"]
    assert step["action"] == "handoff" and step["when"] == "after holddown"
    assert (step["from_name"], step["to_name"]) == ("a", "b")
    assert step["unacked"] == sum(1 for m in got if m.partition == step["partition"]) > 0
    assert plan["holddown_seconds"] == DELAY and plan["balanced"]


def test_bad_changes_are_refused(broker):
    broker.create_queue("q", partitions=2)
    broker.bind("q", name="a")
    with pytest.raises(InvalidConfig, match="no bound flow named 'x'"):
        broker.rebalance_plan("q", remove=["x"])
    with pytest.raises(InvalidConfig, match="bound already"):
        broker.rebalance_plan("q", add=["a"])
    with pytest.raises(InvalidConfig, match="not both"):
        broker.rebalance_plan("q", consumers=2, add=["b"])
    with pytest.raises(partq.QueueNotFound):
        broker.rebalance_plan("nope")
