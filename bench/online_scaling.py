"""Online scaling under load (rule `online-scaling`): throughput while a queue scales 4 -> 8 partitions
online, against the same load with no scaling and against the offline scaling procedure (rule
`ingress-egress`).

One publisher thread (keyed ``publish_many`` of 100, 64 keys) and one consumer thread
(``receive(100)`` + ``ack_many``) run for a fixed window on a 4-partition queue (sync
durability). Three runs (each repeated 3 times, interleaved, medians reported):

1. no scaling: the peer figures;
2. ``scale(q, 8, online=True)`` a third into the window: messages consumed and published per
   second over the window, and the seconds from the scale's return until every old partition
   drained and the per-key check switched off;
3. the offline seven-step procedure (``partq.scaling.run``, drain included) at the same moment:
   the seconds ingress was off (publishes refused meanwhile) and the throughput over the window.

    .venv/bin/python bench/online_scaling.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import partq
from partq import scaling
from partq.delivery.holds import read_cutover
from partq.errors import IngressDisabled

KEYS = [f"key-{i}" for i in range(64)]


def emit(name: str, unit: str, value: float, peer: str | None = None,
         peer_value: float | None = None) -> None:
    doc = {"name": name, "unit": unit, "value": round(value, 3)}
    if peer is not None:
        doc.update(peer=peer, peer_value=round(peer_value, 3) if peer_value is not None else None,
                   ratio=round(round(value, 3) / round(peer_value, 3), 3) if peer_value else None)
    print(json.dumps(doc), flush=True)


class Quiet(scaling.Reporter):
    def start(self, step, text): ...
    def note(self, step, text): ...
    def done(self, step, status, seconds, detail): ...
    def drain(self, depth, initial): ...


def run(mode: str, window: float) -> dict:
    """One run: ``mode`` is "none", "online" or "offline"."""
    root = tempfile.mkdtemp(prefix="partq-online-bench-")
    try:
        with partq.Broker.open(root) as broker:
            broker.create_queue("q", partitions=4, rebalance_delay=0.0, max_handoff_time=0.0,
                                reject_msg_to_sender=True, reject_msg_to_sender_when_shutdown=True,
                                max_delivered_unacked_per_flow=1000)
            flow = broker.bind("q", name="c")
            stop = threading.Event()
            counts = {"published": 0, "consumed": 0, "refused": 0}
            payload = os.urandom(128)

            def publish() -> None:
                i = 0
                while not stop.is_set():
                    batch = [(payload, KEYS[(i + j) % len(KEYS)]) for j in range(100)]
                    i += 100
                    try:
                        broker.publish_many("q", batch)
                        counts["published"] += len(batch)
                    except IngressDisabled:
                        counts["refused"] += len(batch)
                        time.sleep(0.005)       # a publisher backing off while refused

            def consume() -> None:
                while not stop.is_set():
                    msgs = flow.receive(100, timeout=0.05)
                    if msgs:
                        flow.ack_many(msgs)
                        counts["consumed"] += len(msgs)
            threads = [threading.Thread(target=publish), threading.Thread(target=consume)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            result: dict = {}
            time.sleep(window / 3)          # the bench's schedule: scale a third into the window
            if mode == "online":
                broker.scale("q", 8, online=True)
                t_switch = time.perf_counter()
                qid = broker.queue_config("q").qid
                while True:     # the record itself: queue_status would also count what is held
                    with broker.store.read() as r:
                        if read_cutover(r, qid) is None:
                            break
                    time.sleep(0.005)
                result["switch_off"] = time.perf_counter() - t_switch
            elif mode == "offline":
                t_off = time.perf_counter()
                scaling.run(broker, "q", 8, drain=True, drain_timeout=120, rebalance_timeout=60,
                            standby_timeout=0, reporter=Quiet())
                result["ingress_off"] = time.perf_counter() - t_off
            rest = window - (time.perf_counter() - t0)
            if rest > 0:
                time.sleep(rest)
            stop.set()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            result.update({k: v / elapsed for k, v in counts.items()})
            return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def median(results: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    window = 1.5 if args.quick else 6.0
    repeats = 1 if args.quick else 3
    run("none", window / 3)                  # warm-up: imports, first environment, page cache
    runs: dict[str, list[dict]] = {"none": [], "online": [], "offline": []}
    for _ in range(repeats):                 # interleaved, so drift hits every mode alike
        for mode, results in runs.items():
            results.append(run(mode, window))
    base, online, offline = (median(runs[m]) for m in ("none", "online", "offline"))
    emit("no_scaling_consume_rate", "msgs/s", base["consumed"])
    emit("no_scaling_publish_rate", "msgs/s", base["published"])
    emit("online_scale_4_to_8_consume_rate", "msgs/s", online["consumed"],
         "no_scaling_consume_rate", base["consumed"])
    emit("online_scale_4_to_8_publish_rate", "msgs/s", online["published"],
         "no_scaling_publish_rate", base["published"])
    emit("online_scale_4_to_8_check_switched_off_after", "s", online["switch_off"])
    emit("offline_scale_4_to_8_consume_rate", "msgs/s", offline["consumed"],
         "no_scaling_consume_rate", base["consumed"])
    emit("offline_scale_4_to_8_publish_rate", "msgs/s", offline["published"],
         "no_scaling_publish_rate", base["published"])
    emit("offline_scale_4_to_8_ingress_off", "s", offline["ingress_off"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
