"""Log lines of a scaling as it goes, for an operator (logger ``partq.broker``)."""
from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("partq.broker")


def scaling_log(queue: str, prefix: str, progress: Callable[[str], None] | None = None):
    """A scaling ``progress`` callback that logs each step (and calls ``progress`` too)."""
    def step(text: str) -> None:
        log.info("queue %r scaling: %s%s", queue, prefix, text)
        if progress is not None:
            progress(text)
    return step
