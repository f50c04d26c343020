"""The one thread of a ``partq serve`` that pushes to every connection's flows what their acks
did not already send: a flow's first messages, messages published later, nacks, partition
changes, events, and deliveries a slow reader held back.

A connection's own thread serves its flow right after each batch of acks (``Pump.ack``), which
in a steady stream of receive and ack is all the pushing there is. This thread wakes on what
else may make a message deliverable (a commit that appended, a change of delivery state, a
bind, a nack, a connection that read what it was sent) and then looks at every flow in turn;
a flow that holds all the unacked messages it may costs it a check, not a read. One thread for
all connections, not one per connection: every ack wakes the sleepers of the process, and with
N connections N threads woke for each, each to find nothing.
"""
from __future__ import annotations

import logging
import threading

from partq.remote.pump import Pump

log = logging.getLogger("partq.server")

IDLE_WAIT = 1.0           # seconds the thread sleeps at most when nothing changed


class Pumps:
    """The pumps of a server's connections, served by one thread (started with the first)."""

    def __init__(self, dispatcher) -> None:
        self._dispatcher = dispatcher
        self._lock = threading.Lock()
        self._pumps: list[Pump] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def add(self, pump: Pump) -> None:
        """Serve ``pump`` from now on."""
        with self._lock:
            self._pumps.append(pump)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="partq-serve-pump",
                                                daemon=True)
                self._thread.start()
        self._dispatcher.notify()

    def remove(self, pump: Pump) -> None:
        """Serve ``pump`` no more (its flow was unbound or its connection ended). A serve of it
        under way finishes first (``Pump.detach`` waits for it)."""
        with self._lock:
            if pump in self._pumps:
                self._pumps.remove(pump)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread = self._thread
        self._dispatcher.notify()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        dispatcher = self._dispatcher
        while True:
            token = dispatcher.change_token()   # before the list: a pump added after it wakes
            with self._lock:                    # the wait below
                if self._closed:
                    return
                pumps = list(self._pumps)
            busy = False
            for pump in pumps:
                busy = self._serve(pump) or busy
            if not busy:
                dispatcher.wait_for_change(token, IDLE_WAIT)

    def _serve(self, pump: Pump) -> bool:
        """One look at ``pump``'s flow; True when it pushed messages (there may be more)."""
        try:
            return pump.serve()
        except OSError:
            self.remove(pump)       # its connection is closing, which unbinds its flow
        except Exception:  # a bug: this connection ends (its client reconnects), visibly
            log.exception("pushing to flow %s failed; closing its connection",
                          pump.flow.flow_id)
            self.remove(pump)
            pump.close_connection()
        return False
