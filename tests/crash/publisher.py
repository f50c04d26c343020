"""Crash-test publisher: publishes singles, batches and bursts of ``publish_async`` with keys
until it is killed.

    python publisher.py DATA_DIR LOG --tag T --seed S [--queue q] [--keys 12] [--count N]

Logs ``attempt`` (fsynced) before every publish call and ``published`` after it returned; ids
are ``T.<n>`` and unique per tag (the harness gives every incarnation its own tag). With
``--count`` it stops after that many messages, otherwise it runs until killed.
"""
from __future__ import annotations

import argparse
import random
import sys

from wlog import Log, make_payload

import partq


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("log")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--queue", default="q")
    ap.add_argument("--keys", type=int, default=12)
    ap.add_argument("--count", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    log = Log(args.log)
    broker = partq.Broker.open(args.data)
    log.write({"op": "opened"})
    n = 0

    def new():
        nonlocal n
        n += 1
        key = None if rng.random() < 0.1 else f"k{rng.randrange(args.keys)}"
        mid = f"{args.tag}.{n}"
        return mid, key, make_payload(mid, key, rng.randrange(64))

    while not args.count or n < args.count:
        how = rng.random()
        if how < 0.5:
            mid, key, payload = new()
            log.write({"op": "attempt", "id": mid, "key": key})
            res = broker.publish(args.queue, payload, key=key)
            log.write({"op": "published", "id": mid, "partition": res.partition, "seq": res.seq})
            continue
        batch = [new() for _ in range(rng.randint(2, 12))]
        log.write(*({"op": "attempt", "id": mid, "key": key} for mid, key, _ in batch))
        if how < 0.8:
            results = broker.publish_many(args.queue, [(payload, key) for _, key, payload in batch])
        else:       # several in flight at once, each durable when its result() returns
            pending = [broker.publish_async(args.queue, payload, key=key)
                       for _, key, payload in batch]
            results = [p.result() for p in pending]
        log.write(*({"op": "published", "id": mid, "partition": r.partition, "seq": r.seq}
                    for (mid, _, _), r in zip(batch, results, strict=True)))
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
