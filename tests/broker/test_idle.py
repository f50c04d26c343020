"""An idle bound flow sleeps (architecture issue): a receive waiting on an empty queue used to
re-poll at once because each commit of its own bookkeeping woke it again, burning a core per idle
consumer. The waiting receive must still see messages published by this process at once and by
other processes within the poll interval."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import partq

PUBLISH_FROM_ANOTHER_PROCESS = """
import sys, partq
with partq.Broker.open(sys.argv[1]) as b:
    b.publish("q", b"from-another-process", key="k")
"""


def test_an_idle_receive_costs_almost_no_cpu(tmp_path):
    """One second of receive(timeout=0.1) on an idle 6-partition queue, with the ticker thread
    running: measured in CPU seconds of this process, not in wall-clock time."""
    with partq.Broker.open(tmp_path / "d") as broker:
        broker.create_queue("q", partitions=6)
        flow = broker.bind("q")
        flow.receive(timeout=0.1)                       # settle the first bookkeeping
        polls, cpu = broker.dispatcher.polls, time.process_time()
        for _ in range(10):
            assert flow.receive(timeout=0.1) == []
        used = time.process_time() - cpu
        logs_read = broker.dispatcher.polls - polls
    assert used < 0.25, f"an idle flow used {used:.3f} CPU seconds in 1 s of receive"
    assert logs_read <= 10, f"an idle flow read the logs {logs_read} times in 1 s of receive"


def test_a_waiting_receive_wakes_for_a_publish_of_this_process(tmp_path):
    with partq.Broker.open(tmp_path / "d") as broker:
        broker.create_queue("q", partitions=2)
        flow = broker.bind("q")
        got: list = []
        waiter = threading.Thread(target=lambda: got.extend(flow.receive(timeout=30)))
        waiter.start()
        broker.publish("q", b"hello", key="k")
        waiter.join(timeout=30)
        assert [m.payload for m in got] == [b"hello"]


def test_a_waiting_receive_sees_a_publish_of_another_process(tmp_path):
    data = str(tmp_path / "d")
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2)
        flow = broker.bind("q")
        assert flow.receive(timeout=0.05) == []
        proc = subprocess.Popen([sys.executable, "-c", PUBLISH_FROM_ANOTHER_PROCESS, data])
        try:
            got = flow.receive(timeout=60)
        finally:
            proc.wait(timeout=60)
        assert [m.payload for m in got] == [b"from-another-process"]
        assert proc.returncode == 0
