"""Crash-test publisher: publishes singles, batches and bursts of ``publish_async`` with keys
until it is killed.

    python publisher.py DATA_DIR LOG --tag T --seed S [--queue q] [--keys 12] [--count N]
                        [--lifecycle]

Logs ``attempt`` (fsynced) before every publish call and ``published`` after it returned; ids
are ``T.<n>`` and unique per tag (the harness gives every incarnation its own tag). With
``--count`` it stops after that many messages, otherwise it runs until killed.

``--lifecycle`` (``lifecycle``): a few messages get poison or reject keys, some publish calls
give their messages a TTL (``ttl`` in their
``attempt`` lines, with ``wall``: the wall clock before the call), and a publish refused with
``QueueFull`` (the queue's ``max_depth``; nothing of it was stored) logs ``refused`` per message
instead of ``published``, and waits a little before it publishes again.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import lifecycle
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
    ap.add_argument("--lifecycle", action="store_true")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    log = Log(args.log)
    broker = partq.Broker.open(args.data)
    log.write({"op": "opened"})
    n = 0

    def new():
        nonlocal n
        n += 1
        key = (args.lifecycle and lifecycle.pick_key(rng)) or \
            (None if rng.random() < 0.1 else f"k{rng.randrange(args.keys)}")
        mid = f"{args.tag}.{n}"
        return mid, key, make_payload(mid, key, rng.randrange(64))

    def attempts(batch, ttl):
        extra = {} if ttl is None else {"ttl": ttl}
        if args.lifecycle:
            extra["wall"] = time.time()
        return ({"op": "attempt", "id": mid, "key": key, **extra} for mid, key, _ in batch)

    def outcome(mid, res):
        if isinstance(res, partq.QueueFull):
            return {"op": "refused", "id": mid}
        return {"op": "published", "id": mid, "partition": res.partition, "seq": res.seq}

    def result(call, *a, **kw):
        """``call(*a, **kw)``, or the QueueFull it raised in lifecycle rounds."""
        try:
            return call(*a, **kw)
        except partq.QueueFull as exc:
            if not args.lifecycle:
                raise
            return exc

    def backoff():
        """A refused publisher waits before it tries again, as a client would."""
        time.sleep(rng.uniform(*lifecycle.FULL_BACKOFF))

    while not args.count or n < args.count:
        how = rng.random()
        ttl = lifecycle.ttl_for(rng) if args.lifecycle else None
        if how < 0.5:
            batch = [new()]
            log.write(*attempts(batch, ttl))
            mid, key, payload = batch[0]
            res = result(broker.publish, args.queue, payload, key=key, ttl=ttl)
            log.write(outcome(mid, res))
            if isinstance(res, partq.QueueFull):
                backoff()
            continue
        batch = [new() for _ in range(rng.randint(2, 12))]
        log.write(*attempts(batch, ttl))
        if how < 0.8:
            res = result(broker.publish_many, args.queue,
                         [(payload, key) for _, key, payload in batch], ttl=ttl)
            results = [res] * len(batch) if isinstance(res, partq.QueueFull) else res
        else:       # several in flight at once, each durable when its result() returns
            pending = [broker.publish_async(args.queue, payload, key=key, ttl=ttl)
                       for _, key, payload in batch]
            results = [result(p.result) for p in pending]
        log.write(*(outcome(mid, r) for (mid, _, _), r in zip(batch, results, strict=True)))
        if any(isinstance(r, partq.QueueFull) for r in results):
            backoff()
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
