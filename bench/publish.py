#!/usr/bin/env python3
"""Durable publish throughput of partq against the physical limit: raw py-lmdb in this run.

Prints one JSON object per line: ``name``, ``unit``, ``value`` and, for side-by-side results,
``peer``, ``peer_value``, ``ratio`` (the median of the pairs' ratios, see below) with
``ratio_min``, ``ratio_max`` and ``pairs``, and ``target`` where the issue set one. The first
line, ``load_average_at_start``, carries the load average, the CPU count and the date.

partq (``durability="sync"``, 256-byte payloads, a 4-partition keyed queue):
* ``publish`` from 1 thread: one fsynced commit per message; its peer is raw LMDB with one
  put per transaction. LMDB fsyncs twice per commit (the data pages, then the meta page), where
  SQLite in WAL mode fsyncs once: the line says so, beside persist-queue's in bench/peers.py.
* ``publish_async`` from 1 thread, 64 in flight, against blocking ``publish`` (target 20x).
* ``publish`` from 32 threads: group commit shares each fsync among the waiting publishers; its
  peers are raw LMDB with 32 puts per transaction and, the target's peer (0.8x), raw LMDB group
  commit from 32 blocking Python threads (``raw_lmdb_group_commit_32_threads``): the ceiling of
  any Python broker with blocking publishers, measured in the same run.
* ``publish_many`` with batches of 100 and 1000: one transaction per batch; peers are raw
  LMDB with the same number of puts per transaction (bare: no encoding, context only) and, for
  1000, raw LMDB doing the same necessary work (``raw_lmdb_same_work_batch_1000``: records of
  partq's size, each msgpack-framed with a crc32c, encoded in the loop, in partq's chunk layout,
  one transaction per batch; target 0.85x).
* the scaling of ``publish`` from 1 to 32 threads.

Method (bench/method.py): the sides of each group run in interleaved slices, one warm-up round
then ``--pairs`` rounds (7 by default), ``--seconds`` per side in all; a ratio is the median of
the rounds' ratios, with their min and max.

Usage: ``python bench/publish.py [--quick] [--seconds S] [--pairs N]``. ``--quick`` is a smoke
run of a few seconds whose numbers mean little.
"""
from __future__ import annotations

import argparse
import sys

from method import DEFAULT_PAIRS, emit, header, interleave, line
from workloads import (
    partq_publish,
    partq_publish_async,
    partq_publish_many,
    raw_lmdb_group_commit,
    raw_lmdb_puts,
    raw_lmdb_same_work,
)

FSYNC_NOTE = ("LMDB fsyncs twice per commit (data pages, then the meta page); SQLite in WAL mode "
              "fsyncs once: a single-message commit is bound by that, not by partq")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few-second smoke run")
    parser.add_argument("--seconds", type=float, default=None,
                        help="measuring time per side, over all its slices (default 2.5, or 0.2 "
                             "with --quick)")
    parser.add_argument("--pairs", "--rounds", type=int, default=None, dest="pairs",
                        help=f"interleaved rounds after the warm-up (default {DEFAULT_PAIRS}, "
                             "or 1 with --quick)")
    args = parser.parse_args(argv)
    pairs = max(1, args.pairs if args.pairs is not None else (1 if args.quick else DEFAULT_PAIRS))
    seconds = args.seconds if args.seconds is not None else (0.2 if args.quick else 2.5)
    t = seconds / pairs
    emit(header("publish", pairs, slice_seconds=round(t, 3)))

    per_commit: list[float] = []

    def partq_32() -> float:
        rate, msgs_per_commit = partq_publish(32, t)
        per_commit.append(msgs_per_commit)
        return rate

    single = interleave([
        ("raw_lmdb_put_batch_1", lambda: raw_lmdb_puts(1, t)),
        ("partq_publish_1_thread", lambda: partq_publish(1, t)[0]),
        ("partq_publish_async_1_thread_window_64", lambda: partq_publish_async(64, t)),
        ("raw_lmdb_put_batch_32", lambda: raw_lmdb_puts(32, t)),
        ("raw_lmdb_group_commit_32_threads", lambda: raw_lmdb_group_commit(32, t)),
        ("partq_publish_32_threads", partq_32),
    ], pairs, script="publish")
    s = single
    emit(line("raw_lmdb_put_batch_1", "msgs/s", s["raw_lmdb_put_batch_1"]))
    emit(line("partq_publish_1_thread", "msgs/s", s["partq_publish_1_thread"],
              "raw_lmdb_put_batch_1", s["raw_lmdb_put_batch_1"], note=FSYNC_NOTE))
    emit(line("raw_lmdb_put_batch_32", "msgs/s", s["raw_lmdb_put_batch_32"]))
    emit(line("partq_publish_32_threads", "msgs/s", s["partq_publish_32_threads"],
              "raw_lmdb_put_batch_32", s["raw_lmdb_put_batch_32"]))
    emit(line("partq_publish_32_threads_msgs_per_commit", "msgs/commit", per_commit[-pairs:]))
    emit(line("raw_lmdb_group_commit_32_threads", "msgs/s", s["raw_lmdb_group_commit_32_threads"]))
    emit(line("partq_publish_32_threads_vs_raw_lmdb_group_commit_32", "msgs/s",
              s["partq_publish_32_threads"], "raw_lmdb_group_commit_32_threads",
              s["raw_lmdb_group_commit_32_threads"], target=0.8))
    emit(line("partq_publish_async_1_thread_window_64", "msgs/s",
              s["partq_publish_async_1_thread_window_64"], "partq_publish_1_thread",
              s["partq_publish_1_thread"], target=20.0))

    for batch in (100, 1000):
        jobs = [(f"raw_lmdb_put_batch_{batch}", lambda b=batch: raw_lmdb_puts(b, t))]
        if batch == 1000:
            jobs.append(("raw_lmdb_same_work_batch_1000", lambda: raw_lmdb_same_work(1000, t)))
        jobs.append((f"partq_publish_many_batch_{batch}", lambda b=batch: partq_publish_many(b, t)))
        m = interleave(jobs, pairs, script="publish")
        ours, bare = m[f"partq_publish_many_batch_{batch}"], m[f"raw_lmdb_put_batch_{batch}"]
        emit(line(f"raw_lmdb_put_batch_{batch}", "msgs/s", bare))
        emit(line(f"partq_publish_many_batch_{batch}", "msgs/s", ours,
                  f"raw_lmdb_put_batch_{batch}", bare))
        if batch == 1000:
            same = m["raw_lmdb_same_work_batch_1000"]
            emit(line("raw_lmdb_same_work_batch_1000", "msgs/s", same))
            emit(line("partq_publish_many_batch_1000_vs_raw_lmdb_same_work", "msgs/s", ours,
                      "raw_lmdb_same_work_batch_1000", same, target=0.85))

    emit(line("partq_publish_32_vs_1_threads", "msgs/s", s["partq_publish_32_threads"],
              "partq_publish_1_thread", s["partq_publish_1_thread"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
