"""``concurrent_key_order`` (``key_checks``) without its quadratic scans: for a delivery of m
it looked at every earlier message of m's key in publish order until it found one not acked
when m went out, so a round with many messages per key spent its time passing messages acked
long before (one round, 136,229 messages delivered, was in it for over 15 minutes; its whole
check now takes 46 s). Here each (key, partition)
keeps its messages in the same order with, over them, a max-tree of when each one's first ack
call began: the first earlier message whose ack began after a given time is found in
O(log n), and the ones the check then skips (m itself, messages its flow holds) are few.
The answers, including which earlier message each violation names, are the same."""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict


class FirstAbove:
    """Over ``values``: the first index in ``[lo, hi)`` whose value is above ``x``."""

    def __init__(self, values: list[float]) -> None:
        n = 1
        while n < len(values):
            n *= 2
        tree = [-math.inf] * (2 * n)
        tree[n:n + len(values)] = values
        for i in range(n - 1, 0, -1):
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
        self.n, self.tree = n, tree

    def find(self, lo: int, hi: int, x: float) -> int:
        """The first index in ``[lo, hi)`` with a value above ``x``, or -1."""
        tree = self.tree
        stack = [(1, 0, self.n)]
        while stack:
            node, left, right = stack.pop()
            if right <= lo or hi <= left or tree[node] <= x:
                continue
            if right - left == 1:
                return left
            mid = (left + right) // 2
            stack.append((2 * node + 1, mid, right))     # the right half after the left
            stack.append((2 * node, left, mid))
        return -1


class PartitionRows:
    """One key's earlier-message rows (``earlier_by_key``) of one partition, in their order."""

    def __init__(self, rows: list[tuple[float, int, int, str]], ack_begun: dict[str, float]):
        self.rows = rows
        self.t_pub = [r[0] for r in rows]
        self.above = FirstAbove([ack_begun.get(r[3], -math.inf) for r in rows])

    def candidates(self, t_attempt: float, t: float):
        """The rows published before ``t_attempt`` whose ack began after ``t``, in order."""
        hi = bisect_left(self.t_pub, t_attempt)
        i = 0
        while (i := self.above.find(i, hi, t)) >= 0:
            yield self.rows[i]
            i += 1


def index_rows(by_key: dict, ack_begun: dict[str, float]) -> dict[str, dict[int, PartitionRows]]:
    """Per key, per partition, its rows (``earlier_by_key``'s, order kept)."""
    out: dict[str, dict[int, PartitionRows]] = {}
    for key, rows in by_key.items():
        parts: dict[int, list] = defaultdict(list)
        for row in rows:
            parts[row[1]].append(row)
        out[key] = {p: PartitionRows(r, ack_begun) for p, r in parts.items()}
    return out


def first_in_other_partitions(index: dict[int, PartitionRows], partition: int,
                              t_attempt: float, t: float):
    """The first row (in the rows' order) in a partition other than ``partition``, published
    before ``t_attempt``, whose ack began after ``t``; None."""
    found = [row for p, rows in index.items() if p != partition
             for row in [next(rows.candidates(t_attempt, t), None)] if row is not None]
    return min(found) if found else None
