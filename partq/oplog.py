"""Log lines for an operator that belong to no one room: the report of opening a directory
(what recovery found), and the replication links as a process sees them (a link coming up or
going down, lag alarms). The rooms log their own events (``partq.delivery``: binds, rebalances,
handoffs; ``partq.server``: clients; ``partq.replication``: refusals and broken links); this
module adds what is only visible by looking at the whole.

Loggers: ``partq.broker`` for the open report, ``partq.replication`` for links and lag.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from partq.errors import PartqError

log = logging.getLogger("partq.broker")
repl_log = logging.getLogger("partq.replication")

LAG_ALARM_SECONDS = 30.0     # a standby this far behind (or unconfirmed this long) raises an alarm
WATCH_INTERVAL = 1.0         # seconds between looks at the replication status


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


def scaling_log(queue: str, prefix: str, progress: Callable[[str], None] | None = None):
    """A scaling ``progress`` callback that logs each step (and calls ``progress`` too)."""
    def step(text: str) -> None:
        log.info("queue %r scaling: %s%s", queue, prefix, text)
        if progress is not None:
            progress(text)
    return step


class LinkWatch:
    """Looks at ``status()`` (``Broker.replication_status``) every ``WATCH_INTERVAL`` seconds
    in a thread of its own and logs: a standby link that came up or went down, a lag alarm when
    a link falls ``LAG_ALARM_SECONDS`` behind (warning), and its end once the lag is under half
    of that again (info)."""

    def __init__(self, status: Callable) -> None:
        self._status = status
        self._stop = threading.Event()
        self._up: dict[str, bool] = {}
        self._alarmed: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="partq-link-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            try:
                self.check()
            except PartqError as exc:        # the store closing under us, a damaged slot
                if self._stop.is_set():
                    return
                repl_log.debug("replication status unavailable: %s", exc)

    def check(self) -> None:
        st = self._status()
        if st.role == "primary":
            links = {f"standby {link.standby_id}": (link.connected, link.lag_seconds,
                                                    link.lag_messages, link.address)
                     for link in st.standbys}
        else:
            links = {f"primary {st.primary}": (st.connected, st.lag_seconds, st.lag_messages,
                                               st.primary)}
        for name, (up, lag_s, lag_msgs, where) in links.items():
            if up != self._up.get(name, False):
                if up:
                    repl_log.info("replication link to %s is up (%s)", name, where or "?")
                elif name in self._up:
                    repl_log.info("replication link to %s is down", name)
            self._up[name] = up
            if lag_s >= LAG_ALARM_SECONDS and name not in self._alarmed:
                self._alarmed.add(name)
                repl_log.warning("replication lag alarm: %s is %.1f s (%d messages) behind%s",
                                 name, lag_s, lag_msgs, "" if up else ", and not connected")
            elif name in self._alarmed and lag_s < LAG_ALARM_SECONDS / 2:
                self._alarmed.discard(name)
                repl_log.info("replication lag of %s is back to %.1f s (%d messages)", name,
                              lag_s, lag_msgs)

    def close(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
