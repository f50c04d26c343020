#!/usr/bin/env python3
"""What a queue quota costs a publisher (rule `quota`): durable ``publish_many`` of 100 keyed
256-byte messages into a 4-partition queue with ``max_depth`` and ``max_bytes`` set, so high
they are never reached, beside the same into a queue with no quota.

The quota is checked in every publishing transaction: the depth from one head and one ack
state per partition, the bytes from a counter in the queue's meta that each append then
moves (``partq.publish.quota``). The ratio (quota over none, 1 = free) is that cost.

Prints JSON lines (bench/method.py): ``load_average_at_start``, then
``partq_publish_many_batch_100_quota`` (msgs/s with the quota) beside its peer
``partq_publish_many_batch_100_no_quota`` (msgs/s without), with ``ratio``, the median of the
interleaved rounds' ratios, and its min and max. Each slice opens a fresh directory.

Usage: ``python bench/quota_cost.py [--quick] [--seconds S] [--pairs N]``.
"""
from __future__ import annotations

import argparse
import sys

from method import DEFAULT_PAIRS, emit, header, interleave, line
from workloads import KEYS, PARTITIONS, PAYLOAD, repeat_rate, scratch_dir

import partq

BATCH = 100
HIGH = 1 << 60          # a quota never reached


def publish_many_rate(seconds: float, quota: bool) -> float:
    """Messages per second of durable publish_many(BATCH) into a fresh queue."""
    limits = {"max_depth": HIGH, "max_bytes": HIGH} if quota else {}
    with scratch_dir() as d, partq.Broker.open(d) as b:
        b.create_queue("q", partitions=PARTITIONS, **limits)
        items = [(PAYLOAD, KEYS[i % len(KEYS)]) for i in range(BATCH)]
        b.publish_many("q", items[:1])      # the first commit (and the byte counter) untimed
        return repeat_rate(lambda: b.publish_many("q", items), BATCH, seconds)


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
    emit(header("quota_cost", pairs, slice_seconds=round(t, 3)))
    m = interleave([("no_quota", lambda: publish_many_rate(t, False)),
                    ("quota", lambda: publish_many_rate(t, True))], pairs, script="quota_cost")
    emit(line("partq_publish_many_batch_100_quota", "msgs/s", m["quota"],
              "partq_publish_many_batch_100_no_quota", m["no_quota"],
              note="max_depth and max_bytes set, never reached, vs no quota; ratio 1 = free"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
