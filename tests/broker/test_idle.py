"""An idle bound flow sleeps (architecture issue): a receive waiting on an empty queue used to
re-poll at once because each commit of its own bookkeeping woke it again, burning a core per idle
consumer. The waiting receive must still see messages published by this process at once and by
other processes within the poll interval."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from helpers import wait_until

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


def test_a_waiting_receive_is_not_woken_by_other_queues_nor_by_acks_that_free_no_credit(tmp_path):
    """A receive waiting on queue "a" reads the logs again only for what may give it a
    message: publishes to queue "b" and an ack of "a" that frees credit no collect lacked do
    not wake it (each used to cost it a read of every partition of "a")."""
    with partq.Broker.open(tmp_path / "d") as broker:
        broker.create_queue("a", partitions=4)
        broker.create_queue("b", partitions=4)
        flow = broker.bind("a")
        broker.publish("a", b"first", key="k")
        first = wait_until(lambda: flow.receive(timeout=0.05), 10, "the first message")
        polls = broker.dispatcher.polls
        got: list = []
        waiter = threading.Thread(target=lambda: got.extend(flow.receive(timeout=30)))
        waiter.start()
        wait_until(lambda: broker.dispatcher.polls > polls, 10, "the waiting receive's look")
        for i in range(40):
            broker.publish("b", b"x%d" % i, key=f"k{i}")
        flow.ack_many(first)
        broker.publish("a", b"last", key="k")
        waiter.join(timeout=30)
        logs_read = broker.dispatcher.polls - polls
    assert [m.payload for m in got] == [b"last"]
    assert logs_read <= 8, f"the waiting receive read the logs {logs_read} times"


def test_a_waiting_receive_wakes_for_a_config_change_of_this_process(tmp_path):
    """No commit that appended wakes it: the ticker takes the new config in and wakes the
    queue's receives."""
    with partq.Broker.open(tmp_path / "d") as broker:
        broker.create_queue("q", partitions=2)
        broker.update_queue("q", egress_enabled=False)
        broker.publish("q", b"held", key="k")
        flow = broker.bind("q")
        assert flow.receive(timeout=0.1) == []
        got: list = []
        waiter = threading.Thread(target=lambda: got.extend(flow.receive(timeout=30)))
        waiter.start()
        broker.update_queue("q", egress_enabled=True)
        waiter.join(timeout=30)
        assert [m.payload for m in got] == [b"held"]


def test_a_receive_waiting_on_a_full_flow_wakes_for_the_ack_that_frees_credit(tmp_path):
    with partq.Broker.open(tmp_path / "d") as broker:
        broker.create_queue("q", partitions=1, max_delivered_unacked_per_flow=1)
        broker.publish("q", b"one", key="k")
        broker.publish("q", b"two", key="k")
        flow = broker.bind("q")
        first = flow.receive(timeout=5)
        assert [m.payload for m in first] == [b"one"]
        polls = broker.dispatcher.polls
        got: list = []
        waiter = threading.Thread(target=lambda: got.extend(flow.receive(timeout=30)))
        waiter.start()
        wait_until(lambda: broker.dispatcher.polls > polls, 10, "the waiting receive's look")
        started = time.monotonic()
        flow.ack_many(first)
        waiter.join(timeout=30)
        assert [m.payload for m in got] == [b"two"]
        assert time.monotonic() - started < 10
