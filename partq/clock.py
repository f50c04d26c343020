"""Time, injected. The broker reads time only through a Clock, so tests drive timers by hand."""
from __future__ import annotations

import threading
import time

MAX_SECONDS = 10 * 365 * 86400.0    # the longest delay or interval partq accepts: ten years


class SystemClock:
    """Monotonic seconds for timers; wall time in nanoseconds for publish timestamps."""

    def now(self) -> float:
        return time.monotonic()

    def wall_ns(self) -> int:
        return time.time_ns()


class ManualClock:
    """A clock that moves only when told. ``advance`` wakes nothing by itself: call
    ``broker.tick()`` (or any receive) after advancing to run due timers."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def wall_ns(self) -> int:
        return int(self.now() * 1e9)

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._lock:
            self._now += seconds
