"""A consumer process driven line by line that answers every partq error instead of dying, for
tests that need to see what a bind, a receive or an ack of another process raised (a bind while
the delivery owner is stopped, a takeover's fencing).

    python driven_proc.py DATA QUEUE

Reads one JSON command per line on stdin, answers one JSON line on stdout:

    {"op": "bind", "name": N}                  -> {"ok": true, "partitions": [...]}
    {"op": "partitions"}                       -> {"ok": true, "partitions": [...]}
    {"op": "receive", "max": N, "timeout": T}  -> {"ok": true, "messages": [[p, seq], ...]}
    {"op": "ack", "messages": [[p, seq], ...]} -> {"ok": true}
    {"op": "exit"}                             -> exits 0

A partq error answers {"ok": false, "error": its class name, "message": its text}. Messages
acked are those this process received (kept by partition and seq).
"""
from __future__ import annotations

import faulthandler
import json
import signal
import sys

import partq


def main(data: str, queue: str) -> int:
    faulthandler.register(signal.SIGUSR1)
    broker = partq.Broker.open(data)
    flow = None
    received: dict[tuple[int, int], partq.Message] = {}

    def answer(**doc) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "exit":
            break
        try:
            if op == "bind":
                flow = broker.bind(queue, name=cmd["name"])
                answer(ok=True, partitions=sorted(flow.partitions))
            elif op == "partitions":
                answer(ok=True, partitions=sorted(flow.partitions))
            elif op == "receive":
                msgs = flow.receive(cmd["max"], timeout=cmd.get("timeout", 0.0))
                received.update({(m.partition, m.seq): m for m in msgs})
                answer(ok=True, messages=[[m.partition, m.seq] for m in msgs])
            elif op == "ack":
                flow.ack_many([received[tuple(m)] for m in cmd["messages"]])
                answer(ok=True)
        except partq.PartqError as exc:
            answer(ok=False, error=type(exc).__name__, message=str(exc))
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
