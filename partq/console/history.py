"""Rates and the last minutes of them, for the console's charts.

A rate comes from the store's own durable counts (``partq.metrics.durable``): messages published
(the heads of every partition the queue ever had) and acked (published - backlog - removed), so
it is right whichever process publishes or consumes. The console records those counts each time
it builds a view; a chart is the rates between successive samples. Nothing runs between views:
a console nobody looks at costs nothing.

Memory is bounded: per series about ``WINDOW / SPACING`` samples (a sample that came less
than ``SPACING`` after the one before it is replaced by the next), and series of queues not
seen for a ``WINDOW`` are dropped (``forget_others``).

Thread-safety: every method takes the history's lock (the console serves requests from threads).
"""
from __future__ import annotations

import threading
from collections import deque

WINDOW = 300.0      # seconds of history kept and charted
SPACING = 1.0       # seconds between kept samples, at least
TOTAL = ""          # the series of the whole store (no queue has an empty name)


class History:
    """Samples ``(t, published, acked)`` per series: a queue's name, or ``TOTAL``."""

    def __init__(self, window: float = WINDOW, spacing: float = SPACING) -> None:
        self.window, self.spacing = window, spacing
        self._series: dict[str, deque[tuple[float, int, int]]] = {}
        self._lock = threading.Lock()

    def record(self, name: str, t: float, published: int, acked: int) -> None:
        """Add a sample of series ``name`` at monotonic time ``t``."""
        with self._lock:
            samples = self._series.get(name)
            if samples is None:
                samples = self._series[name] = deque()
            if len(samples) >= 2 and samples[-1][0] - samples[-2][0] < self.spacing:
                # the newest sample was too close to the one before it: this one replaces it
                samples[-1] = (t, published, acked)
            else:
                samples.append((t, published, acked))
            while samples and t - samples[0][0] > self.window:
                samples.popleft()

    def rates(self, name: str) -> tuple[float, float]:
        """Published and acked per second between the last two samples kept that are at least
        ``spacing`` apart (0, 0 with fewer)."""
        with self._lock:
            samples = list(self._series.get(name, ()))[-3:]
        pairs = [(a, b) for a, b in zip(samples, samples[1:], strict=False)
                 if b[0] - a[0] >= self.spacing / 2]
        if not pairs:
            return 0.0, 0.0
        return _rate(*pairs[-1])

    def chart(self, name: str, now: float) -> dict:
        """The series as the page charts it: ``t`` (seconds before ``now``, negative), ``in``
        and ``out`` (messages per second between a sample and the one before it), and
        ``window`` (the seconds a chart spans)."""
        with self._lock:
            samples = list(self._series.get(name, ()))
        t, ins, outs = [], [], []
        for a, b in zip(samples, samples[1:], strict=False):
            rate_in, rate_out = _rate(a, b)
            t.append(round(b[0] - now, 2))
            ins.append(round(rate_in, 2))
            outs.append(round(rate_out, 2))
        return {"t": t, "in": ins, "out": outs, "window": self.window}

    def forget_others(self, keep: set[str], now: float) -> None:
        """Drop series not in ``keep`` whose newest sample is older than the window (deleted
        queues, queues of a view nobody opens any more)."""
        with self._lock:
            for name in [n for n, s in self._series.items()
                         if n not in keep and (not s or now - s[-1][0] > self.window)]:
                del self._series[name]


def _rate(a: tuple[float, int, int], b: tuple[float, int, int]) -> tuple[float, float]:
    dt = b[0] - a[0]
    if dt <= 0:
        return 0.0, 0.0
    # a deleted and re-created queue, or a scale-down, may move a count back: no negative rate
    return max(0, b[1] - a[1]) / dt, max(0, b[2] - a[2]) / dt
