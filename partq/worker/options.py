"""What ``@worker.handler`` registers: the handler and its options, checked once, and the retry
rule those options give (``backoff_delay``)."""
from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from partq.errors import InvalidConfig

DEFAULT_CONCURRENCY = 8
DEFAULT_RETRIES = 5
DEFAULT_BACKOFF = (0.5, 60.0)   # seconds: the first retry's delay, and the longest
DEFAULT_WARN_AFTER = 60.0       # seconds a handler runs before it is logged as slow


@dataclass(frozen=True)
class HandlerOptions:
    """One registered handler. ``retries``: times a message whose handler raised comes back
    (so it runs at most ``retries + 1`` times) before it goes to the dead message queue;
    ``backoff``: the delay before the first retry and the longest, doubling in between, each
    drawn with jitter; ``warn_after``: seconds after which a running handler is logged (and
    shown in ``Worker.status()`` and the metrics) as slow."""

    queue: str
    fn: Callable
    concurrency: int = DEFAULT_CONCURRENCY
    retries: int = DEFAULT_RETRIES
    backoff: tuple[float, float] = DEFAULT_BACKOFF
    warn_after: float = DEFAULT_WARN_AFTER

    def __post_init__(self) -> None:
        if not isinstance(self.queue, str) or not self.queue:
            raise InvalidConfig(f"a handler's queue must be a queue name, not {self.queue!r}")
        if not callable(self.fn):
            raise InvalidConfig(f"a handler must be callable, not {type(self.fn).__name__}")
        _check_int("concurrency", self.concurrency, 1, 4096)
        _check_int("retries", self.retries, 0, 1 << 20)
        backoff = self.backoff
        if not isinstance(backoff, (tuple, list)) or len(backoff) != 2 or not all(
                _seconds(x) for x in backoff) or backoff[0] > backoff[1]:
            raise InvalidConfig(f"backoff must be (min_seconds, max_seconds) with 0 <= min <= max "
                                f"<= 86400, not {backoff!r}")
        object.__setattr__(self, "backoff", (float(backoff[0]), float(backoff[1])))
        if not _seconds(self.warn_after) or self.warn_after <= 0:
            raise InvalidConfig(f"warn_after must be a number of seconds from 0 to 86400 "
                                f"(excluded), not {self.warn_after!r}")

    @property
    def is_async(self) -> bool:
        """An ``async def`` handler: it runs on the worker's one event loop."""
        call = type(self.fn).__call__ if not inspect.isroutine(self.fn) else None
        return inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(call)

    @property
    def name(self) -> str:
        """The handler's name in logs and metrics: ``module.function``."""
        fn = self.fn
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def backoff_delay(backoff: tuple[float, float], failures: int, rng: random.Random) -> float:
    """Seconds before the retry that follows the ``failures``-th failure of a message: ``min *
    2**(failures - 1)``, at most ``max``, then jittered to a uniform draw from half of it to all
    of it (so retries of many messages that failed together spread out). With backoff (0.5, 60):
    about 0.25-0.5 s after the first failure, 0.5-1 s after the second, 30-60 s from the
    eighth on."""
    low, high = backoff
    exponent = min(max(failures - 1, 0), 64)
    delay = min(low * 2.0 ** exponent, high)
    return delay * (0.5 + rng.random() / 2)


def _seconds(value) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and 0 <= value <= 86400)


def _check_int(field: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidConfig(f"{field} must be an integer from {low} to {high}, not {value!r}")
