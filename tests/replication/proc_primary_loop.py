"""A primary that publishes until it is killed: THREADS publisher threads, each mixing single
publishes and small batches, keyed and unkeyed, into queue "q" (4 partitions).

    python proc_primary_loop.py DIR LISTEN MODE WORKDIR SEED THREADS FSYNC MAX_BATCH

MODE is the replication mode ("async" | "sync"). Publishing starts once a standby is connected and
has caught up (``ready.json``). Run again on the same DIR and WORKDIR (a restarted primary) it
reuses the queue and continues the log; THREADS=0 publishes nothing (it only serves). After each
publish (or batch) RETURNED, its messages are appended
to WORKDIR/log as ``idx queue partition seq time`` lines (flushed, and fsynced when FSYNC is 1),
then the count of returned messages goes up. Every ~20 ms WORKDIR/status.json is replaced with
that count, read BEFORE the primary's ``replication_status()`` taken right after it: so every
message committed after the status snapshot has a log index >= that count.
"""
from __future__ import annotations

import logging
import os
import random
import sys
import threading
import time

from helpers import wait_until
from repl_helpers import key, payload, read_log, write_json

import partq
from partq.replication import ReplicationTimeout


def main() -> int:
    path, listen, mode, workdir = sys.argv[1:5]
    seed, threads, fsync = int(sys.argv[5]), int(sys.argv[6]), sys.argv[7] == "1"
    max_batch = int(sys.argv[8])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    broker = partq.Broker.open(path, replication_listen=listen, replication_mode=mode,
                               sync_timeout=30.0, seed=seed)
    if not any(q.name == "q" for q in broker.queues()):   # a restarted primary has it
        broker.create_queue("q", partitions=4)
    deadline = time.monotonic() + 60
    wait_until(lambda: broker.replication_status().connected, 60, "a standby to connect",
               interval=0.01)
    broker.update_queue("q", max_handoff_time=2.0)   # a first LSN, after the standby's snapshot

    def caught_up() -> bool:
        st = broker.replication_status()
        return st.connected and st.applied_lsn >= st.head_lsn > 0
    wait_until(caught_up, max(0.0, deadline - time.monotonic()), "a standby to catch up",
               interval=0.01)

    log_path = os.path.join(workdir, "log")
    done = read_log(log_path)
    if os.path.exists(log_path):         # drop a line torn by the previous run's death
        with open(log_path, "r+b") as f:
            data = f.read()
            f.truncate(data.rfind(b"\n") + 1)
    log = open(log_path, "a")
    log_lock = threading.Lock()
    next_idx = [max((i for i, *_ in done), default=-1) + 1000]
    returned = [0]
    timeouts = [0]

    def publisher(n: int) -> None:
        rng = random.Random(seed * 100 + n)
        while True:
            size = 1 if rng.random() < 0.5 else rng.randint(2, max_batch)
            with log_lock:
                first = next_idx[0]
                next_idx[0] += size
            try:
                if size == 1:
                    results = [broker.publish("q", payload(first), key=key(first))]
                else:
                    results = broker.publish_many("q", [(payload(i), key(i))
                                                        for i in range(first, first + size)])
            except ReplicationTimeout:
                timeouts[0] += 1      # unknown outcome: not logged as returned
                continue
            now = time.time()
            with log_lock:
                log.write("".join(f"{first + i} q {r.partition} {r.seq} {now:.6f}\n"
                                  for i, r in enumerate(results)))
                log.flush()
                if fsync:
                    os.fsync(log.fileno())
                returned[0] += len(results)

    def report() -> None:
        while True:
            count = returned[0]            # first the count, then the status (see docstring)
            st = broker.replication_status()
            write_json(os.path.join(workdir, "status.json"),
                       dict(st.as_dict(), returned=count, timeouts=timeouts[0], time=time.time()))
            time.sleep(0.02)           # the report pace (see the docstring), not a wait

    write_json(os.path.join(workdir, "ready.json"), {"pid": os.getpid()})
    workers = [threading.Thread(target=publisher, args=(n,), daemon=True) for n in range(threads)]
    workers.append(threading.Thread(target=report, daemon=True))
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
