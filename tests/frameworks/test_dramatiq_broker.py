"""partq.dramatiq.PartqBroker in one process: per-key order across a worker's threads, a retry
as a nack in place, dead letters in NAME.XQ, delays as nack delays in NAME.DQ, flush, and the
same through ``partq serve``. (dramatiq's own suite runs in test_dramatiq_suite.py.)"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import dramatiq
import pytest
from dramatiq import Message, Worker
from dramatiq.middleware import CurrentMessage
from helpers import wait_until

import partq
from partq.dramatiq import PartqBroker
from partq.remote.server import Server

TOKEN = "a-test-token-of-32-bytes-or-so!!"


@pytest.fixture
def broker(tmp_path):
    b = PartqBroker(tmp_path / "d")
    dramatiq.set_broker(b)
    yield b
    b.close()


@contextmanager
def worker(broker, threads: int = 8):
    w = Worker(broker, worker_timeout=100, worker_threads=threads)
    w.start()
    try:
        yield w
    finally:
        w.stop()


def spans(log: list) -> dict:
    """Per key, the (start, end) events in the order they happened."""
    out: dict = {}
    for event, key, i in log:
        out.setdefault(key, []).append((event, i))
    return out


def test_one_keys_messages_run_one_at_a_time_in_order_across_the_threads(broker):
    log, lock = [], threading.Lock()

    @dramatiq.actor
    def step(key, i):
        with lock:
            log.append(("start", key, i))
        time.sleep(0.002)             # work long enough for another thread to take the next one
        with lock:
            log.append(("end", key, i))

    for i in range(25):
        for key in ("a", "b", "c"):
            step.send_with_options(args=(key, i), partq_key=key)
    with worker(broker, threads=8):
        broker.join(step.queue_name, timeout=60_000)
    for key, events in spans(log).items():
        # start 0, end 0, start 1, end 1, ...: never two of a key at once, and in publish order
        assert events == [(e, i) for i in range(25) for e in ("start", "end")], key
    starts = [key for event, key, _ in log if event == "start"]
    assert len(set(starts[:3])) > 1        # the keys themselves ran side by side


def test_the_actor_option_partq_key_keys_every_message_of_the_actor(broker):
    running, overlaps, lock = [0], [], threading.Lock()

    @dramatiq.actor(partq_key="one")
    def serial(i):
        with lock:
            running[0] += 1
            overlaps.append(running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1

    for i in range(20):
        serial.send(i)
    with worker(broker, threads=8):
        broker.join(serial.queue_name, timeout=60_000)
    assert max(overlaps) == 1 and len(overlaps) == 20


def test_a_retry_is_a_nack_in_place_and_keeps_its_keys_order(broker):
    broker.add_middleware(CurrentMessage())
    runs = []

    @dramatiq.actor(max_retries=3, min_backoff=300, max_backoff=300)
    def job(i):
        retries = CurrentMessage.get_current_message().options.get("retries", 0)
        runs.append((i, retries))
        if i == 0 and retries == 0:
            raise ValueError("fails once")

    job.send_with_options(args=(0,), partq_key="k")
    job.send_with_options(args=(1,), partq_key="k")
    with worker(broker):
        # the failed message waits out its retry delay in its own queue, holding its key
        wait_until(lambda: broker.connection.queue_status("default").delayed == 1, 10,
                   "the retry's nack delay")
        assert broker.connection.queue_status("default.DQ").depth == 0     # no copy was made
        broker.join(job.queue_name, timeout=30_000)
    assert runs == [(0, 0), (0, 1), (1, 0)]     # the retry ran before the key's next message


def test_a_dead_letter_goes_to_the_queues_dead_message_queue(broker):
    @dramatiq.actor(max_retries=0)
    def doomed():
        raise ValueError("always")

    sent = doomed.send()
    with worker(broker):
        with pytest.raises(ValueError):
            broker.join(doomed.queue_name, timeout=30_000, fail_fast=True)
    flow = broker.connection.bind("default.XQ")
    (dead,) = flow.receive(10, timeout=5)
    assert dead.headers["dead_reason"] == "rejected"
    assert Message.decode(dead.payload).message_id == sent.message_id
    assert [m.message_id for m in broker.dead_letters] == [sent.message_id]


def test_a_delayed_message_waits_in_the_delay_queue_as_a_nack_delay(broker):
    ran = []

    @dramatiq.actor
    def later():
        ran.append(time.time())

    sent_at = time.time()
    later.send_with_options(delay=1500)
    with worker(broker):
        wait_until(lambda: broker.connection.queue_status("default.DQ").delayed == 1, 10,
                   "the delayed message held by partq")
        broker.join(later.queue_name, timeout=30_000)
    assert len(ran) == 1 and ran[0] - sent_at >= 1.5


def test_flush_drops_the_queues_messages(broker):
    @dramatiq.actor
    def never():
        raise AssertionError("flushed messages must not run")

    for _ in range(5):
        never.send()
    never.send_with_options(delay=60_000)
    assert broker.connection.queue_status("default").depth == 5
    broker.flush_all()
    assert broker.connection.queue_status("default").depth == 0
    assert broker.connection.queue_status("default.DQ").depth == 0
    broker.join(never.queue_name, timeout=1000)


def test_an_undeclared_queue_is_queue_not_found(broker):
    message = Message(queue_name="nowhere", actor_name="a", args=(), kwargs={}, options={})
    with pytest.raises(dramatiq.errors.QueueNotFound):
        broker.enqueue(message)


def test_through_partq_serve(tmp_path):
    directory = partq.Broker.open(tmp_path / "served")
    directory.create_queue("default.XQ")
    directory.create_queue("default", 4, ordering="key", dead_message_queue="default.XQ",
                           max_handoff_time=600, max_poll_interval=0)
    directory.create_queue("default.DQ", 4, ordering="key", max_poll_interval=0)
    server = Server(directory, "127.0.0.1:0", token=TOKEN.encode())
    broker = PartqBroker(address=server.address, token=TOKEN)
    dramatiq.set_broker(broker)
    try:
        log, lock = [], threading.Lock()

        @dramatiq.actor(max_retries=1, min_backoff=100, max_backoff=100)
        def step(key, i):
            with lock:
                log.append(("start", key, i))
            if i == 3 and not any(e == ("end", key, 3) for e in log):
                with lock:
                    log.append(("end", key, i))
                raise ValueError("retried once")
            with lock:
                log.append(("end", key, i))

        for i in range(10):
            for key in ("a", "b"):
                step.send_with_options(args=(key, i), partq_key=key)
        step.send_with_options(args=("late", 0), delay=300)
        with worker(broker):
            broker.join(step.queue_name, timeout=60_000)
        for key in ("a", "b"):
            events = spans(log)[key]
            expected = [(e, i) for i in range(10) for e in ("start", "end")]
            assert events == expected[:8] + [("start", 3), ("end", 3)] + expected[8:], key
        assert ("end", "late", 0) in log
        assert directory.queue_status("default").depth == 0
    finally:
        broker.close()
        server.close()
        directory.close()

