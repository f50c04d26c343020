"""``partq top`` in a real terminal: a tmux pane runs it on a directory while this test publishes
(the process that owns nothing but a publisher), the pane's screen is read with capture-pane
until the queue's depth has changed on it several times, and q ends it."""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import threading
import uuid

import pytest
from helpers import wait_until

import partq
from partq.metrics.sampling import Snapshot, rates
from partq.status import PartitionStatus, QueueStatus

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it)")


class Tmux:
    """A tmux server of this test alone (its own socket), with one detached session."""

    def __init__(self, command: list[str], width: int = 160, height: int = 50) -> None:
        self.socket = f"partq-test-{uuid.uuid4().hex[:8]}"
        self.run("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height),
                 shlex.join(command))

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              timeout=30, env={**os.environ, "TERM": "xterm-256color"})

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "top").stdout

    def alive(self) -> bool:
        return self.run("has-session", "-t", "top").returncode == 0

    def kill(self) -> None:
        self.run("kill-server")


def queue_depth(screen: str, queue: str) -> int | None:
    """The DEPTH column of ``queue``'s row in the queues table on the screen."""
    lines = screen.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:2] == ["QUEUE", "DEPTH"]:
            for row in lines[i + 1:]:
                match = re.match(rf"{re.escape(queue)}\s+([\d,]+)\s", row)
                if match:
                    return int(match.group(1).replace(",", ""))
    return None


def test_top_shows_the_depth_changing_while_a_publisher_runs(partq_script, tmp_path):
    data = str(tmp_path / "data")
    broker = partq.Broker.open(data)
    stop = threading.Event()
    publisher = None
    tmux = Tmux([partq_script, "--data", data, "top", "--interval", "0.2"])
    try:
        broker.create_queue("orders", partitions=3)
        screen = wait_until(lambda: (lambda s: s if queue_depth(s, "orders") == 0 else None)(
            tmux.screen()), 60, "top to show the queue 'orders' at depth 0")
        for heading in ("queues", "partitions", "flows", "replication", "store:", "q quits"):
            assert heading in screen, screen

        def publish() -> None:
            i = 0
            while not stop.is_set():
                broker.publish("orders", b"x" * 64, key=f"k{i}")
                i += 1
        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        seen: list[int] = []

        def depths_moved() -> bool:
            depth = queue_depth(tmux.screen(), "orders")
            if depth is not None and (not seen or depth != seen[-1]):
                seen.append(depth)
            return len(seen) >= 3
        wait_until(depths_moved, 60, "the depth shown by top to change while publishing")
        assert seen == sorted(seen) and seen[-1] > 0, seen
        stop.set()
        publisher.join()
        final = broker.queue_status("orders").depth
        wait_until(lambda: queue_depth(tmux.screen(), "orders") == final, 60,
                   "top to show the final depth")
        rows = [line for line in tmux.screen().splitlines() if line.startswith("orders ")]
        assert len(rows) == 1 + 3, rows        # the queue's row, then one per partition
        tmux.run("send-keys", "-t", "top", "q")
        wait_until(lambda: not tmux.alive(), 30, "top to quit on q")
    finally:
        stop.set()
        if publisher is not None:
            publisher.join()
        tmux.kill()
        broker.close()


def _status(name: str, parts: list[tuple[int, int, int]]) -> QueueStatus:
    """A queue status with partitions (partition, next_seq, depth)."""
    return QueueStatus(name, len(parts), "Ready", "Ready", True, True, sum(d for _, _, d in parts),
                       [PartitionStatus(p, "Ready", None, None, d, 0, n, n - d)
                        for p, n, d in parts])


def test_rates_are_per_second_between_two_snapshots():
    before = Snapshot(10.0, "d", [_status("q", [(0, 100, 10), (1, 50, 0)])])
    after = Snapshot(12.0, "d", [_status("q", [(0, 140, 20), (1, 50, 0)]),
                                 _status("new", [(0, 5, 5)])])
    r = rates(before, after)
    assert r.partition_published["q", 0] == 20.0          # 40 published in 2 s
    assert r.partition_acked["q", 0] == 15.0              # 120 gone - 90 gone = 30 in 2 s
    assert r.published == {"q": 20.0, "new": 0.0}         # a queue seen once has no rate yet
    assert r.acked["q"] == 15.0
    assert rates(None, after).published == {"q": 0.0, "new": 0.0}


def test_a_queues_warnings_are_shown_under_the_queues():
    """What `queue show` warns about (a stopped delivery owner, an interrupted scaling) is on
    the live view too, under the queues table."""
    from rich.console import Console

    from partq.tools.top_view import render
    warned = dataclasses.replace(_status("q", [(0, 10, 3)]), warnings=[
        "the delivery owner (pid 42 on h since t) is stopped (SIGSTOP, a debugger or a "
        "suspended terminal job)"])
    snap = Snapshot(1.0, "d", [warned, _status("calm", [(0, 1, 1)])])
    console = Console(record=True, width=200, color_system=None)
    console.print(render(snap, rates(snap, snap), 1.0, 16))
    text = console.export_text()
    assert "queue q: the delivery owner (pid 42 on h since t) is stopped" in text, text
    assert "queue calm:" not in text
