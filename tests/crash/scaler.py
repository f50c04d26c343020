"""Crash-test scaler: ``scale(queue, TO)`` once, logged for the checker.

    python scaler.py DATA_DIR LOG --to N [--queue q] [--online]

Logs ``scale_begin`` (with the partition count it saw, and ``online``) before and ``scale_end``
after. Run again after a kill, it first finishes the interrupted scaling (``scale`` does that),
then scales to N if the count is not N already. ``--online`` (rule `online-scaling`) first waits until an
earlier online scaling's cut-over has drained (a second one is refused until then); after ``DRAIN_WAIT``
seconds it logs ``scale_skipped`` and exits with ``SKIPPED``.
"""
from __future__ import annotations

import argparse
import sys
import time

from wlog import Log

import partq

DRAIN_WAIT = 60.0          # seconds an online scaling waits for the previous one to drain
SKIPPED = 3                # exit status: skipped (the harness counts it, starts no other)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("log")
    ap.add_argument("--to", type=int, required=True)
    ap.add_argument("--queue", default="q")
    ap.add_argument("--seed", type=int, default=0)      # accepted like every worker; unused
    ap.add_argument("--online", action="store_true")
    args = ap.parse_args(argv)
    log = Log(args.log)
    broker = partq.Broker.open(args.data)
    log.write({"op": "opened"})
    deadline = time.monotonic() + DRAIN_WAIT
    while args.online and broker.queue_status(args.queue).cutover is not None:
        if time.monotonic() > deadline:
            # consumers that publishers outpace (and the harness kills) may take minutes to
            # ack the old partitions to the cut-over: this scaling is skipped, not failed
            log.write({"op": "scale_skipped", "reason": "the previous online scaling is still "
                                                        "draining"})
            broker.close()
            return SKIPPED
        time.sleep(0.02)          # consumers are acking its old partitions
    config = broker.queue_config(args.queue)
    frm = config.scaling_from if config.scaling_status != "Ready" else config.partitions
    log.write({"op": "scale_begin", "from": frm, "to": args.to, "online": args.online})
    final = broker.scale(args.queue, args.to, online=args.online)
    log.write({"op": "scale_end", "to": args.to, "partitions": final.partitions})
    broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
