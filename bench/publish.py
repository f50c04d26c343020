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
import sys
from statistics import median

from workloads import partq_publish, partq_publish_many, raw_lmdb_puts


def emit(name: str, unit: str, value: float, peer: str | None = None,
         peer_value: float | None = None) -> None:
    line = {"name": name, "unit": unit, "value": round(value, 1)}
    if peer is not None:
        line.update(peer=peer, peer_value=round(peer_value, 1),
                    ratio=round(value / peer_value, 3) if peer_value else None)
    print(json.dumps(line), flush=True)


def paired(raw, ours, seconds: float, rounds: int) -> tuple[float, tuple]:
    """Alternate ``rounds`` slices of the raw peer and of partq, ``seconds`` in all for each,
    and return the median of each: both sides see the same disk even when its speed drifts
    (fsync latency on a shared machine does), and one stalled slice does not decide a ratio."""
    raws, ours_ = [], []
    for _ in range(rounds):
        raws.append(raw(seconds / rounds))
        ours_.append(ours(seconds / rounds))
    return median(raws), tuple(map(median, zip(*ours_, strict=True)))


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
        peer, (ours,) = paired(lambda t, batch=batch: raw_lmdb_puts(batch, t),
                               lambda t, batch=batch: (partq_publish_many(batch, t),), seconds,
                               rounds)
        emit(f"raw_lmdb_put_batch_{batch}", "msgs/s", peer)
        emit(f"partq_publish_many_batch_{batch}", "msgs/s", ours, f"raw_lmdb_put_batch_{batch}", peer)

    emit("partq_publish_32_vs_1_threads", "msgs/s", many_threads, "partq_publish_1_thread", one)
    return 0


if __name__ == "__main__":
    sys.exit(main())
