"""partq.Worker running tasks, beside dramatiq on Redis, Celery on Redis and huey on SQLite.

Every side runs the same job: ``--tasks`` tasks (20,000) enqueued untimed, then a worker with 8
concurrent handlers (threads) started; it is timed from the first task done to the last (done
and acknowledged durably), so no side's start-up counts; the figure is tasks per second. Two
handlers: a no-op, and one that sleeps 5 ms (the ideal for 8 handlers is 8 / 0.005 = 1,600
tasks/s).

* ``worker_noop_8`` / ``worker_sleep5ms_8``: ``partq.Worker`` on a directory, a queue of 8
  partitions with ``ordering="key"`` and 64 keys (never two tasks of one key at once).
  Durability: every ack is fsynced (group commits) before it counts, as every publish was.
* ``..._vs_dramatiq_redis``: dramatiq's RedisBroker, one worker process with 8 threads,
  Redis with ``appendfsync always`` (each enqueue and ack is fsynced before Redis answers: equal
  durability). Done when the broker's message hash of the queue is empty (acked).
* ``..._vs_celery_redis``: Celery 5 with the Redis transport, ``acks_late``, the ``threads``
  pool of 8, prefetch multiplier 1, Redis ``appendfsync always``. Done when the queue list and
  the unacked hash are empty.
* ``..._vs_huey_sqlite``: huey's SqliteHuey (SQLite in WAL mode, synchronous NORMAL: a commit
  is not fsynced, weaker than the others), the consumer with 8 worker threads. Done when no
  task is pending (a task leaves the table when a worker takes it: up to 8 may still run).
* ``worker_sleep5ms_8_vs_ideal``: the 5 ms figure over 1,600 (target 0.9).

A peer whose package (the ``bench`` extra) or redis-server is missing says ``skipped``.

    .venv/bin/python bench/worker.py [--quick] [--tasks N] [--pairs N]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from method import Skip, emit, header, interleave, line, log  # noqa: E402
from worker_peers import PEERS  # noqa: E402

import partq  # noqa: E402

SCRIPT = "worker"
CONCURRENCY = int(os.environ.get("BENCH_CONC", "8"))
KEYS, PARTITIONS = 64, 8
SLEEP = 0.005
IDEAL_SLEEP = CONCURRENCY / SLEEP        # tasks/s 8 handlers of 5 ms do at best


def partq_side(root: str, tasks: int, sleep: float) -> float:
    """Tasks per second of a partq.Worker over ``tasks`` pre-published tasks."""
    data = tempfile.mkdtemp(prefix="partq-bench-worker-", dir=root)
    try:
        with partq.Broker.open(data) as b:
            b.create_queue("tasks", partitions=PARTITIONS, ordering="key")
            for start in range(0, tasks, 5000):
                b.publish_many("tasks", [(b"task", f"key-{i % KEYS}")
                                         for i in range(start, min(start + 5000, tasks))])
        w = partq.Worker(data)

        if sleep:
            @w.handler("tasks", concurrency=CONCURRENCY)
            def handle(msg) -> None:
                time.sleep(sleep)
        else:
            @w.handler("tasks", concurrency=CONCURRENCY)
            def handle(msg) -> None:
                pass
        w.start()
        first = None
        while (done := w.status()[0]["handled"]) < tasks:
            if first is None and done:
                first = (time.perf_counter(), tasks - done)
            time.sleep(0.002)
        now = time.perf_counter()
        w.stop()
        if first is None:
            return tasks / 0.002        # done within one poll
        return first[1] / max(now - first[0], 1e-6)
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="few tasks, two pairs: a smoke run")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated peers to run")
    args = ap.parse_args(argv)
    tasks, pairs = (1000, 1) if args.quick else (args.tasks, args.pairs)
    emit(header(SCRIPT, pairs, tasks=tasks, concurrency=CONCURRENCY))
    root = tempfile.mkdtemp(prefix="partq-bench-worker-")
    peers = [PEERS[name](root) for name in args.peers.split(",") if name]
    try:
        for label, sleep in (("noop", 0.0), ("sleep5ms", SLEEP)):
            jobs = [("partq", lambda sleep=sleep: partq_side(root, tasks, sleep))]
            for peer in peers:
                jobs.append((peer.name, lambda peer=peer, sleep=sleep: peer.run(tasks, sleep)))
            got = interleave(jobs, pairs, warm=not args.quick, script=SCRIPT)
            name = f"worker_{label}_{CONCURRENCY}"
            mine = got["partq"]
            assert isinstance(mine, list)
            emit({"name": name, "unit": "tasks/s", "value": round(sorted(mine)[len(mine) // 2]),
                  "tasks": tasks, "keys": KEYS, "partitions": PARTITIONS, "ordering": "key",
                  "durability": "every ack fsynced before it counts (group commit)"})
            for peer in peers:
                target = 10.0 if label == "noop" and peer.name == "dramatiq_redis" else None
                emit(line(f"{name}_vs_{peer.name}", "tasks/s", mine,
                          f"{peer.name}_{label}_{CONCURRENCY}", got[peer.name], target=target,
                          digits=0, durability=peer.durability, peer_version=peer.version))
            if sleep:
                value = sorted(mine)[len(mine) // 2]
                emit({"name": f"{name}_vs_ideal", "unit": "tasks/s", "value": round(value),
                      "peer": "ideal_8_handlers_of_5ms", "peer_value": IDEAL_SLEEP,
                      "ratio": round(round(value) / IDEAL_SLEEP, 3), "target": 0.9})
    finally:
        for peer in peers:
            peer.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Skip as exc:
        log(SCRIPT, f"skipped: {exc}")
        sys.exit(0)
