"""What one handler did, counted in this process: for ``Worker.status()``, the ``--json`` lines
and the metrics endpoint (``partq.worker.metrics``)."""
from __future__ import annotations

import bisect
import threading

# seconds: a handler's run, from its start to its return or raise
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0, 300.0)


class HandlerStats:
    """Counters of one handler. ``handled``: messages its handler returned for (acked);
    ``failed``: runs that raised; ``retried``: failures given back for a retry; ``dead``:
    failures rejected to the dead message queue once out of retries; ``running``: handlers
    running now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.handled = self.failed = self.retried = self.dead = self.running = 0
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)     # the last: above every bound
        self.latency_sum = 0.0

    def started(self) -> None:
        with self._lock:
            self.running += 1

    def finished(self, seconds: float, ok: bool) -> None:
        with self._lock:
            self.running -= 1
            if not ok:
                self.failed += 1
            self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self.latency_sum += seconds

    def add(self, handled: int = 0, retried: int = 0, dead: int = 0) -> None:
        with self._lock:
            self.handled += handled
            self.retried += retried
            self.dead += dead

    def as_dict(self) -> dict:
        with self._lock:
            return {"handled": self.handled, "failed": self.failed, "retried": self.retried,
                    "dead": self.dead, "running": self.running}

    def histogram(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative (bound, count) pairs, ``+Inf`` last, and the sum: Prometheus' form."""
        with self._lock:
            out, total = [], 0
            for bound, n in zip([*map(str, LATENCY_BUCKETS), "+Inf"], self.buckets, strict=True):
                total += n
                out.append((bound, total))
            return out, self.latency_sum
