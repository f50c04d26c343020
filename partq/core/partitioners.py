"""Unkeyed partitioners (rules `unkeyed-partitioner`, `sticky`, `adaptive` and `availability-timeout`;
Kafka's KIP-794).

A keyed message always goes to ``crc32c(key) % n`` (rule `key-hash`); these objects only decide where an
*unkeyed* message goes. They are pure: no I/O, no clock, no global randomness. Randomness comes
in as a ``random.Random`` instance, time as a float, and the broker's view of partition load as a
``PartitionLoad``. The same seed and the same calls give the same choices.

* ``RandomPartitioner`` (the default, as the Solace broker documents): every message goes to a
  partition drawn uniformly at random.
* ``StickyPartitioner`` (KIP-794 "uniform sticky"): stay on one partition until ``batch_size``
  bytes went to it, then switch; the switch is either strictly uniform or adaptive to the backlog.

Neither is thread-safe: the broker calls ``partition`` once per unkeyed message, in publish order,
from one thread (inside the write transaction that places the message).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from partq.errors import InvalidConfig

if TYPE_CHECKING:  # only for annotations: the rng is always passed in
    import random

__all__ = ["PartitionLoad", "RandomPartitioner", "StickyPartitioner", "make_partitioner",
           "adaptive_weights"]


@dataclass(frozen=True)
class PartitionLoad:
    """The broker's view of each partition's load at the moment of a publish (index = partition).

    ``backlog[p]``: messages published to ``p`` and not yet acked (>= 0).
    ``last_accept[p]``: clock time at which ``p``'s flow last accepted a message (a delivery);
    irrelevant, and may hold anything, for a partition whose backlog is 0.
    Both sequences have exactly ``n`` entries, ``n`` being the partition count of the call.
    """

    backlog: Sequence[int]
    last_accept: Sequence[float]


def _check_call(n: int, load: PartitionLoad | None) -> None:
    if n < 1:
        raise ValueError(f"partition count must be >= 1, not {n!r}")
    if load is not None and (len(load.backlog) != n or len(load.last_accept) != n):
        raise ValueError(f"PartitionLoad has {len(load.backlog)} backlogs and "
                         f"{len(load.last_accept)} accept times for {n} partitions; "
                         f"pass one of each per partition, or load=None")


class RandomPartitioner:
    """Uniform random choice per message: ``rng.randrange(n)``.

    Invariant: the result is in ``range(n)``; ``size``, ``load`` and ``now`` are ignored. Over many
    messages every partition receives ``1/n`` of them (in count, not in bytes). Not thread-safe
    (it shares ``rng``).
    """

    def __init__(self, rng: random.Random):
        self._rng = rng

    def partition(self, n: int, size: int, load: PartitionLoad | None, now: float) -> int:
        """The partition for one unkeyed message of ``size`` bytes among ``n`` partitions."""
        _check_call(n, load)
        return self._rng.randrange(n)


def adaptive_weights(backlog: Sequence[int], candidates: Sequence[int]) -> list[float]:
    """Relative probability of each candidate partition in an adaptive switch (rule `adaptive`).

    The probability of choosing ``p`` is proportional to ``1 / (backlog[p] + 1)``: the inverse of
    the backlog, shifted by one so that an empty partition has a finite weight, and the largest.
    Worked example, backlogs [0, 3, 9]: weights [1, 1/4, 1/10], total 1.35, probabilities
    [0.741, 0.185, 0.074]; the empty partition is ten times likelier than the one holding 9.
    """
    return [1.0 / (backlog[p] + 1) for p in candidates]


class StickyPartitioner:
    """KIP-794 uniform sticky partitioner, with adaptive switching and availability timeout.

    Stints. A *stint* is a run of consecutive messages sent to one partition. A stint starts with
    the first message after a restart or after the previous stint ended, on a partition chosen
    then (with the load and time of that call); it ends with the message that brings the bytes of
    the stint to ``batch_size`` or more (that message counts, and stays on the stint's partition).
    Each message counts as ``max(size, 1)`` bytes, so that a stream of empty payloads still moves
    on. A switch may land on the same partition again; that is a new stint. Invariant: while the
    bytes of the current stint are below ``batch_size``, every message goes to the stint's
    partition -- with one exception, a partition that becomes unavailable (below) mid-stint.

    Uniform switching (``adaptive=False``, or ``load is None``): the next partition is one of those
    that received the fewest bytes since the last restart, uniformly at random among ties. With
    messages of equal size this is a random permutation per round; with unequal sizes it stops a
    partition that drew long stints from drifting ahead. Invariant (M = largest message so far,
    B = ``batch_size``): at every moment, the bytes each partition received since the last restart
    (or adaptive switch) differ by at most ``B + M - 1``: one batch plus one message, so less
    than ``2 * B`` whenever ``M <= B``.
    Why: a stint adds between B and B + M - 1 bytes to the partition that had the fewest, so the
    spread never grows past one stint. Worked example, B = 10, n = 3, all at 0: p0 gets 9 + 10 = 19
    (the second message crosses 10), p1 gets 10, p2 gets 1 + 9 = 10. Spread 19 - 10 = 9. Next
    switch picks p1 or p2 (10), never p0 (19), so p0 cannot pull further ahead. Kafka picks a
    random partition here, which lets the spread grow like the square root of the message count;
    choosing the least-filled partition is what makes "uniform" strict.

    Adaptive switching (``adaptive=True`` and a ``load``): the next partition is drawn with
    probability proportional to ``1 / (backlog + 1)`` (see ``adaptive_weights``), among the
    available partitions. The byte ledger of uniform switching is cleared at each adaptive switch,
    so that a later call without load does not pour a catch-up burst into a slow partition.

    Availability (``adaptive=True``, ``availability_timeout > 0``, a ``load``): a partition is
    unavailable when its backlog is > 0 and ``now - last_accept[p] > availability_timeout`` (its
    flow took nothing for longer than the timeout while it had something to take). Unavailable
    partitions are never chosen while any partition is available; if all are unavailable, all are
    candidates. A partition becomes available again as soon as it drains (backlog 0) or its flow
    accepts a message. If the current stint's partition becomes unavailable while another is
    available, the stint ends at once and the message goes to a new one (rule
    `availability-timeout`: "skipped until it drains"; Kafka only re-checks at the next switch).

    Scaling: when ``n`` differs from the previous call, the partitioner restarts (no current
    stint, empty ledger), so a partition ``>= n`` is never returned.

    Not thread-safe: one caller, messages in publish order.
    """

    def __init__(self, rng: random.Random, batch_size: int = 16384, adaptive: bool = True,
                 availability_timeout: float = 0.0):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, not {batch_size!r}")
        if not availability_timeout >= 0:  # also rejects NaN
            raise ValueError(f"availability_timeout must be >= 0 seconds, "
                             f"not {availability_timeout!r}")
        self._rng = rng
        self._batch_size = batch_size
        self._adaptive = bool(adaptive)
        self._timeout = float(availability_timeout)
        self._n = 0
        self._restart(0)

    def _restart(self, n: int) -> None:
        self._n = n
        self._current: int | None = None   # partition of the current stint; None: choose anew
        self._stint_bytes = 0              # bytes sent to _current in this stint
        self._ledger = [0] * n             # bytes per partition since restart / adaptive switch

    def partition(self, n: int, size: int, load: PartitionLoad | None, now: float) -> int:
        """The partition for one unkeyed message of ``size`` bytes among ``n`` partitions.

        Call once per unkeyed message, in publish order. ``load`` (or None when the broker has
        no backlog information) and ``now`` are used only when a stint starts, and to notice that
        the current stint's partition became unavailable.
        """
        _check_call(n, load)
        if n != self._n:
            self._restart(n)
        p = self._current
        adaptive = load if self._adaptive else None      # the load when adapting to it
        if p is None:
            p = self._switch(n, adaptive, now) if adaptive is not None else self._least_filled(n)
        elif adaptive is not None and self._timeout > 0 and self._unavailable(p, adaptive, now):
            available = self._available(n, adaptive, now)
            if available:  # abandon the stuck partition now rather than at the next switch
                p = self._pick_weighted(available, adaptive)
                self._stint_bytes = 0
                self._ledger = [0] * n
        self._current = p
        counted = max(size, 1)
        self._stint_bytes += counted
        self._ledger[p] += counted
        if self._stint_bytes >= self._batch_size:
            # The stint is complete; the next message chooses with the load of its own call.
            self._current = None
            self._stint_bytes = 0
        return p

    # ---------------------------------------------------------------- choosing
    def _least_filled(self, n: int) -> int:
        """Uniform switch: a partition with the fewest ledger bytes, random among ties."""
        self._stint_bytes = 0
        if n == 1:
            return 0
        ledger = self._ledger
        low = min(ledger)
        ties = [p for p in range(n) if ledger[p] == low]
        return ties[0] if len(ties) == 1 else self._rng.choice(ties)

    def _switch(self, n: int, load: PartitionLoad, now: float) -> int:
        """Adaptive switch: weighted by inverse backlog among the available partitions."""
        self._stint_bytes = 0
        self._ledger = [0] * n
        candidates = self._available(n, load, now) if self._timeout > 0 else range(n)
        if not candidates:  # every partition is unavailable: fall back to all of them
            candidates = range(n)
        return self._pick_weighted(candidates, load)

    def _pick_weighted(self, candidates: Sequence[int], load: PartitionLoad) -> int:
        if len(candidates) == 1:
            return candidates[0]
        weights = adaptive_weights(load.backlog, candidates)
        # Inverse-CDF draw: with weights [1, 0.25, 0.1] (total 1.35) a draw r = 0.9 * 1.35
        # = 1.215 passes 1 and stops at 1.25, choosing the second candidate.
        r = self._rng.random() * sum(weights)
        acc = 0.0
        for p, w in zip(candidates, weights, strict=True):
            acc += w
            if r < acc:
                return p
        return candidates[-1]  # r rounded up to the total: the last one

    def _unavailable(self, p: int, load: PartitionLoad, now: float) -> bool:
        # Worked example, timeout 2.0: backlog 5, last accept at 10.0. At now = 12.0 the flow has
        # been idle exactly 2.0 s: still available. At now = 12.5: unavailable until its backlog
        # is 0 or its flow accepts a message (last_accept moves to >= 10.5).
        return load.backlog[p] > 0 and now - load.last_accept[p] > self._timeout

    def _available(self, n: int, load: PartitionLoad, now: float) -> list[int]:
        return [p for p in range(n) if not self._unavailable(p, load, now)]


def make_partitioner(config, rng: random.Random) -> RandomPartitioner | StickyPartitioner:
    """The unkeyed partitioner a queue's config asks for (``QueueConfig.partitioner``)."""
    if config.partitioner == "random":
        return RandomPartitioner(rng)
    if config.partitioner == "sticky":
        return StickyPartitioner(rng, batch_size=config.sticky_batch_size,
                                 adaptive=config.adaptive,
                                 availability_timeout=config.partition_availability_timeout)
    raise InvalidConfig(f"partitioner must be 'random' or 'sticky', not {config.partitioner!r}")
