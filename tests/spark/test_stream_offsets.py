"""The stream's offset arithmetic (partq.spark.offsets): pure functions, no Spark."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")

from partq.spark import offsets


def test_offsets_are_json_with_their_keys_in_one_order():
    a = offsets.make("q", 3, "c", {1: 5, 0: 2, 10: 1}, unacked=True)
    b = offsets.make("q", 3, "c", {10: 1, 1: 5, 0: 2}, unacked=True)
    assert json.dumps(a) == json.dumps(b)
    assert list(a["seqs"]) == ["0", "1", "10"]
    assert offsets.seqs_of(json.loads(json.dumps(a))) == {0: 2, 1: 5, 10: 1}


def test_share_is_proportional_with_the_remainder_to_the_largest_fractions():
    assert offsets.share({0: 10, 1: 30}, 8) == {0: 2, 1: 6}
    assert offsets.share({0: 1, 1: 1, 2: 1}, 2) == {0: 1, 1: 1, 2: 0}
    assert offsets.share({0: 3}, None) == {0: 3}
    assert offsets.share({0: 3, 1: 4}, 100) == {0: 3, 1: 4}


@given(st.dictionaries(st.integers(0, 20), st.integers(1, 10_000), min_size=1),
       st.integers(1, 50_000))
def test_share_never_passes_the_limit_or_what_is_there(available, limit):
    shares = offsets.share(available, limit)
    assert sum(shares.values()) == min(limit, sum(available.values()))
    assert all(0 <= shares[p] <= available[p] for p in available)


def test_plan_end_moves_held_logs_only_from_their_floor():
    start = {0: 10, 1: 10, 2: 10}
    floors = {0: 10, 1: 40, 2: 0, 3: 0}        # 1: another consumer acked up to 40; 3 is new
    heads = {0: 50, 1: 60, 2: 90, 3: 7}
    end = offsets.plan_end(start, floors, heads, frozenset({0, 1, 3}), None)
    assert end == {0: 50, 1: 60, 2: 10, 3: 7}
    limited = offsets.plan_end(start, floors, heads, frozenset({0, 1, 3}), 10)
    assert sum(limited[p] - max(start.get(p, 0), floors[p]) for p in (0, 1, 3)) == 10
    assert limited[2] == 10
    assert offsets.plan_end(start, floors, heads, frozenset({0}), None, at_least=41) == \
        {0: 10, 1: 10, 2: 10, 3: 0}


def test_ranges_split_and_start_at_the_floor():
    assert offsets.ranges({0: 0, 1: 5}, {0: 25, 1: 5, 2: 3}, 10, {0: 3}) == [
        (0, 3, 13), (0, 13, 23), (0, 23, 25), (2, 0, 3)]
