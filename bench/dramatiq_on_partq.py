#!/usr/bin/env python3
"""dramatiq on partq beside dramatiq on Redis: the same actor, the same worker, the same
concurrency, in interleaved rounds (bench/method.py).

Each slice sends ``--messages`` messages to a no-op actor from one thread while a dramatiq
``Worker`` of this process (8 worker threads, ``worker_timeout`` 100 ms, dramatiq's default
middleware) runs them; the figure is messages per second from the first send to the last
message run. partq: ``partq.dramatiq.PartqBroker`` on a fresh directory per slice (4
partitions), ``durability="sync"``: a send returns after its publish was fsynced, an ack after
its ack was fsynced. Redis: dramatiq's ``RedisBroker`` on a ``redis-server`` this bench starts
(bench/peers.py's: ``--appendonly yes --appendfsync always``, checked with CONFIG GET), flushed
before each slice: every command's reply comes after the AOF was fsynced. Without
``redis-server`` on PATH (Debian: apt-get install -y redis-server) the Redis side says
``skipped``. Beside it, partq alone: the same with every message sent with one of 16
``partq_key`` values (one message per key at a time).

Prints JSON lines: ``load_average_at_start``, ``dramatiq_partq_msgs_per_s`` beside
``dramatiq_redis_msgs_per_s`` (target ratio >= 1.0), ``dramatiq_partq_keyed_msgs_per_s``.

Usage: ``python bench/dramatiq_on_partq.py [--quick] [--pairs N] [--messages N]``.
"""
from __future__ import annotations

import argparse
import threading
import time

from method import Skip, emit, header, interleave, line, log
from peers import RedisServer
from workloads import scratch_dir

SCRIPT = "dramatiq_on_partq"
THREADS = 8
DURABILITY = ("partq: durability sync, publish and ack fsynced before they return; Redis: "
              "appendonly yes, appendfsync always (fsynced before each reply)")


def run_slice(broker, messages: int, key_count: int = 0) -> float:
    """Send ``messages`` to a no-op actor of ``broker`` while a Worker runs them; msgs/s."""
    import dramatiq
    from dramatiq import Worker

    done, lock, count = threading.Event(), threading.Lock(), [0]

    def noop(i):
        with lock:
            count[0] += 1
            if count[0] == messages:
                done.set()
    actor = dramatiq.actor(noop, broker=broker, actor_name=f"noop_{id(broker):x}", max_retries=0)
    worker = Worker(broker, worker_timeout=100, worker_threads=THREADS)
    worker.start()
    try:
        start = time.perf_counter()
        for i in range(messages):
            if key_count:
                actor.send_with_options(args=(i,), partq_key=f"k{i % key_count}")
            else:
                actor.send(i)
        if not done.wait(300):
            raise RuntimeError(f"only {count[0]} of {messages} messages ran in 300 s")
        return messages / (time.perf_counter() - start)
    finally:
        worker.stop()


def partq_side(messages: int, key_count: int = 0):
    def slice_() -> float:
        from partq.dramatiq import PartqBroker
        with scratch_dir() as path:
            broker = PartqBroker(path, partitions=4)
            try:
                return run_slice(broker, messages, key_count)
            finally:
                broker.close()
    return slice_


def redis_side(server: RedisServer | None, messages: int, skip: str | None):
    def slice_() -> float:
        if server is None:
            raise Skip(skip or "no redis-server")
        from dramatiq.brokers.redis import RedisBroker
        server.client.flushall()
        broker = RedisBroker(client=server.client)
        try:
            return run_slice(broker, messages)
        finally:
            broker.close()
    return slice_


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--pairs", type=int, default=None, help="rounds after the warm-up (default 5)")
    parser.add_argument("--messages", type=int, default=None, help="messages per slice (default 2000)")
    args = parser.parse_args(argv)
    pairs = args.pairs or (1 if args.quick else 5)
    messages = args.messages or (100 if args.quick else 2000)
    emit(header(SCRIPT, pairs, messages=messages, threads=THREADS))
    server: RedisServer | None = RedisServer()
    skip = None
    try:
        server.start()
    except Skip as exc:
        skip, server = str(exc), None
        log(SCRIPT, f"Redis skipped: {skip}")
    try:
        got = interleave([("partq", partq_side(messages)),
                          ("redis", redis_side(server, messages, skip)),
                          ("partq_keyed", partq_side(messages, key_count=16))],
                         pairs=pairs, warm=not args.quick, script=SCRIPT)
    finally:
        if server is not None:
            server.stop()
    emit(line("dramatiq_partq_msgs_per_s", "msgs/s", got["partq"], "dramatiq_redis_msgs_per_s",
              got["redis"], target=1.0, durability=DURABILITY, threads=THREADS, messages=messages))
    emit(line("dramatiq_partq_keyed_msgs_per_s", "msgs/s", got["partq_keyed"], keys=16,
              durability=DURABILITY, threads=THREADS, messages=messages,
              note="every message with one of 16 partq_key values: one at a time per key"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
