"""Counts of what this process's delivery did since the store was opened here: messages handed
to flows (redeliveries among them) and nacks, per queue, and the durations of the rebalances and
handoffs it carried out. The metrics read them (``partq.metrics``); they are kept whether or not
metrics are exposed, so they must stay cheap: one uncontended lock and two dict updates per
receive that returned messages, and a sum of the redelivered flags (about 1% of what a
receive and ack cost per message).

Counts that must survive a restart are not kept here: published, acked and discarded messages,
rebalances and handoffs come from the store (``partq.metrics.durable``).

Thread-safety: every method may be called from any thread.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from operator import itemgetter

from partq.message import Message

# observers get (what, queue, seconds): what is "rebalance" or "handoff"
Observer = Callable[[str, str, float], None]
_REDELIVERED = itemgetter(Message._fields.index("redelivered"))   # a C loop: ~25 ns a message


class Tally:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._delivered: dict[str, int] = {}
        self._redelivered: dict[str, int] = {}
        self._nacked: dict[str, int] = {}
        self._observers: list[Observer] = []

    def delivered(self, queue: str, msgs: Sequence[Message]) -> None:
        """``msgs`` were handed to a flow of ``queue`` (a receive returned them)."""
        again = sum(map(_REDELIVERED, msgs))
        with self._lock:
            self._delivered[queue] = self._delivered.get(queue, 0) + len(msgs)
            if again:
                self._redelivered[queue] = self._redelivered.get(queue, 0) + again

    def nacked(self, queue: str, n: int = 1) -> None:
        with self._lock:
            self._nacked[queue] = self._nacked.get(queue, 0) + n

    def counts(self) -> dict[str, dict[str, int]]:
        """``{"delivered": {queue: n}, "redelivered": {...}, "nacked": {...}}``, copies."""
        with self._lock:
            return {"delivered": dict(self._delivered), "redelivered": dict(self._redelivered),
                    "nacked": dict(self._nacked)}

    # ------------------------------------------------------------------ durations
    def add_observer(self, fn: Observer) -> None:
        with self._lock:
            self._observers = [*self._observers, fn]

    def remove_observer(self, fn: Observer) -> None:
        with self._lock:
            self._observers = [o for o in self._observers if o is not fn]

    def observe(self, what: str, queue: str, seconds: float) -> None:
        """A rebalance or handoff of ``queue`` ended after ``seconds`` (by the broker's clock)."""
        for fn in self._observers:
            fn(what, queue, seconds)
