#!/usr/bin/env python3
"""What exactly once costs a consume-transform-publish loop (rule `transactions`): each round
receives 100 keyed 256-byte messages from a 4-partition queue, then acks the 100 and publishes
100 results to a second queue in one transaction (one durable commit), beside the same work
as ``flow.ack_many`` + ``publish_many`` (two durable commits, not exactly once: a crash
between them loses or duplicates the results). Input is published beforehand, untimed.

Prints JSON lines (bench/method.py): ``load_average_at_start``, then
``partq_transaction_100_acks_100_publishes`` (input msgs/s) beside its peer
``partq_ack_many_then_publish_many_100`` with ``ratio`` (transaction over the two commits;
target >= 1.0), the median of interleaved rounds. Each slice opens a fresh directory.

Usage: ``python bench/transactions.py [--quick] [--seconds S] [--pairs N]``.
"""
from __future__ import annotations

import argparse
import sys
import time

from method import DEFAULT_PAIRS, emit, header, interleave, line
from workloads import KEYS, PARTITIONS, PAYLOAD, scratch_dir

import partq

BATCH = 100
ROUNDS_READY = 400          # batches published before a slice (more than a slice takes)


def pipeline_rate(seconds: float, transaction: bool) -> float:
    """Input messages per second through receive(100) + (transaction | ack_many +
    publish_many) for ``seconds``."""
    with scratch_dir() as d, partq.Broker.open(d) as b:
        b.create_queue("in", partitions=PARTITIONS)
        b.create_queue("out", partitions=PARTITIONS)
        items = [(PAYLOAD, KEYS[i % len(KEYS)]) for i in range(BATCH * 10)]
        for _ in range(ROUNDS_READY // 10):
            b.publish_many("in", items)
        flow = b.bind("in")
        n, deadline = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < deadline:
            msgs = flow.receive(BATCH, timeout=1.0)
            if not msgs:
                break
            out = [(m.payload, m.key) for m in msgs]
            if transaction:
                with b.transaction() as tx:
                    tx.publish_many("out", out)
                    for m in msgs:
                        tx.ack(m)
            else:
                flow.ack_many(msgs)
                b.publish_many("out", out)
            n += len(msgs)
        return n / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--seconds", type=float, default=None,
                        help="measuring time per side, over all its slices (default 6, or 0.4 "
                             "with --quick)")
    parser.add_argument("--pairs", type=int, default=None,
                        help=f"interleaved rounds after the warm-up (default {DEFAULT_PAIRS}, "
                             "or 1 with --quick)")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (0.4 if args.quick else 6.0)
    pairs = max(1, args.pairs if args.pairs is not None else (1 if args.quick else DEFAULT_PAIRS))
    t = seconds / pairs
    emit(header("transactions", pairs, slice_seconds=round(t, 3)))
    m = interleave([("two_commits", lambda: pipeline_rate(t, False)),
                    ("transaction", lambda: pipeline_rate(t, True))], pairs,
                   script="transactions")
    emit(line("partq_transaction_100_acks_100_publishes", "msgs/s", m["transaction"],
              "partq_ack_many_then_publish_many_100", m["two_commits"],
              note="receive(100) + one transaction of 100 acks and 100 publishes vs ack_many + "
                   "publish_many (two commits); ratio >= 1.0 is the target"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
