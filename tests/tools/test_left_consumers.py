"""A consumer process that left is not counted as a flow by the operator's views."""
from __future__ import annotations

import subprocess

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
