#!/usr/bin/env python3
"""Durable publish throughput of partq against the physical limit: raw py-lmdb puts.

Prints one JSON object per line: ``name``, ``unit``, ``value`` and, for side-by-side results,
``peer``, ``peer_value`` and ``ratio`` (= value / peer_value), all measured in this run.

partq (``durability="sync"``, 256-byte payloads, a 4-partition keyed queue):
* ``publish`` from 1 thread: one fsynced commit per message; its peer is raw LMDB with one
  put per transaction.
* ``publish`` from 32 threads: group commit shares each fsync among the waiting publishers,
  at most 32 of them; its peer is raw LMDB with 32 puts per transaction, the best such a
  commit could do.
* ``publish_many`` with batches of 100 and 1000: one transaction per batch; peers are raw
  LMDB with the same number of puts per transaction.
* the scaling of ``publish`` from 1 to 32 threads.

Raw LMDB: ``lmdb.open(sync=True)``, one write transaction per batch, one ``txn.put`` of the
256-byte payload per message under a 16-byte big-endian key. It does no encoding, no checksum,
no partition choice and no head bookkeeping: the ratio is what all of that costs.

Each partq figure and its raw peer are measured in alternating slices (5 by default) and the
medians reported, so that both see the same disk while its speed drifts.

Usage: ``python bench/publish.py [--quick] [--seconds S] [--rounds N]``. ``--quick`` is a smoke
run of a few seconds whose numbers mean little.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from statistics import median

import lmdb

import partq

PAYLOAD = bytes(range(256))
PARTITIONS = 4
KEYS = [f"customer-{i}" for i in range(1024)]


def emit(name: str, unit: str, value: float, peer: str | None = None,
         peer_value: float | None = None) -> None:
    line = {"name": name, "unit": unit, "value": round(value, 1)}
    if peer is not None:
        line.update(peer=peer, peer_value=round(peer_value, 1),
                    ratio=round(value / peer_value, 3) if peer_value else None)
    print(json.dumps(line), flush=True)


@contextmanager
def scratch_dir():
    path = tempfile.mkdtemp(prefix="partq-bench-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def broker():
    with scratch_dir() as path:
        b = partq.Broker.open(path)
        try:
            b.create_queue("q", partitions=PARTITIONS)
            yield b
        finally:
            b.close()


def rate(loop, seconds: float) -> float:
    """Run ``loop(deadline)`` (returns messages sent); messages per second."""
    start = time.perf_counter()
    sent = loop(start + seconds)
    return sent / (time.perf_counter() - start)


# ---------------------------------------------------------------------------- partq
def partq_publish(threads: int, seconds: float) -> tuple[float, float]:
    """Messages per second, and messages per group commit (from the store's counters)."""
    with broker() as b:
        b.publish("q", PAYLOAD, key=KEYS[0])  # warm the config cache
        counts = [0] * threads
        start_line = threading.Barrier(threads + 1)
        deadline = [0.0]

        def publisher(t: int) -> None:
            publish, n, k = b.publish, 0, t
            start_line.wait()
            end = deadline[0]
            while time.perf_counter() < end:
                publish("q", PAYLOAD, key=KEYS[k % 1024])
                n += 1
                k += threads
            counts[t] = n

        workers = [threading.Thread(target=publisher, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        writer = b._store._writer  # internal counters, read for this diagnostic only
        commits_before = writer.commits
        start = time.perf_counter()
        deadline[0] = start + seconds
        start_line.wait()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        commits = writer.commits - commits_before
        return sum(counts) / elapsed, sum(counts) / max(commits, 1)


def partq_publish_many(batch: int, seconds: float) -> float:
    with broker() as b:
        items = [(PAYLOAD, KEYS[i % 1024]) for i in range(batch)]
        b.publish_many("q", items[:1])

        def loop(deadline: float) -> int:
            n = 0
            while time.perf_counter() < deadline:
                b.publish_many("q", items)
                n += batch
            return n
        return rate(loop, seconds)


# ---------------------------------------------------------------------------- raw LMDB
def raw_lmdb_puts(batch: int, seconds: float) -> float:
    with scratch_dir() as path:
        env = lmdb.open(path, map_size=8 << 30, sync=True)
        try:
            def loop(deadline: float) -> int:
                n = 0
                while time.perf_counter() < deadline:
                    with env.begin(write=True) as txn:
                        put = txn.put
                        for i in range(n, n + batch):
                            put(i.to_bytes(16, "big"), PAYLOAD)
                    n += batch
                return n
            return rate(loop, seconds)
        finally:
            env.close()


def paired(raw, ours, seconds: float, rounds: int) -> tuple[float, tuple]:
    """Alternate ``rounds`` slices of the raw peer and of partq, ``seconds`` in all for each,
    and return the median of each: both sides see the same disk even when its speed drifts
    (fsync latency on a shared machine does), and one stalled slice does not decide a ratio."""
    raws, ours_ = [], []
    for _ in range(rounds):
        raws.append(raw(seconds / rounds))
        ours_.append(ours(seconds / rounds))
    return median(raws), tuple(map(median, zip(*ours_)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--seconds", type=float, default=None,
                        help="duration of each measurement (default 2.5, or 0.2 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="slices each measurement is split into, alternating with its peer "
                             "(default 5, or 1 with --quick)")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (0.2 if args.quick else 2.5)
    rounds = max(1, args.rounds if args.rounds is not None else (1 if args.quick else 5))

    raw1, (one,) = paired(lambda t: raw_lmdb_puts(1, t), lambda t: partq_publish(1, t)[:1],
                          seconds, rounds)
    emit("raw_lmdb_put_batch_1", "msgs/s", raw1)
    emit("partq_publish_1_thread", "msgs/s", one, "raw_lmdb_put_batch_1", raw1)

    raw32, (many_threads, per_commit) = paired(lambda t: raw_lmdb_puts(32, t),
                                               lambda t: partq_publish(32, t), seconds, rounds)
    emit("raw_lmdb_put_batch_32", "msgs/s", raw32)
    emit("partq_publish_32_threads", "msgs/s", many_threads, "raw_lmdb_put_batch_32", raw32)
    emit("partq_publish_32_threads_msgs_per_commit", "msgs/commit", per_commit)

    for batch in (100, 1000):
        peer, (ours,) = paired(lambda t: raw_lmdb_puts(batch, t),
                               lambda t: (partq_publish_many(batch, t),), seconds, rounds)
        emit(f"raw_lmdb_put_batch_{batch}", "msgs/s", peer)
        emit(f"partq_publish_many_batch_{batch}", "msgs/s", ours, f"raw_lmdb_put_batch_{batch}", peer)

    emit("partq_publish_32_vs_1_threads", "msgs/s", many_threads, "partq_publish_1_thread", one)
    return 0


if __name__ == "__main__":
    sys.exit(main())
