"""`partq message kill|ack` end a nack's delay pending on the message at once, for a consumer
in another process too (the delay was stored with the message; the process that delivers the
partition used to wait it out: the next message came 14 s later, when a 16 s delay ran out),
and say what they freed."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading

import pytest
from helpers import wait_until
from tools_helpers import ok

import partq

DELAY = 60.0        # the queue's redelivery delay: far longer than any wait below

SERVICE = textwrap.dedent("""
    import sys, partq
    with partq.Broker.open(sys.argv[1]) as b:
        flow = b.bind(sys.argv[2], name="service")
        while True:
            for m in flow.receive(10, timeout=0.2):
                if m.payload == b"poison":
                    print("nacked", m.delivery_count, flush=True)
                    flow.nack(m)        # the queue's delay: it comes back in a minute
                    break
                print("got", m.payload.decode(), flush=True)
                flow.ack(m)
                if m.payload == b"good-2":
                    sys.exit(0)
""")


class Service:
    """The service above in its own process, its output lines collected by a thread."""

    def __init__(self, data: str, queue_name: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
        self.proc = subprocess.Popen([sys.executable, "-c", SERVICE, data, queue_name],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.name = "service"
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def saw(self, line: str) -> bool:
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return line in self.seen

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code not in (None, 0):
            raise AssertionError(f"the service exited {code}: {self.proc.stderr.read()}")

    def tail(self) -> str:
        return "\n".join(self.seen[-10:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def service(run, data, broker):
    ok(run("queue", "create", "dmq"))
    ok(run("queue", "create", "jobs", "--rebalance-delay", "0", "--dead-message-queue", "dmq",
           "--redelivery-delay", str(DELAY)))
    results = broker.publish_many("jobs", [(b"poison", "k"), (b"good-1", "k"), (b"good-2", "k")])
    svc = Service(data, "jobs")
    try:
        wait_until(lambda: svc.saw("nacked 1"), 60, "the service to nack the poison message",
                   procs=[svc])
        yield svc, results[0]
    finally:
        svc.stop()


@pytest.mark.parametrize("verb", ["kill", "ack"])
def test_message_kill_or_ack_ends_the_delay_of_a_consumer_in_another_process(
        run, broker, service, verb):
    svc, poison = service
    shown = json.loads(ok(run("queue", "show", "jobs", "--json")).stdout)["status"]
    assert shown["partitions"][0]["blocked"]["next_retry"] is not None    # it waits now
    result = ok(run("message", verb, "jobs", poison.partition, poison.seq, "--yes"))
    # well under the delay: the service gets the next messages at once
    wait_until(lambda: svc.saw("got good-2"), 20, "the next messages after the " + verb,
               procs=[svc])
    assert svc.proc.wait(timeout=30) == 0
    assert [line for line in svc.seen if line.startswith("got")] == ["got good-1", "got good-2"]
    text = result.stdout
    assert f"{'killed' if verb == 'kill' else 'acked'} message 0 of partition 0 of queue " \
           f"'jobs' (key k" in text, text
    assert "delivered 1 time" in text and "next is seq 1" in text, text
    assert "partition 0 unblocked" in text, text


def test_message_kill_says_when_the_partition_is_still_stuck(run, broker, service):
    """Killing a message behind the one the partition is stuck on frees nothing: it says so."""
    svc, poison = service
    text = ok(run("message", "kill", "jobs", poison.partition, poison.seq + 1, "--yes")).stdout
    assert "killed message 1 of partition 0 of queue 'jobs' (key k, delivered 0 times)" in text
    assert "partition 0 is still stuck, on seq 0" in text, text
    assert not svc.saw("got good-1")


@pytest.mark.parametrize("ordering", ["partition", "key"])
@pytest.mark.parametrize("verb", ["kill_message", "ack_message"])
def test_an_outside_kill_or_ack_ends_the_delay_in_the_delivering_process(tmp_path, ordering,
                                                                          verb):
    """The same in the process that delivers, on a ManualClock that never reaches the delay's
    end: under "partition" the partition goes on, under "key" the key does."""
    clock = partq.ManualClock(1000.0)
    with partq.Broker.open(tmp_path / "data", clock=clock) as broker:
        broker.create_queue("jobs", partitions=1, rebalance_delay=0, ordering=ordering)
        poison, *_ = broker.publish_many("jobs", [(b"poison", "k"), (b"good-1", "k"),
                                                  (b"good-2", "k")])
        with broker.bind("jobs") as flow:
            got = flow.receive(3)
            flow.nack(got[0], delay=DELAY)
            assert flow.receive(3) == []             # the delay holds them back
            getattr(broker, verb)("jobs", poison.partition, poison.seq)
            assert [m.payload for m in flow.receive(3)] == [b"good-1", b"good-2"]
