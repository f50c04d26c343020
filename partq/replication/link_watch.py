"""Replication links as a process sees them, logged for an operator: a link coming up or going
down, and lag alarms (logger ``partq.replication``). The rooms log their own events; this one
looks at the whole status every ``WATCH_INTERVAL`` seconds."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from partq.errors import PartqError

repl_log = logging.getLogger("partq.replication")

LAG_ALARM_SECONDS = 30.0     # a standby this far behind (or unconfirmed this long) raises an alarm
WATCH_INTERVAL = 1.0         # seconds between looks at the replication status


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
