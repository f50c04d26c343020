"""A primary that needs a replication token, for the command-line promotion tests.

    python proc_primary_token.py DIR LISTEN TOKEN_FILE WORKDIR

Serves DR-standbys on LISTEN with the token of TOKEN_FILE. Creates queue "orders" (2
partitions, 20 messages) unless it exists; once a standby is linked it publishes 5 more (they
get LSNs: a slot exists). WORKDIR/status.json holds, rewritten every 50 ms, the replication
status (connected, head and applied LSN, superseded). Runs until SIGTERM (closes cleanly) or
SIGKILL.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

from repl_helpers import write_json

import partq


def main() -> int:
    path, listen, token_file, workdir = sys.argv[1:5]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    broker = partq.Broker.open(path, replication_listen=listen, replication_token_file=token_file)
    if not any(q.name == "orders" for q in broker.queues()):
        broker.create_queue("orders", partitions=2)
        broker.publish_many("orders", [(b"m%d" % i, f"k{i}") for i in range(20)])
    published_after_link = False
    while not stop.wait(0.05):
        st = broker.replication_status()
        if st.connected and not published_after_link and not st.superseded:
            broker.publish_many("orders", [(b"late%d" % i, f"k{i}") for i in range(5)])
            published_after_link = True
        write_json(os.path.join(workdir, "status.json"), {
            "address": broker.replication_address, "connected": st.connected,
            "head_lsn": st.head_lsn, "applied_lsn": st.applied_lsn,
            "superseded": st.superseded, "published_after_link": published_after_link})
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
