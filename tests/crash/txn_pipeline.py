"""A consume-transform-publish pipeline for ``test_transaction_crashes``: binds ``in`` (a
directory, or ``partq serve`` at an address), and for each batch received publishes ``o-`` +
payload to ``out`` and acks the batch in one transaction. Exits once ``in`` gave nothing for
``idle`` seconds. Killed at random, or by ``PARTQ_CRASH_AT`` inside a commit.

    python txn_pipeline.py dir DIR IDLE | python txn_pipeline.py serve HOST:PORT TOKEN IDLE
"""
from __future__ import annotations

import sys
import time

import partq


def retried(fn):
    """``fn()``, again while the server is away (killed: it comes back)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return fn()
        except partq.ServerUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> None:
    print("bound", flush=True)          # (started: the harness may kill it from now on)
    if sys.argv[1] == "serve":
        source = retried(lambda: partq.connect(sys.argv[2], token=sys.argv[3],
                                               reconnect_timeout=60))
    else:
        source = partq.Broker.open(sys.argv[2])
    idle = float(sys.argv[-1])
    flow = retried(lambda: source.bind("in", name="pipeline"))
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < idle:
        try:
            msgs = flow.receive(10, timeout=0.2)
            if not msgs:
                continue
            quiet_since = time.monotonic()
            with source.transaction() as tx:
                for m in msgs:
                    tx.publish("out", b"o-" + m.payload, key=m.key)
                    tx.ack(m)
        except partq.FlowFenced:
            pass                        # not committed: they come again
        except partq.ServerUnavailable:
            pass                        # the client gave up on an answer: it comes again
        except partq.FlowClosed:
            flow = retried(lambda: source.bind("in", name="pipeline"))
    print("done", flush=True)


if __name__ == "__main__":
    main()
