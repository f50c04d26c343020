"""A consumer process driven line by line, for deterministic tests of flows served by another
process's delivery owner (rules `peer-flows` and `fencing`).

    python scripted_proc.py DATA QUEUE

Reads one JSON command per line on stdin, answers one JSON line on stdout:

    {"op": "bind", "name": N}                 -> {"ok": true, "partitions": [...]}
    {"op": "receive", "max": N}               -> {"ok": true, "messages": [[p, seq], ...]}
    {"op": "partitions"}                      -> {"ok": true, "partitions": [...]}
    {"op": "ack", "messages": [[p, seq], ...]} -> {"ok": true} or
                                                 {"ok": false, "error": "FlowFenced",
                                                  "messages": [[p, seq], ...]}
    {"op": "exit"}                            -> exits 0

Messages acked are those this process received (kept by partition and seq).
"""
from __future__ import annotations

import json
import sys

import partq


def main(data: str, queue: str) -> int:
    broker = partq.Broker.open(data)
    flow = None
    received: dict[tuple[int, int], partq.Message] = {}

    def answer(**doc) -> None:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
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
            try:
                flow.ack_many([received[tuple(m)] for m in cmd["messages"]])
                answer(ok=True)
            except partq.FlowFenced as exc:
                answer(ok=False, error="FlowFenced",
                       messages=[[m.partition, m.seq] for m in exc.messages])
        elif op == "exit":
            break
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
