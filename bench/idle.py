"""What an idle consumer costs: CPU per bound flow waiting on an empty queue (architecture issue).

Flows are bound to an empty 6-partition queue, each in its own thread calling
``receive(timeout=0.5)`` in a loop (a service's consumers between bursts), for a few seconds of
wall time. The process's CPU time (all threads: the receivers, the ticker, the group commit) is
read with ``resource.getrusage`` and compared with the same broker open for the same time with
no flow bound. Reported: percent of one core per idle flow. The target is under 1%.

    .venv/bin/python bench/idle.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import threading
import time

import partq


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def idle_cpu(flows: int, seconds: float) -> float:
    """CPU seconds the process used in ``seconds`` of wall time with ``flows`` idle flows."""
    root = tempfile.mkdtemp(prefix="partq-idle-")
    try:
        with partq.Broker.open(root) as broker:
            broker.create_queue("q", partitions=6)
            bound = [broker.bind("q") for _ in range(flows)]
            stop = threading.Event()

            def wait(flow) -> None:
                while not stop.is_set():
                    flow.receive(timeout=0.5)
            threads = [threading.Thread(target=wait, args=(f,)) for f in bound]
            for t in threads:
                t.start()
            time.sleep(0.5)                     # settle: first receives, first bookkeeping
            start = cpu_seconds()
            time.sleep(seconds)
            used = cpu_seconds() - start
            stop.set()
            for t in threads:
                t.join()
        return used
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    seconds = 1.0 if args.quick else 5.0
    base = idle_cpu(0, seconds)
    for flows in (1, 20):
        used = idle_cpu(flows, seconds)
        per_flow = max(used - base, 0.0) / flows / seconds * 100
        print(json.dumps({"name": f"idle_bound_flow_cpu_{flows}_flows", "unit": "% of a core per flow",
                          "value": round(per_flow, 3), "target": 1.0,
                          "baseline_cpu_percent": round(base / seconds * 100, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
