"""A bind while the delivery owner is stopped (rules `peer-flows` and `owner-takeover`): the owner
process (consumer_timeout 3 s) is stopped with SIGSTOP, and another process binds. The bind
must not fail with ``DeliveryLocked`` because the owner does not answer: it waits until the
owner's lease ran out and takes delivery over, as a process with flows does after a SIGKILL.
When the old owner runs again it writes nothing more for the queue. Real processes and
signals; the test waits on conditions, never on sleeps."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from helpers import wait_until

import partq

HERE = os.path.dirname(os.path.abspath(__file__))


class Driven:
    """A ``driven_proc.py`` process: ``proc(op=..., ...)`` sends one command and returns its
    answer."""

    def __init__(self, data: str, tmp_path, name: str) -> None:
        self.name = name
        self.err = open(tmp_path / f"{name}.err", "wb")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "driven_proc.py"), data,
                                      "q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, text=True)

    def __call__(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"{self.name} exited with {self.proc.wait()}:\n{self.tail()}"
        return json.loads(line)

    def tail(self) -> str:
        with open(self.err.name, "rb") as f:
            return f.read()[-8000:].decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=60)
        self.err.close()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rfind(b")") + 2:][:1] in (b"T", b"t")


def delivery_owner(data: str) -> str:
    with partq.Broker.open(data) as broker:
        return broker.queue_status("q").delivery_owner or ""


def receive_all(proc: Driven, n: int) -> list[list[int]]:
    got: list[list[int]] = []

    def more() -> bool:
        answer = proc(op="receive", max=100, timeout=1.0)
        assert answer["ok"], answer
        got.extend(answer["messages"])
        return len(got) >= n
    wait_until(more, timeout=60, what=f"{proc.name} received {n} messages")
    return got


def test_a_bind_while_the_owner_is_stopped_takes_delivery_over(tmp_path):
    data = str(tmp_path / "data")
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0.0, max_handoff_time=0.0,
                            consumer_timeout=3.0)
    old, new = Driven(data, tmp_path, "old"), Driven(data, tmp_path, "new")
    try:
        assert old(op="bind", name="old") == {"ok": True, "partitions": [0, 1]}
        assert delivery_owner(data).startswith(f"pid {old.proc.pid} ")
        with partq.Broker.open(data) as broker:
            broker.publish_many("q", [(b"m%d" % i, None) for i in range(10)])
        held = receive_all(old, 10)
        old.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(old.proc.pid), timeout=30, what="the owner stopped")

        bound = new(op="bind", name="new")          # before the owner's lease ran out
        assert bound == {"ok": True, "partitions": [0, 1]}, bound
        assert delivery_owner(data).startswith(f"pid {new.proc.pid} ")
        again = receive_all(new, 10)
        assert sorted(again) == sorted(held)
        assert new(op="ack", messages=again) == {"ok": True}

        old.proc.send_signal(signal.SIGCONT)
        refused = old(op="ack", messages=held)      # its flow's ack writes nothing now
        assert refused["ok"] is False and refused["error"] == "FlowClosed", refused
        assert "took delivery over" in refused["message"]
        assert delivery_owner(data).startswith(f"pid {new.proc.pid} ")
        with partq.Broker.open(data) as broker:
            status = broker.queue_status("q")
            assert status.depth == 0
            assert [f.name for f in status.flows if f.bound] == ["new"]
    finally:
        old.close()
        new.close()


def test_a_bind_over_a_connection_to_an_owner_that_stops_takes_delivery_over(tmp_path):
    """The binding process is already connected to the owner (it has a flow of the queue) when
    the owner stops, and the queue's consumer_timeout is longer than a request's 10 s: the bind
    waits for the lease, not for a fixed time, then takes over."""
    data = str(tmp_path / "data")
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0.0, max_handoff_time=0.0,
                            consumer_timeout=12.0)
    old, new = Driven(data, tmp_path, "old"), Driven(data, tmp_path, "new")
    try:
        assert old(op="bind", name="old")["ok"]
        first = new(op="bind", name="first")            # a flow of the queue, served by old
        assert first["ok"] and len(first["partitions"]) == 1, first
        old.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped(old.proc.pid), timeout=30, what="the owner stopped")
        bound = new(op="bind", name="second")
        assert bound["ok"], bound
        assert delivery_owner(data).startswith(f"pid {new.proc.pid} ")
        old.proc.send_signal(signal.SIGCONT)
        refused = old(op="receive", max=10, timeout=0.0)
        assert refused["ok"] is False and refused["error"] == "FlowClosed", refused
        assert delivery_owner(data).startswith(f"pid {new.proc.pid} ")
    finally:
        old.close()
        new.close()
