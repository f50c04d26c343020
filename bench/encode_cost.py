#!/usr/bin/env python3
"""Where publish_many's time goes: encoding in Python against everything else.

Prints one JSON object per line (``name``, ``unit``, ``value``; ``peer``, ``peer_value`` and
``ratio`` beside a figure of the same run):

* ``encode_batch_1000``: microseconds per message to check and encode a batch of 1000 keyed
  256-byte messages (``partq.publishing.encode``: type checks, key hash, msgpack, crc32c framing);
* ``decode_record`` / ``record_fields``: microseconds per record to check and decode, with and
  without building a ``Record`` (delivery uses the second);
* ``partq_publish_many_preencoded_1000``: durable ``publish_many``-shaped commits of 1000
  messages whose records were encoded once, before timing, beside raw py-lmdb puts of 1000 per
  transaction, and ``partq_publish_many_batch_1000`` (encoding included) beside the same peer.
  The gap between the two partq lines is the encoding's share.

Usage: ``python bench/encode_cost.py [--quick]``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from workloads import KEYS, PAYLOAD, partq_broker, partq_publish_many, raw_lmdb_puts, repeat_rate

from partq.config import QueueConfig
from partq.publishing import encode
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
        encoded = encode(b.queue_config("q"), items, time.time_ns())
        write, place = b.store.write, b.publisher.place
        return repeat_rate(lambda: write(lambda w: place(w, "q", encoded)), 1000, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    seconds = 0.3 if args.quick else 3.0

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

    raw = raw_lmdb_puts(1000, seconds)
    emit("raw_lmdb_put_batch_1000", "msgs/s", raw)
    emit("partq_publish_many_preencoded_1000", "msgs/s", preencoded_rate(seconds),
         "raw_lmdb_put_batch_1000", raw)
    emit("partq_publish_many_batch_1000", "msgs/s", partq_publish_many(1000, seconds),
         "raw_lmdb_put_batch_1000", raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
