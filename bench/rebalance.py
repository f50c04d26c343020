"""Rebalancing and consuming (issue 3): JSON lines with name, unit, value (and peer, ratio).

1. The pure core (``partq.core.rebalancer.Rebalancer``) settling a rebalance of 1,000 partitions:
   100 flows bind one after another (each bind re-plans), the holddown expires, and every handoff
   completes (``acked(p, 0)``). Reported: the time for the whole settle and per event.
2. End-to-end consume+ack through a real broker (sync durability): a pre-filled queue drained by
   1, 4 and 16 flows, each in its own thread, receive(100) + ack_many. Ratio: against 1 flow.

    .venv/bin/python bench/rebalance.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import partq
from partq.core.actions import Pause
from partq.core.rebalancer import Rebalancer


def emit(name: str, unit: str, value: float, peer: str | None = None,
         peer_value: float | None = None) -> None:
    doc = {"name": name, "unit": unit, "value": round(value, 3)}
    if peer is not None:
        doc.update(peer=peer, peer_value=round(peer_value, 3),
                   ratio=round(value / peer_value, 3) if peer_value else None)
    print(json.dumps(doc), flush=True)


def core_settle(partitions: int, flows: int, repeats: int) -> None:
    best = float("inf")
    events = 0
    for _ in range(repeats):
        core = Rebalancer(partitions, rebalance_delay=5.0, max_handoff_time=3.0)
        t0 = time.perf_counter()
        actions = []
        for i in range(flows):
            actions += core.bind(f"f{i}", now=0.0, name=f"consumer-{i}")
        actions = core.tick(5.0)
        paused = [a.p for a in actions if isinstance(a, Pause)]
        for p in paused:
            core.acked(p, 0, 5.0)
        elapsed = time.perf_counter() - t0
        counts = [len(f.partitions) for f in core.bound_flows()]
        assert core.status == "Ready" and max(counts) - min(counts) <= 1, counts
        best = min(best, elapsed)
        events = flows + 1 + len(paused)
    emit(f"core_settle_{partitions}p_{flows}f", "ms", best * 1e3)
    emit(f"core_settle_{partitions}p_{flows}f_per_event", "us", best / events * 1e6)
    emit(f"core_settle_{partitions}p_{flows}f_handoffs", "handoffs", len(paused))


def consume(flows: int, messages: int, root: str) -> float:
    path = os.path.join(root, f"consume-{flows}")
    clock = partq.ManualClock()
    with partq.Broker.open(path, clock=clock) as broker:
        broker.create_queue("q", partitions=16, rebalance_delay=0.1, max_handoff_time=0.0,
                            max_delivered_unacked_per_flow=1000)
        payload = os.urandom(256)
        for start in range(0, messages, 1000):
            broker.publish_many("q", [(payload, f"k{i}") for i in range(start, start + 1000)])
        bound = [broker.bind("q", name=f"c{i}") for i in range(flows)]
        clock.advance(1.0)
        broker.tick()
        done = [0] * flows

        def drain(i: int) -> None:
            flow = bound[i]
            while True:
                msgs = flow.receive(100, timeout=0.05)
                if not msgs:
                    return
                flow.ack_many(msgs)
                done[i] += len(msgs)
        threads = [threading.Thread(target=drain, args=(i,)) for i in range(flows)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0 - 0.05   # the final empty receive's wait
        assert sum(done) == messages, (sum(done), messages)
        return messages / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args()
    core_settle(1000, 100, repeats=1 if args.quick else 5)
    messages = 4000 if args.quick else 100_000
    root = tempfile.mkdtemp(prefix="partq-bench-rebalance-")
    try:
        one = consume(1, messages, root)
        emit("consume_ack_1_flow", "msgs/s", one)
        for n in (4, 16):
            emit(f"consume_ack_{n}_flows", "msgs/s", consume(n, messages, root),
                 "consume_ack_1_flow", one)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
