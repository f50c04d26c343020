#!/usr/bin/env python3
"""Where publish_many's time goes: encoding in Python against everything else.

Prints one JSON object per line (``name``, ``unit``, ``value``; ``peer``, ``peer_value`` and
``ratio`` beside a figure of the same run):

* ``encode_batch_1000``: microseconds per message to check and encode a batch of 1000 keyed
  256-byte messages (``partq.publish.publisher.encode``: type checks, key hash, msgpack, crc32c framing);
* ``decode_record`` / ``record_fields``: microseconds per record to check and decode, with and
  without building a ``Record`` (delivery uses the second);
* ``partq_publish_many_preencoded_1000``: durable ``publish_many``-shaped commits of 1000
  messages whose records were encoded once, before timing, beside raw py-lmdb puts of 1000 per
  transaction, and ``partq_publish_many_batch_1000`` (encoding included) beside the same peer.
  The gap between the two partq lines is the encoding's share;
* ``partq_publish_many_batch_1000_vs_raw_lmdb_same_work``: the same partq figure beside raw
  py-lmdb doing the same necessary work (``raw_lmdb_same_work_batch_1000``, see
  bench/workloads.py; target 0.85x).

The four commit figures run in interleaved slices (bench/method.py: one warm-up round, then
``--pairs`` rounds, 7 by default); a ratio is the median of the rounds' ratios with its min and
max. The first line, ``load_average_at_start``, carries the load average and CPU count.

Usage: ``python bench/encode_cost.py [--quick] [--pairs N]``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from method import DEFAULT_PAIRS, header, interleave, line
from method import emit as emit_line
from workloads import (
    KEYS,
    PAYLOAD,
    partq_broker,
    partq_publish_many,
    raw_lmdb_puts,
    raw_lmdb_same_work,
    repeat_rate,
)

from partq.config import QueueConfig
from partq.publish.encode import encode
from partq.storage.encoding import decode_record, encode_record, record_fields


def emit(name: str, unit: str, value: float, peer: str | None = None,
         peer_value: float | None = None) -> None:
    line = {"name": name, "unit": unit, "value": round(value, 3)}
    if peer is not None:
        line.update(peer=peer, peer_value=round(peer_value, 3), ratio=round(value / peer_value, 3))
    print(json.dumps(line), flush=True)


def per_item_us(fn, items: int, seconds: float) -> float:
    """Best of five slices: microseconds per item of ``fn()``, which handles ``items``."""
    best = float("inf")
    for _ in range(5):
        calls, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 5:
            fn()
            calls += 1
        best = min(best, (time.perf_counter() - start) / (calls * items) * 1e6)
    return best


def preencoded_rate(seconds: float) -> float:
    with partq_broker() as b:
        items = [(PAYLOAD, KEYS[i % 1024]) for i in range(1000)]
        config = b.publisher.config("q")         # the publisher's own copy: checked as is
        encoded = encode(config, items, time.time_ns())
        write, place = b.store.write, b.publisher.place
        return repeat_rate(lambda: write(lambda w: place(w, "q", encoded, config)), 1000, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--pairs", type=int, default=None,
                        help=f"interleaved rounds after the warm-up (default {DEFAULT_PAIRS}, "
                             "or 1 with --quick)")
    args = parser.parse_args(argv)
    seconds = 0.3 if args.quick else 3.0
    pairs = max(1, args.pairs if args.pairs is not None else (1 if args.quick else DEFAULT_PAIRS))
    emit_line(header("encode_cost", pairs, slice_seconds=round(seconds / pairs, 3)))

    config = QueueConfig(name="q", partitions=4)
    items = [(PAYLOAD, KEYS[i % 1024]) for i in range(1000)]
    emit("encode_batch_1000", "us/msg",
         per_item_us(lambda: encode(config, items, 0), 1000, seconds))
    raws = [encode_record(1, KEYS[i % 1024], None, PAYLOAD) for i in range(1000)]
    full = per_item_us(lambda: [decode_record(r, "q", 0, 0) for r in raws], 1000, seconds)
    emit("decode_record", "us/record", full)
    emit("record_fields", "us/record",
         per_item_us(lambda: [record_fields(r) for r in raws], 1000, seconds),
         "decode_record", full)

    t = seconds / pairs
    m = interleave([("raw_lmdb_put_batch_1000", lambda: raw_lmdb_puts(1000, t)),
                    ("raw_lmdb_same_work_batch_1000", lambda: raw_lmdb_same_work(1000, t)),
                    ("partq_publish_many_preencoded_1000", lambda: preencoded_rate(t)),
                    ("partq_publish_many_batch_1000", lambda: partq_publish_many(1000, t))],
                   pairs, script="encode_cost")
    raw, same = m["raw_lmdb_put_batch_1000"], m["raw_lmdb_same_work_batch_1000"]
    emit_line(line("raw_lmdb_put_batch_1000", "msgs/s", raw))
    emit_line(line("partq_publish_many_preencoded_1000", "msgs/s",
                   m["partq_publish_many_preencoded_1000"], "raw_lmdb_put_batch_1000", raw))
    emit_line(line("partq_publish_many_batch_1000", "msgs/s", m["partq_publish_many_batch_1000"],
                   "raw_lmdb_put_batch_1000", raw))
    emit_line(line("raw_lmdb_same_work_batch_1000", "msgs/s", same))
    emit_line(line("partq_publish_many_batch_1000_vs_raw_lmdb_same_work", "msgs/s",
                   m["partq_publish_many_batch_1000"], "raw_lmdb_same_work_batch_1000", same,
                   target=0.85))
    return 0


if __name__ == "__main__":
    sys.exit(main())
