#!/usr/bin/env python3
"""Celery on partq beside Celery on Redis: the same tasks, the same worker command, the same
concurrency, in interleaved rounds (bench/method.py).

Each slice enqueues ``--tasks`` tasks (2,000) untimed, from 32 threads of this process, then
starts ``celery worker --pool threads -c 8`` (``--without-gossip --without-mingle
--without-heartbeat``) in a child process; the figure is tasks per second from the first task
done (acked) to the last, so neither side's start-up counts. Two task bodies: a no-op, and
one that sleeps 5 ms (8 threads of 5 ms tasks do at best 1,600 tasks/s). Both sides run the
settings docs/celery.md recommends: ``task_acks_late=True`` (a task is acked after it ran),
``worker_prefetch_multiplier=1``, results ignored.

* partq: ``import partq.kombu`` and ``broker="partq:///DIR"``, a fresh directory per slice
  (the transport's defaults: one partition, ``durability="sync"``). Every publish is fsynced
  before it returns and every ack is committed with an fsync (acks share commits) before the
  queue's depth, which this bench polls, counts it.
* Redis: bench/worker_peers.py's Celery peer, the Redis transport on the ``redis-server``
  bench/peers.py starts (``appendonly yes``, ``appendfsync always``, checked with CONFIG GET),
  flushed before each slice: every command's reply comes after the AOF was fsynced. Done when
  the ``celery`` list and the ``unacked`` hash are empty. Without ``redis-server`` on PATH
  (Debian: apt-get install -y redis-server) its side says ``skipped``, with why.

Prints JSON lines: ``load_average_at_start``, then ``celery_partq_noop_8`` and
``celery_partq_sleep5ms_8``, each beside ``celery_redis_..._8`` (target ratio >= 1.0), with
the durability of both sides on the line.

Usage: ``python bench/celery_on_partq.py [--quick] [--pairs N] [--tasks N]``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from method import Skip, emit, header, interleave, line, log
from worker_peers import CONCURRENCY, Celery, enqueue, stop_child, time_drain

SCRIPT = "celery_on_partq"
SLEEP = 0.005
POLL = 0.01        # how often both sides' queues are looked at while the worker drains them
DURABILITY = ("partq: a directory, durability sync: every publish fsynced before it returns, "
              "every ack committed with an fsync before it counts; Redis: appendonly yes, "
              "appendfsync always (fsynced before each reply); both acks_late, prefetch "
              "multiplier 1")


class CeleryPartq(Celery):
    """Celery's worker on a partq directory: the Redis peer's run with another broker URL."""

    name = "celery_partq"
    durability = DURABILITY
    MODULE = '''
        import os, time
        import partq.kombu
        from celery import Celery
        app = Celery("cptasks", broker=os.environ["BENCH_BROKER_URL"])
        app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                        task_ignore_result=True, broker_connection_retry_on_startup=True)
        SLEEP = float(os.environ["BENCH_SLEEP"])

        @app.task
        def task():
            if SLEEP:
                time.sleep(SLEEP)
    '''

    def _run(self, folder: str, tasks: int, sleep: float) -> float:
        from celery import Celery as App

        import partq.kombu  # noqa: F401  (registers the transport)

        url = "partq://" + os.path.join(folder, "queue")
        env = {"BENCH_BROKER_URL": url, "BENCH_SLEEP": str(sleep)}
        os.environ.update(env)
        self.module(self.MODULE, "cptasks")       # the worker's tasks module, on its path
        app = App("cptasks", broker=url, set_as_current=False)
        app.conf.update(broker_connection_retry_on_startup=True, task_ignore_result=True)
        try:
            enqueue(lambda: app.send_task("cptasks.task"), tasks)
            with app.connection_for_write() as conn:
                channel = conn.default_channel

                def remaining() -> int:
                    return channel.queue_declare("celery", passive=True).message_count
                proc = self.child(folder, [sys.executable, "-m", "celery", "-A", "cptasks",
                                           "worker", "--pool", "threads", "-c",
                                           str(CONCURRENCY), "--without-gossip",
                                           "--without-mingle", "--without-heartbeat",
                                           "-l", "warning"], env)
                try:
                    return time_drain(proc, remaining, tasks, folder, poll=POLL)
                finally:
                    stop_child(proc)
        finally:
            app.pool.force_close_all()       # the producers' connections: the directory closes
            app.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--pairs", type=int, default=None, help="rounds after the warm-up (default 5)")
    parser.add_argument("--tasks", type=int, default=None, help="tasks per slice (default 2000)")
    args = parser.parse_args(argv)
    pairs = args.pairs or (1 if args.quick else 5)
    tasks = args.tasks or (200 if args.quick else 2000)
    emit(header(SCRIPT, pairs, tasks=tasks, concurrency=CONCURRENCY))
    root = tempfile.mkdtemp(prefix="partq-bench-celery-")
    mine, peer = CeleryPartq(root), Celery(root)
    mine.poll = peer.poll = POLL
    try:
        for label, sleep in (("noop", 0.0), ("sleep5ms", SLEEP)):
            got = interleave([("partq", lambda sleep=sleep: mine.run(tasks, sleep)),
                              ("redis", lambda sleep=sleep: peer.run(tasks, sleep))],
                             pairs=pairs, warm=not args.quick, script=SCRIPT)
            emit(line(f"celery_partq_{label}_{CONCURRENCY}", "tasks/s", got["partq"],
                      f"celery_redis_{label}_{CONCURRENCY}", got["redis"], target=1.0,
                      digits=0, durability=DURABILITY, tasks=tasks, concurrency=CONCURRENCY,
                      pool="threads", celery_version=mine.version,
                      redis_version=peer.server_version()))
    finally:
        mine.stop()
        peer.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Skip as exc:
        log(SCRIPT, f"skipped: {exc}")
        sys.exit(0)
