#!/usr/bin/env python3
"""Unkeyed partitioners against a slow consumer: the KIP-794 runaway, reproduced on real queues.

Kafka's KIP-794 reports that a sticky partitioner whose stickiness follows *batch
creation* (KIP-480) sends more records to a slow partition: the producer holds batches for the slow
partition while its previous one is in flight, so the open batch there fills up (to ``batch.size``)
while the fast partitions ship small batches at once; batches per partition stay about equal, so
the slow partition receives several times the records, and falls further behind. Its table
(partition 0 slow): ~15 records per batch there against ~2.6 elsewhere. KIP-794's fix, which partq
implements (rules `sticky`, `adaptive` and `availability-timeout`): switch partitions after
``sticky_batch_size`` bytes whatever the batching does (uniform), and, adaptively, choose the next partition
with probability proportional to ``1 / (backlog + 1)``.

The set-up, identical for every strategy
* A real broker: ``partq.Broker.open`` on a scratch directory (``durability="async"``: nothing
  here crashes, and fsyncs would only slow the run down), one queue of 3 partitions, 3 consumer
  flows bound to it by name; the broker's own rebalancer gives each flow one partition (the
  bench advances the clock past the short ``rebalance_delay`` and ticks until it has).
* The flow that holds partition 0 is slow: it can take 0.6 messages per step, the others 3.0
  (1/5 of their rate). A consumer receives and acks (``ack_many``) through the real flow.
* Records: 1024-byte payloads (named here instead of the usual 256 bytes: it is KIP-794's record
  size, 25953200 B / 25228 records), arriving at a Poisson rate of 2.4 per step (1200/s) from a
  seeded generator, the same arrival sequence for every strategy. 16384-byte batches and sticky
  stints (Kafka's ``batch.size`` default, partq's ``sticky_batch_size`` default): 16 records.
* With a fair split each partition gets 0.8 records per step, more than the slow consumer's 0.6,
  while the three consumers together (6.6 per step) could take far more than is offered. So a
  uniform split overloads the slow partition and leaves the fast consumers idle part of the
  time; an adaptive one can keep every backlog bounded.

Time is simulated, not measured. A ``partq.ManualClock`` drives the broker (timers, the
load sampler's 50 ms refresh) and advances 2 ms per step; in a step the records that arrive are
published, then each consumer takes what its rate allows. Consumer speed is a number of messages
per step, not a sleep, so every figure below is a count of real publishes, deliveries and acks
that depends only on the seeds -- the run is reproducible bit for bit and does not change with the
machine's load or speed (wall-clock rates would, and would mostly measure LMDB commits, which
``bench/publish.py`` already does). Throughput is messages consumed per *simulated* second.

The four unkeyed strategies
1. ``random``: partq's default; each unkeyed message to a uniformly random partition.
2. ``batch_sticky``: the KIP-480 partitioner KIP-794 criticises, written here
   (``BatchCreationStickyPartitioner``, same ``partition(n, size, load, now)`` interface as
   partq's partitioners, plus Kafka's ``on_new_batch`` hook) in front of a model of Kafka's
   producer (``RecordAccumulator``): per-partition queues of batches, ``linger.ms=0`` (a batch is
   ready as soon as it holds a record), and one batch in flight per partition, where "in flight"
   means published and not yet consumed -- the slow consumer plays the slow broker. Each step the
   sender publishes (``publish_many``) the oldest ready batch of every partition that has nothing
   in flight. Records that arrive while a partition's batch is held keep filling it, and the
   partitioner switches only when a record would need a new batch: that is the runaway. The
   producer's memory is bounded like Kafka's ``buffer.memory`` (``BUFFER_RECORDS`` = 512 records,
   512 KiB, scaled down from Kafka's 32 MiB so the run reaches its steady state within the first
   second): records held or in flight count against it, a consumed record frees its room, and
   records the application offers while it is full wait outside the producer (Kafka's ``send``
   blocks). KIP-794 predicts what follows: the producer's rate drops to what the slow partition
   lets through, with equal batch counts per partition and full batches only on the slow one --
   KIP-794's table.
   partq places keyed messages by ``crc32c(key) % n`` (rule `key-hash`), so to put a batch in the partition
   this partitioner chose, the bench publishes it with a key that hashes there (one key per
   partition, precomputed with ``partq.key_partition``; ``ROUTE_KEYS``). The keys only route:
   they add a few bytes to each stored record and nothing else.
3. ``uniform_sticky``: the queue's own ``partitioner="sticky", adaptive=False``, unkeyed publishes.
4. ``adaptive_sticky``: ``partitioner="sticky", adaptive=True`` (partq's sticky default).
For 1, 3 and 4 the producer publishes the records of each step at once (``publish_many``,
unkeyed): partq's log is the buffer, a publish never waits for a consumer.

What a "batch" is in the tables: the records one ``publish_many`` call appended to one partition
(one append per partition per call). For ``batch_sticky`` that is exactly one producer batch.
Records, bytes and batches per partition count what reached the broker (payload bytes), as
KIP-794's table counts what reached Kafka. "Backlog" of a partition: records assigned to it and not
yet consumed -- published and unacked, plus, for ``batch_sticky``, records its producer holds for
it; records still waiting outside ``batch_sticky``'s full buffer belong to no partition yet and
are reported apart (``batch_sticky_producer_blocked_*``). The bench checks at the end that its
own books agree with the broker's ``queue_status`` depths.

Output: one JSON object per line (``name``, ``unit``, ``value``; comparisons add ``peer``,
``peer_value``, ``ratio = value / peer_value``), also written to ``<out>/partitioner.jsonl``; the
KIP-794-style tables for ``batch_sticky`` and ``uniform_sticky`` on stderr; a chart in
``<out>/partitioner.png`` (needs matplotlib, the ``bench`` extra).

Usage: ``python bench/partitioner.py [--quick] [--steps N] [--seed S] [--out DIR] [--no-chart]``.
``--quick`` runs 1500 steps (3 simulated seconds) per strategy, enough for the qualitative
results; the default is 10000 steps (20 simulated seconds).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import partq

PARTITIONS = 3
SLOW = 0                       # the partition whose consumer is slow
PAYLOAD_SIZE = 1024
PAYLOAD = bytes(i % 251 for i in range(PAYLOAD_SIZE))
BATCH_SIZE = 16384             # Kafka batch.size and partq sticky_batch_size
STEP = 0.002                   # simulated seconds per step
ARRIVALS = 2.4                 # mean records per step (Poisson)
FAST_RATE = 3.0                # messages a fast consumer takes per step
SLOW_RATE = 0.6                # messages the slow consumer takes per step
FULL_STEPS = 10_000
QUICK_STEPS = 1_500
SEED = 794
BUFFER_RECORDS = 512           # batch_sticky's producer memory (Kafka buffer.memory), in records
STRATEGIES = ("random", "batch_sticky", "uniform_sticky", "adaptive_sticky")
QUEUE_OPTIONS = {
    "random": {"partitioner": "random"},
    "batch_sticky": {"partitioner": "random"},   # unused: every message is keyed
    "uniform_sticky": {"partitioner": "sticky", "sticky_batch_size": BATCH_SIZE, "adaptive": False},
    "adaptive_sticky": {"partitioner": "sticky", "sticky_batch_size": BATCH_SIZE, "adaptive": True},
}


def _route_keys(n: int) -> list[str]:
    """One key per partition whose crc32c lands there (rule `key-hash`): explicit routing for batch_sticky."""
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < n:
        k = f"route-{i}"
        keys.setdefault(partq.key_partition(k, n), k)
        i += 1
    return [keys[p] for p in range(n)]


ROUTE_KEYS = _route_keys(PARTITIONS)


# ---------------------------------------------------------------------------- KIP-480 model
class BatchCreationStickyPartitioner:
    """Kafka's KIP-480 ``UniformStickyPartitioner`` (and ``StickyPartitionCache``).

    ``partition`` returns the current sticky partition (chosen at random on the first call).
    The producer appends the record there unless that would create a new batch; in that case it
    calls ``on_new_batch(n, prev)``, which switches to a random partition other than ``prev``,
    asks ``partition`` again and appends there, creating a batch if needed. So the sticky
    partition changes exactly when the producer creates a batch -- stickiness follows batch
    creation, hence follows the sender's pace per partition, not bytes. ``size``, ``load`` and
    ``now`` are ignored (KIP-480 looks at none of them). Not thread-safe.
    """

    def __init__(self, rng: random.Random):
        self._rng = rng
        self._sticky: int | None = None

    def partition(self, n: int, size: int, load, now: float) -> int:
        if self._sticky is None or self._sticky >= n:
            self._sticky = self._rng.randrange(n)
        return self._sticky

    def on_new_batch(self, n: int, prev: int) -> None:
        if self._sticky is not None and self._sticky != prev:
            return  # already moved on (Kafka: another thread switched first)
        if n == 1:
            self._sticky = 0
            return
        nxt = self._rng.randrange(n - 1)          # uniform among the n - 1 others
        self._sticky = nxt + 1 if nxt >= prev else nxt


class RecordAccumulator:
    """Kafka's producer accumulator, reduced to what the runaway needs.

    Per partition a queue of batches, each a record count (all records have ``record_size``
    bytes); the last batch is the open one while it has room for another record. ``linger.ms=0``:
    every non-empty batch is ready. ``drain`` hands out the oldest batch of each partition the
    caller says may send (nothing in flight there).
    """

    def __init__(self, n: int, batch_size: int, record_size: int):
        self._batches = [deque() for _ in range(n)]
        self._per_batch = max(1, batch_size // record_size)
        self.held = [0] * n            # records held per partition

    def append(self, p: int, abort_on_new_batch: bool) -> bool:
        """Add one record to ``p``'s open batch. Without room there: return False when
        ``abort_on_new_batch`` (the partitioner must switch first), else start a new batch."""
        q = self._batches[p]
        if q and q[-1] < self._per_batch:
            q[-1] += 1
        elif abort_on_new_batch:
            return False
        else:
            q.append(1)
        self.held[p] += 1
        return True

    def drain(self, p: int) -> int:
        """Take ``p``'s oldest batch (record count; 0 when it has none). The batch is closed."""
        q = self._batches[p]
        if not q:
            return 0
        count = q.popleft()
        self.held[p] -= count
        return count


# ---------------------------------------------------------------------------- one run
@dataclass
class Run:
    strategy: str
    steps: int
    offered: int = 0
    pending: list[int] = field(default_factory=list)          # producer-blocked, after every step
    records: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    batches: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    consumed: list[int] = field(default_factory=lambda: [0] * PARTITIONS)
    slow_backlog: list[int] = field(default_factory=list)     # after every step
    wall: float = 0.0

    @property
    def seconds(self) -> float:
        return self.steps * STEP


def poisson(rng: random.Random, mean: float) -> int:
    """Knuth's method; fine for small means."""
    limit, k, prod = math.exp(-mean), 0, rng.random()
    while prod > limit:
        k += 1
        prod *= rng.random()
    return k


def bind_one_per_partition(broker: partq.Broker, clock: partq.ManualClock, queue: str) -> dict:
    """Bind one named flow per partition and let the broker's rebalancer spread them."""
    flows = [broker.bind(queue, name=f"consumer-{i}") for i in range(PARTITIONS)]
    for _ in range(400):
        if all(len(f.partitions) == 1 for f in flows):
            break
        clock.advance(0.05)
        broker.tick()
    else:
        raise RuntimeError(f"the rebalancer did not give each flow one partition: {flows}")
    return {next(iter(f.partitions)): f for f in flows}


def run_strategy(strategy: str, steps: int, seed: int) -> Run:
    run = Run(strategy, steps)
    arrivals_rng = random.Random(seed)             # the same arrivals for every strategy
    rates = [SLOW_RATE if p == SLOW else FAST_RATE for p in range(PARTITIONS)]
    credit = [0.0] * PARTITIONS
    sent = [0] * PARTITIONS                        # published to each partition
    path = tempfile.mkdtemp(prefix="partq-bench-partitioner-")
    started = time.perf_counter()
    try:
        clock = partq.ManualClock()
        broker = partq.Broker.open(path, clock=clock, seed=seed, durability="async")
        try:
            broker.create_queue("q", partitions=PARTITIONS, rebalance_delay=0.1,
                                max_handoff_time=0.1, **QUEUE_OPTIONS[strategy])
            flows = bind_one_per_partition(broker, clock, "q")
            kafka = strategy == "batch_sticky"
            if kafka:
                part = BatchCreationStickyPartitioner(random.Random(seed + 1))
                acc = RecordAccumulator(PARTITIONS, BATCH_SIZE, PAYLOAD_SIZE)
            waiting = 0
            for _ in range(steps):
                now = clock.now()
                k = poisson(arrivals_rng, ARRIVALS)
                run.offered += k
                if kafka:
                    waiting += k
                    in_buffer = sum(acc.held) + sum(sent) - sum(run.consumed)
                    admit = min(waiting, max(0, BUFFER_RECORDS - in_buffer))
                    waiting -= admit
                    for _ in range(admit):  # KafkaProducer.doSend, abortOnNewBatch dance included
                        p = part.partition(PARTITIONS, PAYLOAD_SIZE, None, now)
                        if not acc.append(p, abort_on_new_batch=True):
                            part.on_new_batch(PARTITIONS, p)
                            p = part.partition(PARTITIONS, PAYLOAD_SIZE, None, now)
                            acc.append(p, abort_on_new_batch=False)
                    for p in range(PARTITIONS):      # the sender: one batch in flight per partition
                        if sent[p] > run.consumed[p]:
                            continue
                        count = acc.drain(p)
                        if count:
                            results = broker.publish_many("q", [(PAYLOAD, ROUTE_KEYS[p])] * count)
                            assert all(r.partition == p for r in results), "route key misplaced"
                            sent[p] += count
                            run.records[p] += count
                            run.batches[p] += 1
                elif k:
                    results = broker.publish_many("q", [PAYLOAD] * k)
                    touched = set()
                    for r in results:
                        sent[r.partition] += 1
                        run.records[r.partition] += 1
                        touched.add(r.partition)
                    for p in touched:
                        run.batches[p] += 1
                for p, flow in flows.items():            # the consumers, each at its own pace
                    credit[p] += rates[p]
                    take = int(credit[p])
                    credit[p] -= take                    # capacity not used is lost
                    if take:
                        msgs = flow.receive(max_messages=take)
                        if msgs:
                            flow.ack_many(msgs)
                            run.consumed[p] += len(msgs)
                held = acc.held[SLOW] if kafka else 0
                run.slow_backlog.append(sent[SLOW] - run.consumed[SLOW] + held)
                run.pending.append(waiting)
                clock.advance(STEP)
            status = broker.queue_status("q")
            for ps in status.partitions:                 # the bench's books against the broker's
                if ps.depth != sent[ps.partition] - run.consumed[ps.partition]:
                    raise RuntimeError(f"{strategy}: partition {ps.partition} depth {ps.depth} but "
                                       f"{sent[ps.partition]} sent, {run.consumed[ps.partition]} "
                                       f"consumed")
        finally:
            broker.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)
    run.wall = time.perf_counter() - started
    return run


# ---------------------------------------------------------------------------- reporting
class Emitter:
    def __init__(self) -> None:
        self.lines: list[dict] = []
        self.values: dict[str, float] = {}

    def __call__(self, name: str, unit: str, value: float, peer: str | None = None) -> None:
        value = _num(value)
        line = {"name": name, "unit": unit, "value": value}
        if peer is not None:
            peer_value = self.values[peer]
            line.update(peer=peer, peer_value=peer_value,
                        ratio=round(value / peer_value, 3) if peer_value else None)
        assert name not in self.values, name
        self.values[name] = value
        self.lines.append(line)
        print(json.dumps(line), flush=True)


def _num(v: float):
    if isinstance(v, int) or float(v).is_integer():
        return int(v)
    return round(float(v), 3)


def report(runs: dict[str, Run], emit: Emitter) -> None:
    first = next(iter(runs.values()))
    emit("offered_per_s", "msgs/s (simulated)", first.offered / first.seconds)
    for s, run in runs.items():
        for p in range(PARTITIONS):
            emit(f"{s}_p{p}_records", "records", run.records[p])
            emit(f"{s}_p{p}_bytes", "bytes", run.records[p] * PAYLOAD_SIZE)
            emit(f"{s}_p{p}_batches", "batches", run.batches[p])
            emit(f"{s}_p{p}_records_per_batch", "records/batch",
                 run.records[p] / run.batches[p] if run.batches[p] else 0)
        fast = [run.records[p] for p in range(PARTITIONS) if p != SLOW]
        emit(f"{s}_fast_mean_records", "records", sum(fast) / len(fast))
        emit(f"{s}_slow_vs_fast_records", "records", run.records[SLOW],
             peer=f"{s}_fast_mean_records")
        sizes = [r * PAYLOAD_SIZE for r in run.records]
        mean = sum(sizes) / len(sizes)
        emit(f"{s}_bytes_spread", "fraction (max-min)/mean", (max(sizes) - min(sizes)) / mean)
        emit(f"{s}_slow_backlog_max", "records", max(run.slow_backlog))
        emit(f"{s}_slow_backlog_final", "records", run.slow_backlog[-1])
        emit(f"{s}_consumed_per_s", "msgs/s (simulated)", sum(run.consumed) / run.seconds)
        if s == "batch_sticky":
            emit(f"{s}_producer_blocked_max", "records", max(run.pending))
            emit(f"{s}_producer_blocked_final", "records", run.pending[-1])
    emit("adaptive_vs_uniform_slow_backlog_max", "records",
         max(runs["adaptive_sticky"].slow_backlog), peer="uniform_sticky_slow_backlog_max")
    emit("adaptive_vs_uniform_slow_backlog_final", "records",
         runs["adaptive_sticky"].slow_backlog[-1], peer="uniform_sticky_slow_backlog_final")
    emit("adaptive_vs_uniform_consumed_per_s", "msgs/s (simulated)",
         sum(runs["adaptive_sticky"].consumed) / runs["adaptive_sticky"].seconds,
         peer="uniform_sticky_consumed_per_s")
    emit("adaptive_vs_random_consumed_per_s", "msgs/s (simulated)",
         sum(runs["adaptive_sticky"].consumed) / runs["adaptive_sticky"].seconds,
         peer="random_consumed_per_s")
    emit("batch_sticky_vs_uniform_slow_records", "records", runs["batch_sticky"].records[SLOW],
         peer=f"uniform_sticky_p{SLOW}_records")


def seed_table(run: Run) -> str:
    rows = [f"{run.strategy} (partition {SLOW} slow), {run.steps} steps = {run.seconds:g} s simulated",
            f"{'Partition':<10}{'TotalBatches':>13}{'TotalBytes':>12}{'TotalRecords':>13}"
            f"{'BytesPerBatch':>15}{'RecordsPerBatch':>17}"]
    for p in range(PARTITIONS):
        b, r = run.batches[p], run.records[p]
        rows.append(f"{p:<10}{b:>13}{r * PAYLOAD_SIZE:>12}{r:>13}"
                    f"{(r * PAYLOAD_SIZE / b if b else 0):>15.2f}{(r / b if b else 0):>17.2f}")
    return "\n".join(rows)


def chart(runs: dict[str, Run], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing (pip install -e '.[bench]'): no chart", file=sys.stderr)
        return False
    labels = {"random": "1. random (default)",
              "batch_sticky": "2. batch-creation sticky (KIP-480): held + unconsumed",
              "uniform_sticky": "3. sticky, adaptive=False", "adaptive_sticky": "4. sticky, adaptive=True"}
    colors = {"random": "#888888", "batch_sticky": "#d62728", "uniform_sticky": "#1f77b4",
              "adaptive_sticky": "#2ca02c"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    styles = {"random": dict(linestyle=":", linewidth=2.0, zorder=3)}  # it runs under uniform's line
    for s, run in runs.items():
        t = [(i + 1) * STEP for i in range(run.steps)]
        left.plot(t, run.slow_backlog, label=labels[s], color=colors[s],
                  **styles.get(s, dict(linewidth=1.2)))
        if s == "batch_sticky":
            left.plot(t, run.pending, color=colors[s], linewidth=1.0, linestyle="--",
                      label="2. records waiting outside its full producer buffer")
    left.set_yscale("symlog", linthresh=10)
    left.set_xlabel("simulated time (s)")
    left.set_ylabel(f"partition {SLOW} backlog (records, symlog)")
    left.set_title(f"Backlog of the slow partition (its consumer: {SLOW_RATE / STEP:g}/s, "
                   f"others {FAST_RATE / STEP:g}/s)", fontsize=10)
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8, loc="upper left")
    width = 0.8 / len(runs)
    for i, (s, run) in enumerate(runs.items()):
        xs = [p + (i - (len(runs) - 1) / 2) * width for p in range(PARTITIONS)]
        total = sum(run.records) or 1
        shares = [100 * r / total for r in run.records]
        right.bar(xs, shares, width=width, color=colors[s], label=labels[s].split(":")[0])
        for x, share, r in zip(xs, shares, run.records, strict=True):
            right.text(x, share + 1, str(r), ha="center", va="bottom", fontsize=6.5, rotation=90)
    right.axhline(100 / PARTITIONS, color="black", linewidth=0.8, linestyle="--", alpha=0.6)
    right.set_ylim(0, 100)
    right.set_xticks(range(PARTITIONS))
    right.set_xticklabels([f"p{p}" + (" (slow)" if p == SLOW else "") for p in range(PARTITIONS)])
    right.set_ylabel("share of the strategy's published records (%)")
    right.set_title(f"Records per partition (label: count; {ARRIVALS / STEP:g}/s offered, "
                    f"{PAYLOAD_SIZE} B each)", fontsize=10)
    right.grid(True, axis="y", alpha=0.3)
    right.legend(fontsize=8, loc="upper right")
    fig.suptitle("partq unkeyed partitioners with one slow consumer (Kafka KIP-794)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps per strategy")
    ap.add_argument("--steps", type=int, help=f"steps per strategy (default {FULL_STEPS})")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results",
                    help="directory for partitioner.jsonl and partitioner.png")
    ap.add_argument("--no-chart", action="store_true")
    args = ap.parse_args(argv)
    steps = args.steps or (QUICK_STEPS if args.quick else FULL_STEPS)
    if steps < 1:
        ap.error("--steps must be at least 1")
    runs: dict[str, Run] = {}
    for s in STRATEGIES:
        runs[s] = run_strategy(s, steps, args.seed)
        print(f"{s}: {steps} steps in {runs[s].wall:.1f} s wall", file=sys.stderr)
    emit = Emitter()
    report(runs, emit)
    print(file=sys.stderr)
    for s in ("batch_sticky", "uniform_sticky"):
        print(seed_table(runs[s]) + "\n", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "partitioner.jsonl").write_text("".join(json.dumps(line) + "\n" for line in emit.lines))
    if not args.no_chart and chart(runs, args.out / "partitioner.png"):
        print(f"chart: {args.out / 'partitioner.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
