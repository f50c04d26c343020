"""The pure Rebalancer's persisted state (``to_dict``/``restored``: who holds what, and the
names, survive a broker restart: rule `named-flows`), and a property test: any run of binds,
unbinds, ticks and acks keeps the core consistent and ends balanced (rules
`one-flow-per-partition`, `balanced`). No broker, no I/O.

The core is driven with events and checked through the actions it returns and its queries
(``owner``, ``status``, ``partition_status``, ``partitions_of``).
"""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rebalancer_helpers import (
    DELAY,
    HANDOFF,
    assigns,
    check_consistent,
    complete_all_handoffs,
    one_handoff,
    pauses,
    settle,
    sizes,
)

from partq.core.rebalancer import HOLDDOWN, READY, UNASSIGNED, UNBOUND, Rebalancer


# ---------------------------------------------------------------------- persistence (rule `named-flows`)
def test_to_dict_restored_round_trip():
    r = Rebalancer(5, DELAY, HANDOFF)
    r.bind("f1", 0.0, name="one")
    r.bind("f2", 0.0, name="two")
    r.bind("f3", 0.0)
    settle(r, 0.0)
    state = msgpack.unpackb(msgpack.packb(r.to_dict(), use_bin_type=True), raw=False)
    assert state == r.to_dict()

    back = Rebalancer.restored(state, DELAY, HANDOFF, now=100.0)
    assert back.n == 5
    assert back.owner == r.owner
    for fid, f in r.flows.items():
        g = back.flows[fid]
        assert (g.name, g.order, g.partitions) == (f.name, f.order, f.partitions)
        assert g.bound is False                     # every flow of the last run is a ghost
    assert back.status == HOLDDOWN
    assert back.next_deadline() == pytest.approx(100.0 + DELAY)
    assert all(back.partition_status(p) == UNBOUND for p in range(5))
    check_consistent(back)

    # A named consumer gets its partitions back within the delay; new flows keep ordering.
    actions = back.bind("new-one", 101.0, name="one")
    assert back.partitions_of("new-one") == r.partitions_of("f1")
    assert not pauses(actions)
    assert back.flows["new-one"].order == r.flows["f1"].order
    back.bind("n4", 101.0)
    assert back.flows["n4"].order > max(f.order for f in r.flows.values())

    # The others never return: after the delay their partitions are remapped (no pause needed).
    actions = back.tick(100.0 + DELAY)
    complete_all_handoffs(back, 100.0 + DELAY)
    assert sizes(back) in ([3, 2], [2, 3])
    assert all(o is not None for o in back.owner)
    check_consistent(back)

    # Restoring the restored state again is stable.
    again = Rebalancer.restored(back.to_dict(), DELAY, HANDOFF, now=0.0)
    assert again.owner == back.owner


def test_restored_with_handoff_in_progress_keeps_it_with_source():
    r, p, now = one_handoff()
    back = Rebalancer.restored(r.to_dict(), DELAY, HANDOFF, now=50.0)
    assert back.owner[p] == "a"
    assert not back.handoffs
    check_consistent(back)


def test_restored_nobody_returns_partitions_become_unassigned():
    r = Rebalancer(3, DELAY, HANDOFF)
    r.bind("a", 0.0)
    back = Rebalancer.restored(r.to_dict(), DELAY, HANDOFF, now=10.0)
    back.tick(10.0 + DELAY)
    assert back.status == READY
    assert all(back.partition_status(p) == UNASSIGNED for p in range(3))
    actions = back.bind("b", 20.0)
    assert assigns(actions) == {0: "b", 1: "b", 2: "b"}


def test_restored_empty_state_is_ready():
    back = Rebalancer.restored(Rebalancer(3, DELAY, HANDOFF).to_dict(), DELAY, HANDOFF, now=0.0)
    assert back.status == READY
    assert back.owner == [None, None, None]


# ---------------------------------------------------------------------- property test of the core
events = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("unbind"), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 2.0, HANDOFF, DELAY, 20.0]), st.booleans()),
        st.tuples(st.just("acked"), st.integers(0, 6), st.booleans()),
    ),
    max_size=40)


def run_core(n, evs) -> None:
    r = Rebalancer(n, DELAY, HANDOFF)
    now = 0.0
    live: dict[int, str] = {}
    counter = 0
    for kind, x, flag in evs:
        if kind == "bind":
            if x in live:
                continue
            counter += 1
            fid = f"f{counter}"
            hint = None
            if flag:   # present some ghost's partition set as a hint
                ghosts = [f for f in r.flows.values() if not f.bound]
                hint = set(ghosts[0].partitions) if ghosts else None
            r.bind(fid, now, name=f"n{x}" if not flag else None, hint=hint)
            live[x] = fid
        elif kind == "unbind":
            if x in live:
                r.unbind(live.pop(x), now)
        elif kind == "tick":
            now += x
            r.tick(now)
        else:
            if x < n and x in r.handoffs and flag:
                r.acked(x, 0, now)
        check_consistent(r)
    # Let everything settle.
    now += DELAY + HANDOFF + 1
    r.tick(now)
    now += HANDOFF + 1
    r.tick(now)
    check_consistent(r)
    assert not r.handoffs and r.status == READY
    bound = r.bound_flows()
    assert not [f for f in r.flows.values() if not f.bound], "ghosts outlived the delay"
    if bound:
        assert all(o is not None for o in r.owner), "a partition is unassigned with flows bound"
        counts = [len(f.partitions) for f in bound]
        active = sorted(counts, reverse=True)[: n]
        assert max(active) - min(active) <= 1, counts
        assert sum(1 for c in counts if c) == min(n, len(bound))


# Regressions: a bind while handoffs ran, and a handoff target leaving, once left a flow out of
# the balance for good.
@example(n=4, evs=[("bind", 1, False), ("bind", 2, False), ("tick", DELAY, False),
                   ("bind", 0, False)])
@example(n=2, evs=[("bind", 0, False), ("bind", 2, False), ("bind", 1, False),
                   ("tick", DELAY, False), ("unbind", 2, False)])
@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 6), evs=events)
def test_core_invariants_and_eventual_balance(n, evs):
    run_core(n, evs)
