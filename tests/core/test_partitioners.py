"""Unkeyed partitioners (rules `unkeyed-partitioner`, `sticky`, `adaptive` and `availability-timeout`;
KIP-794): properties that a wrong partitioner fails.

Every partitioner here gets its randomness from a seeded ``random.Random`` and its time as a
number, so each property is checked on exact, reproducible runs.
"""
import ast
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partq.core.partitioners as partitioners_module
from partq import QueueConfig
from partq.core.partitioners import (
    PartitionLoad,
    RandomPartitioner,
    StickyPartitioner,
    adaptive_weights,
    make_partitioner,
)

seeds = st.integers(0, 2**32 - 1)


def idle_load(backlog, now=0.0):
    """A load whose flows all accepted something just now (nothing is unavailable)."""
    return PartitionLoad(backlog=list(backlog), last_accept=[now] * len(backlog))


# ------------------------------------------------------------------ uniform sticky (rule `sticky`)
@settings(max_examples=150, deadline=None)
@given(seed=seeds, n=st.integers(1, 64), batch=st.integers(1, 64), adaptive=st.booleans(),
       sizes=st.data())
def test_uniform_mode_spreads_bytes_within_one_batch(seed, n, batch, adaptive, sizes):
    """Strict uniformity: at every moment the bytes per partition differ by at most one batch
    plus one message (B + M - 1 < 2B), however many messages and whatever their sizes. Adaptive
    mode without load information must behave the same (rule `adaptive` falls back to uniform)."""
    msgs = sizes.draw(st.lists(st.integers(1, batch), max_size=600), label="sizes")
    part = StickyPartitioner(random.Random(seed), batch_size=batch, adaptive=adaptive)
    totals = [0] * n
    largest = 0
    for size in msgs:
        p = part.partition(n, size, None, 0.0)
        assert 0 <= p < n
        totals[p] += size
        largest = max(largest, size)
        assert max(totals) - min(totals) <= batch + largest - 1, totals


@settings(max_examples=20, deadline=None)
@given(seed=seeds, n=st.integers(2, 16), batch=st.integers(2, 32))
def test_uniform_mode_long_run_with_adversarial_sizes(seed, n, batch):
    """Sizes that make one stint long (B-1 then B) and the next short (B): a partitioner that
    counts stints or batches instead of bytes drifts without bound; this one stays within 2B."""
    part = StickyPartitioner(random.Random(seed), batch_size=batch, adaptive=False)
    totals = [0] * n
    pattern = [batch - 1, batch, batch]
    for i in range(3000):
        size = pattern[i % 3]
        totals[part.partition(n, size, None, 0.0)] += size
        assert max(totals) - min(totals) <= 2 * batch - 1


def test_uniform_mode_equal_sizes_is_a_permutation_per_round():
    """Equal messages and B = message size: every round of n stints visits every partition once,
    in an order that varies between rounds (random tie-break)."""
    n = 8
    part = StickyPartitioner(random.Random(7), batch_size=100, adaptive=False)
    rounds = [[part.partition(n, 100, None, 0.0) for _ in range(n)] for _ in range(50)]
    assert all(sorted(r) == list(range(n)) for r in rounds)
    assert len({tuple(r) for r in rounds}) > 40


@settings(max_examples=150, deadline=None)
@given(seed=seeds, n=st.integers(1, 32), batch=st.integers(1, 200), adaptive=st.booleans(),
       data=st.data())
def test_sticky_stays_until_the_byte_threshold_is_crossed(seed, n, batch, adaptive, data):
    """Rule `sticky`: a message goes to the same partition as the one before it unless the bytes of the
    current stint (counting the message that crossed) reached batch_size. Checked with and
    without load, since adaptive switching must not shorten stints either."""
    msgs = data.draw(st.lists(st.tuples(st.integers(1, 2 * batch),
                                        st.lists(st.integers(0, 50), min_size=n, max_size=n)),
                              max_size=300), label="messages")
    part = StickyPartitioner(random.Random(seed), batch_size=batch, adaptive=adaptive)
    previous, stint = None, 0
    for size, backlog in msgs:
        p = part.partition(n, size, idle_load(backlog), 0.0)
        if previous is not None and stint < batch:
            assert p == previous, f"left partition {previous} after {stint} of {batch} bytes"
        if previous is None or stint >= batch:
            stint = 0  # a new stint starts with this message
        stint += size
        previous = p


def test_sticky_switches_after_threshold_worked_example():
    """B = 10, sizes 9, 10, 3, 3, 3, 1: stints are [9, 10] then [3, 3, 3, 1]."""
    part = StickyPartitioner(random.Random(1), batch_size=10, adaptive=False)
    got = [part.partition(2, s, None, 0.0) for s in (9, 10, 3, 3, 3, 1)]
    assert got[0] == got[1] and got[2] == got[3] == got[4] == got[5] and got[1] != got[2]


def test_empty_messages_still_rotate():
    """A size-0 message counts as one byte, so a stream of empty payloads is not stuck forever."""
    part = StickyPartitioner(random.Random(3), batch_size=4, adaptive=False)
    got = [part.partition(3, 0, None, 0.0) for _ in range(12)]
    assert sorted(set(got)) == [0, 1, 2]
    assert got[0:4] == [got[0]] * 4


# ------------------------------------------------------------------ adaptive switching (rule `adaptive`)
@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 64), data=st.data())
def test_adaptive_weights_favour_the_empty_partition(n, data):
    empty = data.draw(st.integers(0, n - 1), label="empty")
    backlog = data.draw(st.lists(st.integers(1, 10**9), min_size=n, max_size=n), label="backlog")
    backlog[empty] = 0
    weights = adaptive_weights(backlog, range(n))
    assert weights[empty] == 1.0
    assert all(w < weights[empty] for p, w in enumerate(weights) if p != empty)
    # inverse of (backlog + 1): doubling (backlog + 1) halves the weight
    assert all(math.isclose(w * (backlog[p] + 1), 1.0) for p, w in enumerate(weights))


@settings(max_examples=25, deadline=None)
@given(seed=seeds, n=st.integers(2, 64), data=st.data())
def test_adaptive_chooses_a_drained_partition_most_often(seed, n, data):
    """With batch_size 1 every message is a switch. One partition is empty, the rest hold 10 or
    more: the empty one is chosen more often than any other."""
    empty = data.draw(st.integers(0, n - 1), label="empty")
    backlog = data.draw(st.lists(st.integers(10, 10**6), min_size=n, max_size=n), label="backlog")
    backlog[empty] = 0
    load = idle_load(backlog)
    part = StickyPartitioner(random.Random(seed), batch_size=1, adaptive=True)
    counts = [0] * n
    for _ in range(1000):
        counts[part.partition(n, 1, load, 0.0)] += 1
    assert counts[empty] == max(counts)
    assert all(counts[p] < counts[empty] for p in range(n) if p != empty), counts


def test_adaptive_proportions_match_inverse_backlog():
    """Backlogs [0, 3, 9] -> probabilities [0.741, 0.185, 0.074] (weights 1, 1/4, 1/10)."""
    part = StickyPartitioner(random.Random(11), batch_size=1, adaptive=True)
    load = idle_load([0, 3, 9])
    draws = 40_000
    counts = [0, 0, 0]
    for _ in range(draws):
        counts[part.partition(3, 1, load, 0.0)] += 1
    for got, expected in zip(counts, (1 / 1.35, 0.25 / 1.35, 0.1 / 1.35), strict=True):
        sd = math.sqrt(draws * expected * (1 - expected))
        assert abs(got - draws * expected) < 5 * sd, counts


@settings(max_examples=25, deadline=None)
@given(seed=seeds, n=st.integers(1, 16), batch=st.integers(1, 8),
       initial=st.lists(st.integers(0, 400), min_size=16, max_size=16))
def test_adaptive_never_starves_a_partition_that_drains(seed, n, batch, initial):
    """Simulated run: one message of size 1 published per step, every partition drains one
    message per step, starting from arbitrary (possibly huge, very unequal) backlogs. Every
    partition receives data, including those that started with the largest backlog."""
    backlog = initial[:n]
    part = StickyPartitioner(random.Random(seed), batch_size=batch, adaptive=True)
    received = [0] * n
    steps = 2 * max(backlog) + 60 * n * batch
    for step in range(steps):
        p = part.partition(n, 1, idle_load(backlog, float(step)), float(step))
        backlog[p] += 1
        received[p] += 1
        backlog = [max(b - 1, 0) for b in backlog]
    assert all(received), received


# ----------------------------------------------- availability timeout (rule `availability-timeout`)
@settings(max_examples=60, deadline=None)
@given(seed=seeds, n=st.integers(2, 32), batch=st.integers(1, 50), timeout=st.floats(0.01, 60),
       data=st.data())
def test_stuck_partition_is_never_chosen_while_another_is_available(seed, n, batch, timeout, data):
    """A partition with backlog whose flow accepted nothing for longer than the timeout gets no
    message while any partition is available (not at a switch, and not mid-stint either); once
    it drains it is chosen again."""
    now = 1000.0
    stuck = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1), label="stuck")
    backlog = data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n), label="backlog")
    last = [now] * n
    for p in stuck:
        backlog[p] = max(backlog[p], 1) * 50  # stuck, with a large backlog
        last[p] = now - timeout * 1.5 - 0.001
    load = PartitionLoad(backlog, last)
    part = StickyPartitioner(random.Random(seed), batch_size=batch, adaptive=True,
                             availability_timeout=timeout)
    for _ in range(300):
        assert part.partition(n, 1, load, now) not in stuck

    # A stint that began on a healthy partition which then gets stuck moves elsewhere at once.
    part = StickyPartitioner(random.Random(seed), batch_size=10**6, adaptive=True,
                             availability_timeout=timeout)
    first = part.partition(n, 1, idle_load([0] * n, now), now)
    frozen = PartitionLoad([5 if p == first else 0 for p in range(n)],
                           [now - 2 * timeout - 1 if p == first else now for p in range(n)])
    assert part.partition(n, 1, frozen, now) != first

    # Drained: the stuck partitions now have backlog 0 (their last accept is still old), the
    # others are loaded; every formerly stuck partition is chosen again.
    drained = PartitionLoad([0 if p in stuck else 20 for p in range(n)], last)
    part = StickyPartitioner(random.Random(seed), batch_size=1, adaptive=True,
                             availability_timeout=timeout)
    chosen = {part.partition(n, 1, drained, now) for _ in range(60 * n)}
    assert stuck <= chosen


def test_availability_boundary_is_strictly_longer_than_the_timeout():
    """Timeout 2.0, partition 0 last accepted at 10.0 with a backlog. At 12.0 it has been idle
    exactly the timeout: still available. At 12.5: unavailable."""
    load = PartitionLoad([5, 5], [10.0, 12.0])
    for now, expected in ((12.0, {0, 1}), (12.5, {1})):
        part = StickyPartitioner(random.Random(5), batch_size=1, adaptive=True,
                                 availability_timeout=2.0)
        assert {part.partition(2, 1, load, now) for _ in range(200)} == expected


@settings(max_examples=40, deadline=None)
@given(seed=seeds, n=st.integers(1, 16), data=st.data())
def test_all_unavailable_falls_back_to_all(seed, n, data):
    backlog = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n), label="backlog")
    load = PartitionLoad(backlog, [0.0] * n)
    part = StickyPartitioner(random.Random(seed), batch_size=1, adaptive=True,
                             availability_timeout=1.0)
    chosen = {part.partition(n, 1, load, 100.0) for _ in range(80 * n)}
    assert chosen == set(range(n))


def test_timeout_is_ignored_without_adaptive():
    """KIP-794: the availability timeout is part of adaptive partitioning only."""
    part = StickyPartitioner(random.Random(2), batch_size=1, adaptive=False,
                             availability_timeout=1.0)
    load = PartitionLoad([5, 5], [0.0, 0.0])  # both stuck
    assert {part.partition(2, 1, load, 100.0) for _ in range(20)} == {0, 1}
    load = PartitionLoad([5, 0], [0.0, 0.0])  # only 0 stuck: uniform mode still uses it
    assert [part.partition(2, 1, load, 100.0) for _ in range(20)].count(0) == 10


# -------------------------------------------------- random partitioner (rule `unkeyed-partitioner`)
@pytest.mark.parametrize("n", [2, 7, 64])
def test_random_partitioner_is_uniform_chi_square(n):
    draws = 400 * n
    part = RandomPartitioner(random.Random(20240601 + n))
    counts = [0] * n
    for i in range(draws):
        counts[part.partition(n, 100 + i % 50, None, 0.0)] += 1
    expected = draws / n
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    # 99.9th percentile of chi-square with n-1 degrees of freedom (Wilson-Hilferty).
    df, z = n - 1, 3.090
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < critical, (chi2, critical, counts)


def test_random_partitioner_ignores_load():
    """The random partitioner is the broker's documented default: load does not steer it."""
    part = RandomPartitioner(random.Random(4))
    load = idle_load([10**6, 0, 0, 0])
    assert [part.partition(4, 1, load, 0.0) for _ in range(4000)].count(0) > 800


# ------------------------------------------------------------------ scaling, determinism
kinds = st.sampled_from(["random", "uniform", "adaptive", "adaptive-timeout"])


def build(kind, seed, batch):
    rng = random.Random(seed)
    if kind == "random":
        return RandomPartitioner(rng)
    return StickyPartitioner(rng, batch_size=batch, adaptive=kind != "uniform",
                             availability_timeout=1.0 if kind == "adaptive-timeout" else 0.0)


def call_stream(n_max=64):
    """Calls of (n, size, backlog or None, last-accept age): n changes now and then."""
    return st.lists(st.tuples(st.integers(1, n_max), st.integers(0, 40), st.booleans(),
                              st.integers(0, 7), st.floats(0, 3)), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(seed=seeds, kind=kinds, batch=st.integers(1, 50),
       phases=st.lists(st.tuples(st.integers(1, 64), call_stream()), min_size=1, max_size=6))
def test_results_stay_below_n_when_n_changes(seed, kind, batch, phases):
    """Partition scaling: after n shrinks (or grows) a partition >= n is never returned, and a
    uniform sticky partitioner restarts its balance from the change."""
    part = build(kind, seed, batch)
    now, previous_n = 0.0, None
    for n, calls in phases:
        if n != previous_n:  # the partitioner restarts only when n really changes
            totals, largest, previous_n = [0] * n, 0, n
        for _, size, with_load, backlog, age in calls:
            now += 0.5
            load = (PartitionLoad([(backlog + p) % 3 for p in range(n)], [now - age] * n)
                    if with_load else None)
            p = part.partition(n, size, load, now)
            assert 0 <= p < n
            if kind == "uniform":
                totals[p] += max(size, 1)
                largest = max(largest, size, 1)
                assert max(totals) - min(totals) <= batch + largest - 1


def test_current_partition_above_new_n_is_abandoned_mid_stint():
    part = StickyPartitioner(random.Random(0), batch_size=10**6, adaptive=False)
    first = part.partition(64, 1, None, 0.0)
    while first < 32:  # find a seed state whose stint sits on a high partition
        part = StickyPartitioner(random.Random(first + 1000), batch_size=10**6, adaptive=False)
        first = part.partition(64, 1, None, 0.0)
    assert all(part.partition(32, 1, None, 0.0) < 32 for _ in range(10))
    assert all(part.partition(1, 1, None, 0.0) == 0 for _ in range(10))


@settings(max_examples=60, deadline=None)
@given(seed=seeds, kind=kinds, batch=st.integers(1, 50), calls=call_stream())
def test_same_seed_same_choices(seed, kind, batch, calls):
    a, b = build(kind, seed, batch), build(kind, seed, batch)
    now = 0.0
    for n, size, with_load, backlog, age in calls:
        now += 0.25
        load = PartitionLoad([(backlog * p) % 5 for p in range(n)], [now - age] * n) \
            if with_load else None
        assert a.partition(n, size, load, now) == b.partition(n, size, load, now)


# ------------------------------------------------------------------ wiring and purity
@pytest.mark.parametrize("name,cls", [("random", RandomPartitioner), ("sticky", StickyPartitioner)])
def test_make_partitioner_follows_queue_config(name, cls):
    config = QueueConfig("q", partitions=4, partitioner=name, sticky_batch_size=300,
                         adaptive=False, partition_availability_timeout=2.5)
    part = make_partitioner(config, random.Random(0))
    assert type(part) is cls
    if cls is StickyPartitioner:
        got = [part.partition(4, 100, None, 0.0) for _ in range(3)]
        assert len(set(got)) == 1  # 300 bytes per stint: three 100-byte messages stay together
        assert part.partition(4, 100, None, 0.0) != got[0]


def test_invalid_calls_are_refused():
    part = StickyPartitioner(random.Random(0))
    with pytest.raises(ValueError):
        part.partition(0, 10, None, 0.0)
    with pytest.raises(ValueError, match="3 backlogs"):
        part.partition(4, 10, PartitionLoad([0, 0, 0], [0.0] * 3), 0.0)
    with pytest.raises(ValueError):
        StickyPartitioner(random.Random(0), batch_size=0)
    with pytest.raises(ValueError):
        StickyPartitioner(random.Random(0), availability_timeout=float("nan"))


def test_module_is_pure():
    """A pure core: no lmdb, no clock, no global random in the partitioners (randomness injected)."""
    tree = ast.parse(Path(partitioners_module.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    runtime = imported - {"typing", "__future__", "dataclasses", "collections", "partq"}
    # ``random`` may appear only under TYPE_CHECKING, for annotations
    guarded = [n for n in ast.walk(tree) if isinstance(n, ast.If)
               and getattr(n.test, "id", None) == "TYPE_CHECKING"]
    in_guard = {a.name for g in guarded for n in ast.walk(g) if isinstance(n, ast.Import)
                for a in n.names}
    assert runtime - in_guard == set(), runtime
    assert {"lmdb", "time"} & imported == set()
