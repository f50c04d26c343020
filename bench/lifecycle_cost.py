#!/usr/bin/env python3
"""What the message lifecycle costs a consumer (rules `delivery-count` to `expiry`): draining a
queue with ``receive(500)`` + ``ack_many`` when it has ``max_redelivery=5``, a dead message queue
and ``max_ttl=3600`` set, beside the same on a queue with none of them, in the same run.

Each round opens a fresh directory and publishes ``--messages`` (20,000) keyed 256-byte messages
into each of two 4-partition queues (untimed, ``publish_many`` of 1000); then one flow per queue,
bound to all its partitions, receives 500 at a time and acks them with ``ack_many`` (durable)
until the queue is drained; that consume phase is timed, msgs/s. Nothing is nacked and nothing
expires, so the lifecycle queue pays only its checks: each message's delivery count against
``max_redelivery``, its age against ``max_ttl``, the dead message queue's lookup. The two queues
are drained one after the other, the order swapped every round; one warm-up round is dropped
(bench/method.py). Target: ratio (lifecycle over plain) >= 0.95, within 5%.

Prints JSON lines (bench/method.py): ``load_average_at_start``, then
``partq_receive_ack_many_500_lifecycle`` (msgs/s with the lifecycle settings) beside its peer
``partq_receive_ack_many_500_plain``, with ``ratio``, the median of the rounds' ratios, and its
min and max.

Usage: ``python bench/lifecycle_cost.py [--quick] [--messages N] [--pairs N]``.
"""
from __future__ import annotations

import argparse
import sys
import time

from method import DEFAULT_PAIRS, emit, header, line, log
from workloads import KEYS, PARTITIONS, PAYLOAD, scratch_dir

import partq

RECEIVE = 500
PUBLISH_BATCH = 1000
LIFECYCLE = {"max_redelivery": 5, "dead_message_queue": "dead", "max_ttl": 3600.0}
SIDES = ("lifecycle", "plain")


def fill(b: partq.Broker, queue: str, n: int) -> None:
    for start in range(0, n, PUBLISH_BATCH):
        b.publish_many(queue, [(PAYLOAD, KEYS[i % len(KEYS)])
                               for i in range(start, min(start + PUBLISH_BATCH, n))])


def bound_flow(b: partq.Broker, queue: str) -> partq.Flow:
    flow = b.bind(queue, name=f"{queue}-consumer")
    give_up = time.monotonic() + 10
    while len(flow.partitions) != PARTITIONS:
        if time.monotonic() > give_up:
            raise RuntimeError(f"the flow of {queue!r} holds {sorted(flow.partitions)} after 10 s")
        time.sleep(0.005)
    return flow


def drain_rate(flow: partq.Flow, n: int) -> float:
    """Messages per second of receive(RECEIVE) + ack_many until ``n`` were consumed."""
    got = 0
    start = time.perf_counter()
    while got < n:
        msgs = flow.receive(RECEIVE, timeout=1.0)
        if not msgs:
            raise RuntimeError(f"queue {flow.queue!r} ran dry after {got} of {n} messages")
        flow.ack_many(msgs)
        got += len(msgs)
    rate = got / (time.perf_counter() - start)
    if got != n or flow.receive(1, timeout=0):
        raise RuntimeError(f"queue {flow.queue!r} gave {got} messages, published {n}")
    return rate


def one_round(n: int, lifecycle_first: bool) -> dict[str, float]:
    """Publish ``n`` messages into each queue, then time draining each; msgs/s by side."""
    with scratch_dir() as d, partq.Broker.open(d) as b:
        b.create_queue("dead")
        b.create_queue("lifecycle", partitions=PARTITIONS, **LIFECYCLE)
        b.create_queue("plain", partitions=PARTITIONS)
        for side in SIDES:
            fill(b, side, n)
        flows = {side: bound_flow(b, side) for side in SIDES}
        rates = {}
        for side in (SIDES if lifecycle_first else SIDES[::-1]):
            rates[side] = drain_rate(flows[side], n)
        status = b.queue_status("lifecycle")
        if status.depth or any(status.dead.values()) or b.queue_status("dead").depth:
            raise RuntimeError(f"the lifecycle queue lost or killed messages: {status.dead}")
        return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--messages", type=int, default=None,
                        help="messages per queue per round (default 20000, or 2000 with --quick)")
    parser.add_argument("--pairs", type=int, default=None,
                        help=f"rounds after the warm-up (default {DEFAULT_PAIRS}, or 1 with --quick)")
    args = parser.parse_args(argv)
    n = max(RECEIVE, args.messages if args.messages is not None else (2000 if args.quick else 20_000))
    pairs = max(1, args.pairs if args.pairs is not None else (1 if args.quick else DEFAULT_PAIRS))
    emit(header("lifecycle_cost", pairs, messages=n, receive=RECEIVE))
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(-1, pairs):             # round -1: the warm-up, dropped
        rates = one_round(n, lifecycle_first=r % 2 == 0)
        if r < 0:
            continue
        for side in SIDES:
            samples[side].append(rates[side])
        log("lifecycle_cost", f"round {r + 1}/{pairs}: " +
            ", ".join(f"{side}={rates[side]:.0f}" for side in SIDES))
    emit(line("partq_receive_ack_many_500_lifecycle", "msgs/s", samples["lifecycle"],
              "partq_receive_ack_many_500_plain", samples["plain"], target=0.95,
              note="max_redelivery=5, dead_message_queue and max_ttl=3600 set (nothing dies) vs "
                   "none; 1 flow, 4 partitions, 256 B keyed; ratio 1 = free"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
