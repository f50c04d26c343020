"""`partq standby` and `partq dr status|promote` against a real primary over 127.0.0.1."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import wait_until

import partq

PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")


def run(*args, data):
    return subprocess.run([PARTQ, "--data", str(data), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.timeout(120)
def test_standby_follows_then_dr_promote_stops_it_and_keeps_named_partitions(tmp_path):
    primary_dir, standby_dir = tmp_path / "primary", tmp_path / "standby"
    primary = partq.Broker.open(primary_dir, replication_listen="127.0.0.1:0")
    proc = None
    try:
        primary.create_queue("orders", partitions=4, rebalance_delay=30.0)
        flow = primary.bind("orders", name="svc-a")
        held = sorted(flow.partitions)
        primary.publish_many("orders", [(b"m%d" % i, f"k{i}") for i in range(500)])
        proc = subprocess.Popen([PARTQ, "--data", str(standby_dir), "standby", "--primary",
                                 primary.replication_address, "--interval", "0.2", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        wait_until(lambda: primary.replication_status().connected, 30, "the standby to connect")
        primary.publish("orders", b"late", key="k1")   # after the slot exists: it gets an LSN

        def caught_up():
            st = primary.replication_status()
            return st.connected and st.applied_lsn >= st.head_lsn > 0
        wait_until(caught_up, 30, "the standby to catch up")
        first = json.loads(proc.stdout.readline())
        assert first["role"] == "standby" and first["primary"] == primary.replication_address

        status = run("dr", "status", "--json", data=standby_dir)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert doc["role"] == "standby" and doc["standby_process"].startswith(f"pid {proc.pid} ")
        again = run("standby", "--primary", primary.replication_address, data=standby_dir)
        assert again.returncode == 1 and "already followed" in again.stderr
    finally:
        primary.close()

    promoted = run("dr", "promote", "--json", data=standby_dir)
    assert promoted.returncode == 0, promoted.stderr
    assert json.loads(promoted.stdout)["promoted"] is True
    assert proc.wait(10) == 0                       # the standby process was stopped cleanly
    with partq.Broker.open(standby_dir) as b:
        assert b.queue_status("orders").depth == 501
        assert sorted(b.bind("orders", name="svc-a").partitions) == held
        b.publish("orders", b"after promote", key="k2")


def test_dr_status_on_a_plain_store_and_promote_refused(tmp_path):
    assert run("init", data=tmp_path / "d").returncode == 0
    status = run("dr", "status", data=tmp_path / "d")
    assert status.returncode == 0 and "no DR-standby attached" in status.stdout
    refused = run("dr", "promote", data=tmp_path / "d")
    assert refused.returncode == 1 and refused.stderr.startswith("Error: ")
    assert len(refused.stderr.strip().splitlines()) == 1
