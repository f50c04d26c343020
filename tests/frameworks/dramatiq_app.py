"""A dramatiq application on partq for tests/frameworks/test_dramatiq_processes.py: the
``dramatiq`` command runs its workers; the test sends from its own process. Its directory and
log file come from the environment; ``step`` writes a line when it starts and when it ends."""
from __future__ import annotations

import os
import time

import dramatiq

from partq.dramatiq import PartqBroker

broker = PartqBroker(os.environ["PARTQ_DRAMATIQ_DIR"], partitions=4,
                     queue_options={"rebalance_delay": 0.5})
dramatiq.set_broker(broker)


def record(line: str) -> None:
    """One line appended with one write (O_APPEND): lines of every process, in the order written."""
    fd = os.open(os.environ["PARTQ_DRAMATIQ_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@dramatiq.actor(max_retries=0)
def step(key: str, i: int, seconds: float) -> None:
    record(f"start {key} {i} {os.getpid()}\n")
    time.sleep(seconds)
    record(f"end {key} {i} {os.getpid()}\n")
