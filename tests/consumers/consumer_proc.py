"""A consumer process for the multi-process tests: binds a flow (served by whichever process owns
delivery), receives, acks, and logs everything as JSON lines, each line fsynced before it acts.

    python consumer_proc.py DATA QUEUE NAME LOG [--hold N] [--rebind]

Events: ``bound`` (pid), ``parts`` (its partition set, whenever it changed), ``delivered``
(partition, seq, key, payload, redelivered; before it acks), ``acked`` (after ack_many returned),
``fenced`` (partition/seq refused with FlowFenced), ``closed``. With ``--hold N`` it keeps the
first N messages it receives unacked until the file LOG.go exists, then acks them (logging
``acked`` or ``fenced``), and goes on. A flow closed under it (``FlowClosed`` from a receive or
an ack) ends it, or with ``--rebind`` is bound again under the same name (what it held of the
closed flow is dropped: it was not acked). SIGTERM ends it cleanly.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time

import partq


class Log:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def write(self, **event) -> None:
        os.write(self._fd, (json.dumps({**event, "t": time.monotonic()}) + "\n").encode())
        os.fsync(self._fd)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("queue")
    ap.add_argument("name")
    ap.add_argument("log")
    ap.add_argument("--hold", type=int, default=0)
    ap.add_argument("--rebind", action="store_true")
    args = ap.parse_args()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    faulthandler.register(signal.SIGUSR1)      # a test that times out asks for the stacks
    log = Log(args.log)
    broker = partq.Broker.open(args.data)
    flow = broker.bind(args.queue, name=args.name)
    log.write(op="bound", pid=os.getpid())
    parts = None
    held: list = []
    while not stop:
        if flow.partitions != parts:
            parts = flow.partitions
            log.write(op="parts", partitions=sorted(parts))
        try:
            msgs = flow.receive(50, timeout=0.1)
        except partq.FlowClosed as exc:
            log.write(op="closed", reason=str(exc))
            if not args.rebind:
                break
            flow, held, parts = broker.bind(args.queue, name=args.name), [], None
            log.write(op="bound", pid=os.getpid())
            continue
        for m in msgs:
            log.write(op="delivered", partition=m.partition, seq=m.seq, key=m.key,
                      payload=m.payload.decode(), redelivered=m.redelivered)
        if len(held) < args.hold:
            take = msgs[:args.hold - len(held)]
            held += take
            msgs = msgs[len(take):]
            if len(held) == args.hold:
                log.write(op="holding", count=len(held))
        if held and len(held) >= args.hold and os.path.exists(args.log + ".go"):
            msgs = held + msgs
            held, args.hold = [], 0
        if msgs:
            try:
                flow.ack_many(msgs)
            except partq.FlowFenced as exc:
                fenced = {(m.partition, m.seq) for m in exc.messages}
                log.write(op="fenced", messages=sorted(fenced))
                msgs = [m for m in msgs if (m.partition, m.seq) not in fenced]
                flow.ack_many(msgs)
            except partq.FlowClosed as exc:
                log.write(op="closed", reason=str(exc),
                          messages=sorted((m.partition, m.seq) for m in msgs))
                if not args.rebind:
                    break
                flow, held, parts = broker.bind(args.queue, name=args.name), [], None
                log.write(op="bound", pid=os.getpid())
                continue
            for m in msgs:
                log.write(op="acked", partition=m.partition, seq=m.seq)
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
