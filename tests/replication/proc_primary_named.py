"""A primary with named consumers and a hinted one, for the promote tests.

    python proc_primary_named.py DIR LISTEN WORKDIR

Queue "orders" (8 partitions). Flows "a", "b", "c" (named) and one unnamed flow bind; once the
assignment is balanced (2 partitions each) the rebalance delay is raised to 20 s, so that
consumers that come back to a promoted standby within it keep their partitions. 800 messages
are published; each flow receives what it can and acks half of it (the other half stays
delivered and unacked). When a standby has applied everything, WORKDIR/ready.json gets the
assignment ({"a": [...], ..., "hint": [...]}), the head LSN and each partition's head and ack
floor. Then it idles until killed.
"""
from __future__ import annotations

import logging
import os
import sys
import time

from helpers import wait_until
from repl_helpers import key, payload, write_json

import partq


def main() -> int:
    path, listen, workdir = sys.argv[1:4]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    broker = partq.Broker.open(path, replication_listen=listen)
    broker.create_queue("orders", partitions=8, rebalance_delay=0.2, max_handoff_time=0.5)
    flows = {name: broker.bind("orders", name=name) for name in ("a", "b", "c")}
    flows["hint"] = broker.bind("orders")
    def balanced() -> bool:
        if (broker.queue_status("orders").rebalance_status == "Ready"
                and all(len(f.partitions) == 2 for f in flows.values())):
            return True
        for f in flows.values():
            f.ack_many(f.receive(100))
        return False
    wait_until(balanced, 30, "a balanced assignment (2 partitions per flow)")
    broker.update_queue("orders", rebalance_delay=20.0)
    broker.publish_many("orders", [(payload(i), key(i)) for i in range(800)])
    for f in flows.values():
        got = f.receive(1000)
        f.ack_many(got[::2])
    def caught_up():
        st = broker.replication_status()
        return st if st.connected and st.applied_lsn >= st.head_lsn else None
    st = wait_until(caught_up, 60, "a standby to apply everything", interval=0.01)
    status = broker.queue_status("orders")
    write_json(os.path.join(workdir, "ready.json"), {
        "assignment": {name: sorted(f.partitions) for name, f in flows.items()},
        "head_lsn": st.head_lsn,
        "heads": [p.next_seq for p in status.partitions],
        "floors": [p.ack_floor for p in status.partitions],
        "depths": [p.depth for p in status.partitions],
    })
    while True:
        time.sleep(1)       # idle, serving the standby, until the test SIGKILLs this primary


if __name__ == "__main__":
    sys.exit(main())
