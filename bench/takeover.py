"""How long a queue stalls when the process that runs its delivery stops (rule `owner-takeover`):
JSON lines with name, unit, value, peer, ratio.

Two consumer processes share a queue of 6 partitions (3 each); the first to bind runs delivery.
Once both consumed and went quiet, this script either stops the owner (SIGSTOP: its lease runs
out after the queue's consumer_timeout, and the other process takes delivery and the stopped
one's partitions over) or kills it (SIGKILL: its lock is free at once), and publishes one message
to every partition each 10 ms. Reported, per case: the seconds from the signal to the first
message of a partition the owner held that the other process receives. The peer line of the stop
case is the kill case of the same run (interleaved pairs, medians): the price of telling a
stopped owner from a slow one.

A process stopped inside a commit holds LMDB's write lock, and nobody writes until it runs again:
no takeover then (its claim is a write). The owner is stopped while quiet to measure the
takeover; a pair whose publishes still stall for 20 s is counted (``stalled``), the owner
continued, and the pair left out.

Then what that costs a publisher: one consumer process receives and acks all the time while this
script publishes one message at a time; the consumer is stopped for ``STOP`` seconds, then
continued. Reported: the longest publish while it was stopped (the worst of ``--stops`` stops),
beside the longest publish of an equal window while nobody was stopped, and how many stops
caught it inside a commit (every publish then waits for the SIGCONT).

    .venv/bin/python bench/takeover.py [--quick] [--pairs N] [--consumer-timeout S]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import partq

PARTITIONS = 6
STOP = 4.0          # seconds a consumer process is stopped in the publisher-stall measure
CONSUMER = r"""
import json, os, sys, time, partq
data, name, out = sys.argv[1], sys.argv[2], sys.argv[3]
broker = partq.Broker.open(data)
flow = broker.bind("q", name=name)
log = open(out, "a", buffering=1)
while True:
    try:
        msgs = flow.receive(100, timeout=0.05)
    except partq.FlowClosed:
        flow = broker.bind("q", name=name)
        continue
    now = time.time()
    for p in sorted({m.partition for m in msgs}):
        log.write(json.dumps({"p": p, "t": now, "parts": sorted(flow.partitions)}) + "\n")
    try:
        flow.ack_many(msgs)
    except (partq.FlowFenced, partq.FlowClosed):
        pass
"""


def lines(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.01)       # a benchmark's poll: it measures, it does not synchronise a test
    raise RuntimeError(f"timed out waiting for {what}")


def one(root: str, how: int, consumer_timeout: float) -> float | None:
    data = os.path.join(root, "data")
    with partq.Broker.open(data) as admin:
        admin.create_queue("q", partitions=PARTITIONS, consumer_timeout=consumer_timeout,
                           rebalance_delay=0.2, max_handoff_time=0.2)
    keys = {}
    i = 0
    while len(keys) < PARTITIONS:
        keys.setdefault(partq.key_partition(f"k{i}", PARTITIONS), f"k{i}")
        i += 1
    procs, logs = [], []
    broker = partq.Broker.open(data)
    try:
        for name in ("owner", "other"):
            logs.append(os.path.join(root, f"{name}.jsonl"))
            procs.append(subprocess.Popen([sys.executable, "-c", CONSUMER, data, name, logs[-1]]))
            if name == "owner":
                wait_for(lambda: broker.queue_status("q").delivery_owner, 60, "an owner")

        def publish() -> None:
            broker.publish_many("q", [(b"x", keys[p]) for p in range(PARTITIONS)])

        def split():
            publish()
            flows = [f for f in broker.queue_status("q").flows if f.bound]
            return len(flows) == 2 and all(len(f.partitions) == 3 for f in flows) \
                and lines(logs[1])
        wait_for(split, 60, "a 3/3 split")
        owner_parts = {p.partition for p in broker.queue_status("q").partitions
                       if p.flow_name == "owner"}
        quiet = [None, time.monotonic()]

        def settled():
            size = sum(os.path.getsize(path) for path in logs)
            if size != quiet[0]:
                quiet[:] = [size, time.monotonic()]
            return time.monotonic() - quiet[1] > 0.3
        wait_for(settled, 60, "both consumers to go quiet")
        start = time.time()
        procs[0].send_signal(how)
        stall = threading.Timer(20.0, procs[0].send_signal, (signal.SIGCONT,))
        stall.start()

        def moved():
            publish()
            return [e["t"] for e in lines(logs[1]) if e["p"] in owner_parts and e["t"] > start]
        try:
            first = min(wait_for(moved, 60, "the other process to get the owner's partitions"))
        finally:
            stall.cancel()
        if time.time() - start >= 20.0:
            return None             # stopped inside a commit: see the module's docstring
        return first - start
    finally:
        broker.close()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait()


def publisher_stall(root: str, stop: float) -> tuple[float, float]:
    """(longest publish during ``stop`` s with no process stopped, longest publish while the
    consumer process is stopped for ``stop`` s)."""
    data = os.path.join(root, "data")
    with partq.Broker.open(data) as admin:
        admin.create_queue("q", partitions=PARTITIONS)
    log = os.path.join(root, "c.jsonl")
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, data, "c", log])
    broker = partq.Broker.open(data)
    try:
        def window(seconds: float) -> float:
            worst, end, i = 0.0, time.monotonic() + seconds, 0
            while time.monotonic() < end:
                t0 = time.monotonic()
                broker.publish("q", b"x", key=f"k{i}")
                worst, i = max(worst, time.monotonic() - t0), i + 1
            return worst
        wait_for(lambda: (window(0.05), lines(log))[1], 60, "the consumer to consume")
        calm = window(stop)
        proc.send_signal(signal.SIGSTOP)
        cont = threading.Timer(stop, proc.send_signal, (signal.SIGCONT,))
        cont.start()
        stopped = window(stop)
        cont.join()
        return calm, stopped
    finally:
        broker.close()
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one pair, consumer_timeout 1 s")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--consumer-timeout", type=float, default=2.0)
    ap.add_argument("--stops", type=int, default=3)
    args = ap.parse_args()
    pairs, timeout = (1, 1.0) if args.quick else (args.pairs, args.consumer_timeout)
    results: dict[int, list[float]] = {signal.SIGSTOP: [], signal.SIGKILL: []}
    stalled = 0
    while min(len(r) for r in results.values()) < pairs and stalled <= pairs:
        for how in (signal.SIGSTOP, signal.SIGKILL):
            root = tempfile.mkdtemp(prefix="partq-takeover-")
            try:
                took = one(root, how, timeout)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            if took is None:
                stalled += 1
            elif len(results[how]) < pairs:
                results[how].append(took)
    if not results[signal.SIGSTOP]:
        raise SystemExit(f"every stopped owner stalled the store ({stalled} times)")
    stop, kill = (statistics.median(results[h]) for h in (signal.SIGSTOP, signal.SIGKILL))
    print(json.dumps({"name": "owner_failover_after_sigkill", "unit": "s",
                      "value": round(kill, 3), "min": round(min(results[signal.SIGKILL]), 3),
                      "max": round(max(results[signal.SIGKILL]), 3), "pairs": pairs}), flush=True)
    print(json.dumps({
        "name": f"owner_takeover_after_sigstop_consumer_timeout_{timeout:g}s", "unit": "s",
        "value": round(stop, 3), "min": round(min(results[signal.SIGSTOP]), 3),
        "max": round(max(results[signal.SIGSTOP]), 3), "pairs": pairs, "stalled": stalled,
        "peer": "owner_failover_after_sigkill", "peer_value": round(kill, 3),
        "ratio": round(stop / kill, 3) if kill else None}), flush=True)
    stops, seconds = (1, 1.0) if args.quick else (args.stops, STOP)
    calm, stalled = [], []
    for _ in range(stops):
        root = tempfile.mkdtemp(prefix="partq-stall-")
        try:
            a, b = publisher_stall(root, seconds)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        calm.append(a)
        stalled.append(b)
    print(json.dumps({"name": f"publish_worst_latency_{seconds:g}s_nobody_stopped", "unit": "s",
                      "value": round(max(calm), 4), "stops": stops}), flush=True)
    print(json.dumps({
        "name": f"publish_worst_latency_consumer_stopped_{seconds:g}s", "unit": "s",
        "value": round(max(stalled), 4), "stops": stops,
        "caught_inside_a_commit": sum(1 for s in stalled if s >= 0.9 * seconds),
        "peer": f"publish_worst_latency_{seconds:g}s_nobody_stopped",
        "peer_value": round(max(calm), 4),
        "ratio": round(max(stalled) / max(calm), 3) if max(calm) else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
