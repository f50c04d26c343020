"""A primary that publishes COUNT messages with everything a standby must copy: batches and single
publishes, keyed and unkeyed, acks with gaps from named consumer flows, a second queue created
mid-run, scaled up and down again, a third queue created and deleted, checkpointed batches (a
replicated meta key), a config update, and a third consumer that triggers a rebalance (state
blobs with assignments and handoffs).

    python proc_primary_bulk.py DIR LISTEN COUNT WORKDIR SEED

WORKDIR receives ``log`` (``idx queue partition seq`` per message, written after the publish
returned), ``progress.json`` (messages published so far), ``status.json`` (the primary's
``replication_status()`` every 50 ms) and, once everything is published and the queue has
settled (no consumer runs, rebalancing Ready), ``done.json``. Then it idles, still serving the
standby, until SIGTERM; a commit it makes after ``done.json`` that the standby must copy is
written to ``late.json`` (its LSN and what it changed: kind and queue or key of each change).
"""
from __future__ import annotations

import json
import logging
import os
import random
import signal
import sys
import threading
import time

from helpers import wait_until
from repl_helpers import key, payload, write_json

import partq
from partq.storage.writer import decode_change

BATCH = 500
SINGLES = 25


def watch_late_writes(broker, head: int, path: str) -> None:
    """From now on, write what each replicated commit past LSN ``head`` changed to ``path``."""
    seen = [head]

    def look(_appended: int) -> None:
        with broker.store.read() as r:
            entries = r.changes_after(seen[0], 100, 1 << 20)
        if not entries:
            return
        late = []
        for raw in entries:
            lsn, _t, _m, changes = decode_change(raw)
            seen[0] = max(seen[0], lsn)
            late.append({"lsn": lsn, "changes": [[c[0], *(repr(x)[:40] for x in c[1:3])]
                                                 for c in changes]})
        old = []
        if os.path.exists(path):
            with open(path) as f:
                old = json.load(f)
        write_json(path, old + late)
    broker.store.on_commit(look)


def main() -> int:
    path, listen, workdir = sys.argv[1], sys.argv[2], sys.argv[4]
    count, seed = int(sys.argv[3]), int(sys.argv[5])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    rng = random.Random(seed)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker = partq.Broker.open(path, replication_listen=listen, seed=seed)
    broker.create_queue("orders", partitions=8, rebalance_delay=1.0, max_handoff_time=1.0)
    flows = [broker.bind("orders", name="c1"), broker.bind("orders", name="c2")]
    consuming = threading.Event()
    consuming.set()
    acked = [0]

    def consume() -> None:
        held: dict[int, list] = {}
        while consuming.is_set():
            for i, flow in enumerate(list(flows)):
                msgs = flow.receive(200, timeout=0.01)
                # ack all but every 7th now; those a round later (acks above the floor first)
                now = [m for m in msgs if m.seq % 7]
                late, held[i] = held.get(i, []), [m for m in msgs if not m.seq % 7]
                if now or late:
                    flow.ack_many(now + late)
                    acked[0] += len(now) + len(late)

    def report() -> None:
        while True:
            write_json(os.path.join(workdir, "status.json"),
                       dict(broker.replication_status().as_dict(), time=time.time()))
            if stop.wait(0.05):     # the report pace
                return

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    threading.Thread(target=report, daemon=True).start()

    log = open(os.path.join(workdir, "log"), "w")
    idx, it = 0, 0
    milestones = {0.2: "create_tmp", 0.3: "create", 0.45: "update", 0.5: "delete_tmp",
                  0.6: "scale", 0.7: "bind", 0.8: "scale_down"}
    events = False
    while idx < count:
        it += 1
        frac = idx / count
        for at in sorted(milestones):
            if frac >= at:
                step = milestones.pop(at)
                if step == "create":
                    broker.create_queue("events", partitions=2)
                    events = True
                elif step == "update":
                    broker.update_queue("orders", max_handoff_time=1.5)
                elif step == "scale":
                    broker.scale("events", 3)
                elif step == "bind":
                    flows.append(broker.bind("orders", name="c3"))
                elif step == "scale_down":
                    broker.scale("events", 2)
                elif step == "create_tmp":
                    broker.create_queue("tmp", partitions=2)
                    broker.publish_many("tmp", [(payload(i), key(i)) for i in range(100)])
                elif step == "delete_tmp":
                    broker.delete_queue("tmp")
        lines = []
        if it % 10 == 0:
            for _ in range(min(SINGLES, count - idx)):
                r = broker.publish("orders", payload(idx), key=key(idx))
                lines.append(f"{idx} orders {r.partition} {r.seq}\n")
                idx += 1
        else:
            n = min(BATCH, count - idx)
            if events and rng.random() < 0.3:
                n = min(n, 20)
                results = broker.publish_many("events", [(payload(i), key(i)) for i in range(idx, idx + n)])
                queue = "events"
            else:
                items = [(payload(i), key(i)) for i in range(idx, idx + n)]
                if it % 7 == 0:   # an idempotent copy's batch: its position is a replicated meta key
                    results = broker.publish_many("orders", items, checkpoint=("copy", it))
                else:
                    results = broker.publish_many("orders", items)
                queue = "orders"
            lines += [f"{idx + i} {queue} {r.partition} {r.seq}\n" for i, r in enumerate(results)]
            idx += n
        log.write("".join(lines))
        log.flush()
        write_json(os.path.join(workdir, "progress.json"), {"published": idx, "acked": acked[0]})
    log.close()

    # settle: stop consuming (flows stay bound), let any handoff finish, so nothing writes again
    consuming.clear()
    consumer.join()
    broker.dispatcher.settle()   # delivery counts made exact now, as close would after the standby left
    last_head = [None]

    def settled() -> bool:
        """Every partition Ready, and no commit since the previous look (2 s ago: longer than
        the queues' max_handoff_time of 1.5 s, so no handoff timer is still due)."""
        st = broker.queue_status("orders")
        head = broker.replication_status().head_lsn
        quiet, last_head[0] = head == last_head[0], head
        return (quiet and st.rebalance_status == "Ready"
                and all(p.status == "Ready" for p in st.partitions))
    wait_until(settled, 20, "the queue to settle, every partition Ready and no more commits",
               interval=2.0)
    st = broker.replication_status()
    watch_late_writes(broker, st.head_lsn, os.path.join(workdir, "late.json"))
    write_json(os.path.join(workdir, "done.json"),
               {"published": idx, "acked": acked[0], "head_lsn": st.head_lsn,
                "rebalance_status": broker.queue_status("orders").rebalance_status,
                "partitions": {f.name: sorted(f.partitions) for f in flows}})
    stop.wait()
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
