"""The final drain: a clean consumer process that binds, receives until the queue is empty, acks
everything, and checks the broker agrees the queue is empty.

    python drain.py DATA_DIR LOG [--queue q] [--timeout 60] [--names drain] [--dead QUEUE]

Exit 0 after logging ``drained`` (with the queue's status). Exit 3 when the queue did not
empty in time (prints the status). The previous owner's flows are ghosts after a restart; they
keep their partitions for the rebalance delay unless a flow binds under their name (``--names
a,b`` binds one flow per name), after which the drain's flows get them, so "empty" is decided by
the broker's depth, not by one empty receive.

The ``opened`` line records how long opening took, the queue's partition count and scaling
status right after opening, and ``state_n``: the partition count in the delivery state the
previous owner stored (``test_crash_points`` uses it to recognise a known bug).

``--dead QUEUE`` (lifecycle rounds): once the queue is empty, the dead message queue is drained
too (rule `dead-messages`): one ``dead`` line per message (``id`` from its payload, ``key``, its
``dead_reason``, ``origin_partition``, ``origin_seq`` and ``delivery_count`` headers, its place
``dq_partition``/``dq_seq``, ``died_wall``: its publish time there, i.e. when it died, and
``wall``: the wall clock when the line was made, with ``t``: the monotonic one), then
``dead_drained``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import msgpack
from wlog import Log, delivered_event

import partq


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("log")
    ap.add_argument("--queue", default="q")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--names", default="drain")
    ap.add_argument("--dead", default="")
    args = ap.parse_args(argv)
    log = Log(args.log)
    t0 = time.monotonic()
    broker = partq.Broker.open(args.data)
    opened = time.monotonic() - t0
    try:
        config = broker.queue_config(args.queue)
    except partq.QueueNotFound:   # the crash came before the queue was created: nothing to drain
        log.write({"op": "opened", "seconds": opened, "partitions": None, "scaling_status": None,
                   "state_n": None, "no_queue": True})
        log.write({"op": "drained", "open_seconds": opened, "partitions": None})
        broker.close()
        return 0
    with broker.store.read() as r:
        blob = r.state(config.qid)
    state_n = msgpack.unpackb(blob, raw=False)["core"]["n"] if blob else None
    log.write({"op": "opened", "seconds": opened, "partitions": config.partitions,
               "scaling_status": config.scaling_status, "state_n": state_n})
    deadline = time.monotonic() + args.timeout
    flows = []
    for name in args.names.split(","):
        while True:
            try:
                flows.append(broker.bind(args.queue, name=name))
                break
            except partq.DeliveryLocked:
                if time.monotonic() > deadline:
                    print("drain: delivery stayed locked", file=sys.stderr)
                    return 3
                # the killed owner's lock is released when the OS reaps it: try again (a hand
                # loop, not helpers.wait_until: this script runs in the spawner's children, where
                # tests/ is not importable, and reports the timeout as exit status 3)
                time.sleep(0.05)
    log.write({"op": "bound"})
    while True:
        got = 0
        for flow in flows:
            t_receive, w_receive = time.monotonic(), time.time()
            msgs = flow.receive(500, timeout=0.1 / len(flows))
            if msgs:
                got += len(msgs)
                log.write(*({**delivered_event(m), "t0": t_receive, "w0": w_receive}
                            for m in msgs))
                t_ack = time.monotonic()
                flow.ack_many(msgs)
                log.write(*({"op": "acked", "id": delivered_event(m)["id"], "t0": t_ack}
                            for m in msgs))
        if got:
            continue
        status = broker.queue_status(args.queue)
        if status.depth == 0 and all(f.unacked == 0 for f in flows):
            log.write({"op": "drained", "open_seconds": opened, "partitions": status.partition_count,
                       "scaling_status": status.scaling_status})
            code = drain_dead(broker, log, args.dead, max(deadline, time.monotonic() + 10)) \
                if args.dead else 0
            broker.close()
            return code
        if time.monotonic() > deadline:
            print("drain: queue did not empty: " + json.dumps(
                [(p.partition, p.status, p.depth, p.flow_name, p.error) for p in status.partitions]),
                file=sys.stderr)
            return 3


def dead_event(m) -> dict:
    ev = delivered_event(m)
    h = m.headers or {}
    return {"op": "dead", "id": ev["id"], "key": m.key, "pkey": ev["pkey"],
            **{k: h.get(k) for k in ("dead_reason", "origin_queue", "origin_partition",
                                      "origin_seq", "delivery_count")},
            "dq_partition": m.partition, "dq_seq": m.seq, "died_wall": m.publish_time_ns / 1e9,
            "wall": time.time()}


def drain_dead(broker, log: Log, queue: str, deadline: float) -> int:
    """Receive and ack the dead message queue until it is empty, logging each message."""
    flow = broker.bind(queue, name="drain-dead")
    n = 0
    while True:
        msgs = flow.receive(500, timeout=0.05)
        if msgs:
            n += len(msgs)
            log.write(*(dead_event(m) for m in msgs))
            flow.ack_many(msgs)
            continue
        if broker.queue_status(queue).depth == 0 and flow.unacked == 0:
            log.write({"op": "dead_drained", "count": n})
            return 0
        if time.monotonic() > deadline:
            print(f"drain: dead message queue {queue!r} did not empty", file=sys.stderr)
            return 3


if __name__ == "__main__":
    sys.exit(main())
