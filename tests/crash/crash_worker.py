"""The fixed workload of the crash-point sweep (``test_crash_points``), run under PARTQ_CRASH_AT.

    PARTQ_CRASH_AT=point:N python crash_worker.py DATA_DIR LOG

One process publishes and consumes (it is the delivery owner), with a ``ManualClock`` and a
seeded partitioner for unkeyed messages, so that the run is deterministic: no ticker thread, one
commit per call, the same placements, so the N-th pass of a point is the same moment in every
run. The workload passes every crash point at least 20 times:

1. a queue of 3 partitions; singles and batches with keys spread over the partitions (mid_batch
   once per multi-partition batch);
2. flow "a" consumes in small receives, acks (at_ack, during_truncation), nacks one batch and
   holds another that it acks late (its partitions have not moved: the acks count);
3. scale 3 -> 9 online (rule `online-scaling`) with messages delivered and unacked (during_scaling per
   partition created, after_cutover), more publishes; keys that moved wait for the unacked ones;
4. four cycles of: flow "b" binds, the holddown ends, partitions are handed off from "a" (one
   handoff waits for an ack, the others time out: during_handoff on every reassignment), both
   consume, "a" acks late what it kept (acks of partitions that moved are fenced, rule `fencing`), "b"
   unbinds and its partitions come back to "a" after the delay;
5. scale 9 -> 4 (deletes partitions 8..4 and their messages, logged for the checker), 4 -> 9,
   9 -> 3 (during_scaling per partition created or deleted), publishes between them, all
   consumed and acked. Every scaling is online, so the checker checks per-key order across
   partitions too.

It logs like the other workers (``checker``), and at the end ``{"op": "done", "passes": ...}``
with how often each crash point was passed (counted only when PARTQ_CRASH_AT is set).
"""
from __future__ import annotations

import sys

from wlog import Log, delivered_event, make_payload

import partq
from partq.storage import crashpoints

KEYS = [f"key-{i}" for i in range(9)] + [None]


def main(data: str, log_path: str) -> int:
    log = Log(log_path)
    clock = partq.ManualClock(1000.0)
    b = partq.Broker.open(data, clock=clock, seed=1)      # unkeyed placement is repeatable
    log.write({"op": "opened"})
    b.create_queue("q", partitions=3, rebalance_delay=1.0, max_handoff_time=0.5)
    n = 0

    def ids(count):
        nonlocal n
        out = []
        for _ in range(count):
            key = KEYS[n % len(KEYS)]
            out.append((f"w.{n}", key, make_payload(f"w.{n}", key, n % 7)))
            n += 1
        return out

    def single():
        (mid, key, payload), = ids(1)
        log.write({"op": "attempt", "id": mid, "key": key})
        r = b.publish("q", payload, key=key)
        log.write({"op": "published", "id": mid, "partition": r.partition, "seq": r.seq})

    def batch(size):
        items = ids(size)
        log.write(*({"op": "attempt", "id": mid, "key": key} for mid, key, _ in items))
        results = b.publish_many("q", [(payload, key) for _, key, payload in items])
        log.write(*({"op": "published", "id": mid, "partition": r.partition, "seq": r.seq}
                    for (mid, _, _), r in zip(items, results, strict=True)))

    def receive(flow, k=4):
        msgs = flow.receive(k)
        log.write(*(delivered_event(m) for m in msgs))
        return msgs

    def ack(flow, msgs):
        if msgs:
            flow.ack_many(msgs)
            log.write(*({"op": "acked", "id": delivered_event(m)["id"]} for m in msgs))

    def late_ack(flow, msgs):
        """Acks of messages whose partition moved away are fenced (rule `fencing`): ack the others."""
        try:
            ack(flow, msgs)
        except partq.FlowFenced as exc:
            fenced = {(m.partition, m.seq) for m in exc.messages}
            assert all(m.partition not in flow.partitions for m in exc.messages)
            ack(flow, [m for m in msgs if (m.partition, m.seq) not in fenced])

    def consume(flow, rounds=100):
        for _ in range(rounds):
            msgs = receive(flow)
            if not msgs:
                return
            ack(flow, msgs)

    def scale(to):
        log.write({"op": "scale_begin", "from": b.queue_config("q").partitions, "to": to,
                   "online": True})
        b.scale("q", to, online=True)
        log.write({"op": "scale_end", "to": to})

    # 1. publish
    for i in range(8):
        single()
        batch(4 + i % 3)
    # 2. consume with a nack and a late ack
    a = b.bind("q", name="a")
    log.write({"op": "bound"})
    first = receive(a, 6)
    ack(a, first[:2])
    if len(first) > 2:
        a.nack(first[2])
    held = receive(a, 3)
    consume(a, rounds=6)
    ack(a, held)
    consume(a)
    # 3. scale up online with messages unacked, publish more: moved keys wait for them
    for _ in range(3):
        single()
        batch(4)
    unacked = receive(a, 10)
    scale(9)
    for _ in range(6):
        single()
        batch(5)
    consume(a, rounds=3)              # what is not held
    ack(a, unacked)                   # the old partitions drain: the held messages flow
    consume(a)
    # 4. handoffs between a and b
    for _ in range(4):
        for _ in range(3):
            single()
            batch(4)
        kept = receive(a, 8)          # a holds these while b binds: handoffs wait for them
        fb = b.bind("q", name="b")
        clock.advance(1.1)            # the holddown ends: some partitions move to b
        b.tick()
        ack(a, [m for m in kept if m.partition == max(m.partition for m in kept)])
        clock.advance(0.6)            # the other handoffs time out: redelivered to b
        b.tick()
        consume(fb, rounds=5)
        consume(a, rounds=5)
        late_ack(a, kept)             # late acks of handed-off messages are fenced
        fb.unbind()
        clock.advance(1.1)            # b's partitions come back to a after the delay
        b.tick()
        consume(a)
    # 5. scale down and up again, last publishes, drain
    for to in (4, 9, 3):
        scale(to)
        for _ in range(2):
            batch(3)
            single()
        consume(a)
    log.write({"op": "done", "passes": crashpoints.passes()})
    b.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
