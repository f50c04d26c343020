"""partq.Worker in this process, on a real directory: order per key under concurrency, retries
then dead with the exception in the headers, async handlers, a slow handler reported (on a
ManualClock), a stop that acks what finished, the dead message queue made by default."""
from __future__ import annotations

import asyncio
import logging
import random
import threading
import time

import pytest
from helpers import drain, wait_until

import partq
from partq.errors import InvalidConfig


def make_queue(path, name="jobs", partitions=4, **options):
    with partq.Broker.open(path) as b:
        b.create_queue(name, partitions=partitions, **options)


def publish(path, items, queue="jobs"):
    with partq.Broker.open(path) as b:
        b.publish_many(queue, items)


def handled(w) -> int:
    return sum(s["handled"] for s in w.status())


class Recorder:
    """What ran: per key the payloads in start order, and whether two runs of a key overlapped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set = set()
        self.started: dict = {}
        self.overlaps: list = []
        self.max_running = 0

    def enter(self, msg) -> None:
        with self.lock:
            if msg.key in self.active:
                self.overlaps.append(msg.key)
            self.active.add(msg.key)
            self.max_running = max(self.max_running, len(self.active))
            self.started.setdefault(msg.key, []).append(int(msg.payload))

    def leave(self, msg) -> None:
        with self.lock:
            self.active.discard(msg.key)


def test_keys_run_at_once_one_key_at_a_time_in_publish_order(tmp_path):
    make_queue(tmp_path, partitions=2, ordering="key")
    publish(tmp_path, [(str(i).encode(), f"k{i % 12}") for i in range(600)])
    rec, rng = Recorder(), random.Random(7)
    w = partq.Worker(tmp_path)

    @w.handler("jobs", concurrency=6)
    def handle(msg):
        rec.enter(msg)
        time.sleep(rng.random() * 0.002)
        rec.leave(msg)

    w.start()
    try:
        wait_until(lambda: handled(w) == 600, 60, "600 handled")
    finally:
        assert w.stop() is True
    assert rec.overlaps == []
    assert rec.max_running > 1              # keys of one partition ran at once
    for key, payloads in rec.started.items():
        assert payloads == sorted(payloads), key
    with partq.Broker.open(tmp_path) as b:
        assert b.queue_status("jobs").depth == 0


def test_partition_ordering_runs_one_message_of_a_partition_at_a_time(tmp_path):
    make_queue(tmp_path, partitions=1)
    publish(tmp_path, [(str(i).encode(), f"k{i % 5}") for i in range(100)])
    rec = Recorder()
    order = []
    w = partq.Worker(tmp_path)

    @w.handler("jobs", concurrency=4)
    def handle(msg):
        rec.enter(msg)
        order.append(int(msg.payload))
        rec.leave(msg)

    w.start()
    wait_until(lambda: handled(w) == 100, 60, "100 handled")
    w.stop()
    assert rec.max_running == 1 and order == list(range(100))


def test_a_poison_message_is_retried_then_dead_with_its_exception_while_its_partition_flows(
        tmp_path, caplog):
    make_queue(tmp_path, partitions=1, ordering="key")
    publish(tmp_path, [(b"poison", "bad")] + [(str(i).encode(), f"k{i % 3}") for i in range(30)])
    runs: list = []
    w = partq.Worker(tmp_path)

    @w.handler("jobs", retries=3, backoff=(0.01, 0.04))
    def handle(msg):
        runs.append(msg.payload)
        if msg.payload == b"poison":
            raise ValueError(f"cannot handle {msg.payload!r}")

    with caplog.at_level(logging.INFO, "partq.worker"):
        w.start()
        wait_until(lambda: w.status()[0]["dead"] == 1 and handled(w) == 30, 60, "dead + 30")
        w.stop()
    assert runs.count(b"poison") == 4                       # the first run and 3 retries
    assert runs[0] == b"poison" and len(runs) == 34         # the other keys ran meanwhile
    assert runs.index(b"29") < len(runs) - 1
    status = w.status()[0]
    assert (status["failed"], status["retried"], status["dead"]) == (4, 3, 1)
    assert "created queue 'jobs.dead'" in caplog.text
    with partq.Broker.open(tmp_path) as b:
        assert b.queue_config("jobs").dead_message_queue == "jobs.dead"
        flow = b.bind("jobs.dead")
        (dead,) = drain(flow, timeout=1.0, at_least=1)
        assert dead.payload == b"poison" and dead.key == "bad"
        assert dead.headers["exception_type"] == "ValueError"
        assert dead.headers["exception_message"] == "cannot handle b'poison'"
        assert dead.headers["dead_reason"] == "rejected"
        assert dead.headers["delivery_count"] == 4


def test_a_queue_with_a_dead_message_queue_keeps_it(tmp_path):
    make_queue(tmp_path, partitions=1, dead_message_queue="graveyard")
    w = partq.Worker(tmp_path)
    w.handler("jobs")(lambda msg: None)
    w.start()
    w.stop()
    with partq.Broker.open(tmp_path) as b:
        assert b.queue_config("jobs").dead_message_queue == "graveyard"
        assert b.queue_config("graveyard").partitions == 1     # created, as it was missing
        assert "jobs.dead" not in {c.name for c in b.queues()}


def test_async_handlers_run_concurrently_on_one_event_loop(tmp_path):
    make_queue(tmp_path, partitions=1, ordering="key")
    publish(tmp_path, [(str(i).encode(), f"k{i}") for i in range(8)])
    loops, running, peak = set(), [0], [0]
    w = partq.Worker(tmp_path)

    @w.handler("jobs", concurrency=8)
    async def handle(msg):
        loops.add(asyncio.get_running_loop())
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.05)
        running[0] -= 1

    w.start()
    wait_until(lambda: handled(w) == 8, 30, "8 handled")
    w.stop()
    assert len(loops) == 1 and peak[0] > 1


def test_a_slow_handler_is_reported_with_its_key_and_its_key_waits_the_others_go_on(
        tmp_path, caplog):
    make_queue(tmp_path, partitions=1, ordering="key")
    publish(tmp_path, [(b"0", "slow"), (b"1", "slow"), (b"2", "other"), (b"3", "other")])
    clock, release, seen = partq.ManualClock(), threading.Event(), []
    w = partq.Worker(tmp_path, clock=clock)

    @w.handler("jobs", warn_after=30)
    def handle(msg):
        seen.append(msg.payload)
        if msg.payload == b"0":
            release.wait(30)

    w.start()
    try:
        wait_until(lambda: seen.count(b"3") == 1 and handled(w) == 2, 30, "other key done")
        assert b"1" not in seen                 # the slow key's next message waits
        assert w.check_slow() == 0
        clock.advance(30)
        with caplog.at_level(logging.WARNING, "partq.worker"):
            assert w.check_slow() == 1
            assert w.check_slow() == 0          # once per message
        assert "key 'slow' (partition 0, seq 0)" in caplog.text
        (slow,) = w.status()[0]["slow"]
        assert (slow["key"], slow["seq"], slow["seconds"]) == ("slow", 0, 30)
    finally:
        release.set()
    wait_until(lambda: handled(w) == 4, 30, "all 4 handled")
    w.stop()


def test_stop_waits_for_running_handlers_acks_them_and_unbinds(tmp_path):
    make_queue(tmp_path, partitions=1, ordering="key")
    publish(tmp_path, [(str(i).encode(), f"k{i}") for i in range(4)])
    started, release = threading.Semaphore(0), threading.Event()
    w = partq.Worker(tmp_path)

    @w.handler("jobs", concurrency=2)
    def handle(msg):
        started.release()
        release.wait(10)

    w.start()
    for _ in range(2):
        assert started.acquire(timeout=10)
    threading.Timer(0.2, release.set).start()
    assert w.stop(timeout=10) is True
    assert w.status()[0]["handled"] == 2        # the two running; the two others never started
    with partq.Broker.open(tmp_path) as b:
        assert b.queue_status("jobs").depth == 2
        flow = b.bind("jobs")
        back = drain(flow, timeout=1.0, at_least=2)
        assert sorted(int(m.payload) for m in back) == [2, 3]


def test_stop_after_its_timeout_gives_running_messages_back(tmp_path):
    make_queue(tmp_path, partitions=1)
    publish(tmp_path, [(b"x", None)])
    started, release = threading.Event(), threading.Event()
    w = partq.Worker(tmp_path)

    @w.handler("jobs")
    def handle(msg):
        started.set()
        release.wait(10)

    w.start()
    assert started.wait(10)
    assert w.stop(timeout=0.1) is False
    release.set()
    with partq.Broker.open(tmp_path) as b:
        (again,) = drain(b.bind("jobs"), timeout=1.0, at_least=1)
        assert again.redelivered


def test_registration_is_checked(tmp_path):
    w = partq.Worker(tmp_path)
    with pytest.raises(InvalidConfig, match="concurrency"):
        w.handler("jobs", concurrency=0)(lambda m: None)
    with pytest.raises(InvalidConfig, match="backoff"):
        w.handler("jobs", backoff=(5, 1))(lambda m: None)
    with pytest.raises(InvalidConfig, match="no handlers"):
        w.start()
    with pytest.raises(InvalidConfig, match="not both"):
        partq.Worker(tmp_path, address="127.0.0.1:1")


def test_a_flow_unbound_under_the_worker_is_bound_again_once_its_handlers_finish(
        tmp_path, caplog):
    """A handler that hangs while the receive-ahead is full makes the queue unbind the flow
    (max_poll_interval); the worker waits for the hung run, binds again and goes on, in order."""
    make_queue(tmp_path, partitions=1, ordering="key", max_poll_interval=1.0,
               rebalance_delay=0.5)
    publish(tmp_path, [(str(i).encode(), "a") for i in range(300)])
    release, runs = threading.Event(), []
    w = partq.Worker(tmp_path)

    @w.handler("jobs", concurrency=1)
    def handle(msg):
        runs.append(int(msg.payload))
        if len(runs) == 1:
            release.wait(30)

    with caplog.at_level(logging.INFO, "partq.worker"):
        w.start()
        try:
            wait_until(lambda: "binding again" in caplog.text, 30, "the flow unbound")
            release.set()
            wait_until(lambda: "bound again" in caplog.text.split("binding again")[-1], 30,
                       "bound again")
            wait_until(lambda: set(runs) == set(range(300)), 60, "the rest handled")
        finally:
            release.set()
            w.stop()
    firsts = list(dict.fromkeys(runs))          # the hung run may come again (at least once)
    assert firsts == list(range(300))
    with partq.Broker.open(tmp_path) as b:
        assert b.queue_status("jobs").depth == 0
