"""A consumer process that left is not counted as a flow by the operator's views."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import wait_until
from tools_helpers import PARTQ_SCRIPT

import partq


def test_a_consumer_that_left_is_not_counted_as_a_flow(tmp_path):
    """After `partq consume` ends, `partq stats` and `queue list` count no flow of it."""
    import json
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2)
        broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(3)])

    def run(*args):
        proc = subprocess.run([PARTQ_SCRIPT, "--data", str(data), *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout
    run("consume", "q", "--max", "3", "--ack")
    (row,) = json.loads(run("stats", "--json"))["queues"]
    assert (row["flows"], row["active_flows"]) == (0, 0)


# ---------------------------------------------------------------------- flows of exited processes

HOLDER = textwrap.dedent("""
    import sys, time, partq
    with partq.Broker.open(sys.argv[1]) as b:
        flow = b.bind("q")                     # no name: nothing to come back under
        print("bound", sorted(flow.partitions), flow.flow_id, flush=True)
        if sys.argv[2] == "close":
            sys.exit(0)                        # a clean close of the broker
        while True:
            time.sleep(1)                      # killed by the test
""")


def _script(data, *args) -> str:
    proc = subprocess.run([PARTQ_SCRIPT, "--data", str(data), *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _status(data) -> dict:
    import json
    return json.loads(_script(data, "queue", "show", "q", "--json"))["status"]


def _holder(data, how: str) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(data), how],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().split()
    assert line and line[0] == "bound", proc.stderr.read()
    return proc, line[-1]


def test_partq_consume_leaves_when_it_ends_and_the_next_one_takes_over_at_once(tmp_path):
    """After `partq consume` exits its flow is gone (not `bound no, active yes` for good), no
    partition is Unbound, and the next consume gets messages without waiting out the 60 s
    rebalance delay."""
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=60)
        broker.publish_many("q", [(b"m%d" % i, "k") for i in range(3)])
    _script(data, "consume", "q", "--max", "1", "--ack")
    st = _status(data)
    assert st["flows"] == [] and {p["status"] for p in st["partitions"]} == {"Unassigned"}
    started = time.monotonic()
    out = _script(data, "consume", "q", "--max", "1", "--ack", "--timeout", "20")
    assert "m1" in out and time.monotonic() - started < 20


def test_a_consume_beside_a_running_owner_leaves_when_it_ends(tmp_path):
    """`partq consume` in a process whose queue another process delivers, holding a
    partition: once it ends (SIGTERM), the owner no longer lists its flow and the owner's own
    flow takes the partition at once, not after the 60 s rebalance delay."""
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0)
    owner, owner_flow = _holder(data, "stay")
    env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    consume = subprocess.Popen([PARTQ_SCRIPT, "--data", str(data), "consume", "q"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        wait_until(lambda: any(f["flow"] != owner_flow and f["partitions"]
                               for f in _status(data)["flows"]), 30,
                   "the consume holding a partition")
        _script(data, "queue", "update", "q", "--rebalance-delay", "60")
        consume.send_signal(signal.SIGTERM)
        assert consume.wait(timeout=30) == 0, consume.stderr.read()
        st = wait_until(lambda: (lambda s: s if [f["flow"] for f in s["flows"]] == [owner_flow]
                                 else None)(_status(data)), 10, "the consume's flow gone")
        assert {p["status"] for p in st["partitions"]} == {"Ready"}
        assert st["flows"][0]["partitions"] == [0, 1]
    finally:
        for proc in (consume, owner):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.parametrize("how", ["close", "kill"])
def test_the_flow_of_a_process_that_exited_is_gone_from_status(tmp_path, how):
    """Closed cleanly: gone at once. SIGKILL: gone once its consumer_timeout (2 s) passed
    (the rebalance delay is 1 s): not listed `bound no` for good."""
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=1, consumer_timeout=2)
    proc, flow_id = _holder(data, how)
    if how == "close":
        assert proc.wait(timeout=30) == 0
        assert _status(data)["flows"] == []
        return
    assert any(f["flow"] == flow_id for f in _status(data)["flows"])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    st = wait_until(lambda: (lambda s: s if not s["flows"] else None)(_status(data)), 20,
                    "the killed process's flow gone from status")
    assert {p["status"] for p in st["partitions"]} == {"Unassigned"}


def test_rebalance_dry_run_plans_every_partition_after_a_scale_with_no_delivery_running(
        tmp_path):
    """Scaled from 4 to 8 while no process ran delivery: the plan covers partitions 0-7 (it
    planned only 0-3, the count the last owner stored)."""
    import json
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=4, rebalance_delay=0)
        broker.publish("q", b"x")
    _script(data, "consume", "q", "--name", "c", "--max", "1", "--ack", "--timeout", "5")
    _script(data, "scale", "q", "--partitions", "8", "--yes")
    doc = json.loads(_script(data, "rebalance", "q", "--dry-run", "--json"))
    assert doc["unassigned"] == list(range(8))
