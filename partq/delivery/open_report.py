"""The report of opening a directory, one log line for an operator: queues, messages stored,
what recovery will redeliver (marked) and the stale reader slots cleared. Logger
``partq.broker``."""
from __future__ import annotations

import logging

from partq.errors import PartqError

log = logging.getLogger("partq.broker")


def redeliveries(ack, head: int) -> int:
    """Unacked messages at or below the durable delivered mark of one partition: they come
    back marked redelivered (the mark runs ahead of real deliveries, so this is an upper
    bound)."""
    top = min(ack.delivered_mark, head - 1)
    if top < ack.floor:
        return 0
    return top - ack.floor + 1 - sum(1 for s in ack.above if s <= top)


def log_open_report(broker) -> None:
    """One line at open: queues, messages stored, what will be redelivered, stale readers. A
    queue whose state cannot be read is named in a warning; opening goes on (the error reaches
    whoever uses that queue)."""
    report = broker.open_report
    if report["created"]:
        log.info("created a new partq store in %s", broker.path)
        return
    stored = again = 0
    damaged: list[str] = []
    with broker.store.read() as r:
        try:
            configs = r.queues()
        except PartqError as exc:
            log.warning("opened %s: its queues cannot be listed: %s", broker.path, exc)
            return
        for name, config in configs.items():
            qid = config["qid"]
            try:
                for p in r.partitions(qid):
                    ack, head = r.ack_state(qid, p), r.head(qid, p)
                    stored += ack.backlog(head)
                    again += redeliveries(ack, head)
            except PartqError as exc:
                damaged.append(f"{name!r} ({exc})")
    log.info("opened %s: %d queue(s), %d message(s) unacked, up to %d of them delivered before "
             "and redelivered (marked), %d stale reader slot(s) cleared", broker.path,
             len(configs), stored, again, report["stale_readers_cleared"])
    if damaged:
        log.warning("opened %s: the state of queue(s) %s cannot be read; run `partq verify`",
                    broker.path, "; ".join(damaged))
