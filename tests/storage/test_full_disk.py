"""A full disk, on a real small tmpfs: publishes fail with a typed ``StorageFull`` that says what
to do, acks keep working so that `partq consume --ack` drains the queue, nothing is reported as
damaged that is not, and publishing resumes once space is freed.

The mount needs the right to mount (root, or a user namespace): without it these tests skip
(``small_disk``, in conftest.py)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest
from helpers import drain, wait_until
from store_helpers import fill

import partq

MiB = 1 << 20


def cli(*args, data) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partq", "--data", str(data), *args],
                          capture_output=True, text=True, timeout=120)


def test_a_full_disk_refuses_publishes_drains_and_recovers(small_disk):
    store = small_disk / "store"
    payloads = [f"m{i:05d}".encode() + os.urandom(1000) for i in range(2000)]
    with partq.Broker.open(store) as b:
        b.create_queue("q", partitions=2)
        for i in range(0, len(payloads), 100):
            b.publish_many("q", payloads[i:i + 100])
    fill(small_disk / "filler")
    shown = cli("stats", "--json", data=store)         # another process can tell
    assert shown.returncode == 0 and json.loads(shown.stdout)["store"]["disk_full"] is True

    with partq.Broker.open(store) as b:
        with pytest.raises(partq.StorageFull) as info:
            b.publish("q", b"one more")
        assert "full disk" in str(info.value) and "acks still run" in str(info.value)
        assert b.queue_status("q").depth == 2000
        assert b.store.usage()["disk_full"] is True

    drained = cli("consume", "q", "--ack", "--max", "5000", "--timeout", "2", "--json",
                  data=store)
    assert drained.returncode == 0, drained.stderr
    got = sorted(base64.b64decode(json.loads(line)["payload"])[:6]
                 for line in drained.stdout.splitlines())
    assert got == sorted(p[:6] for p in payloads)

    checked = cli("verify", "--json", data=store)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    with partq.Broker.open(store) as b:
        assert b.queue_status("q").depth == 0
        with pytest.raises(partq.StorageFull):     # still no room for the reserve
            b.publish("q", b"too early")
        os.unlink(small_disk / "filler")

        def published() -> bool:
            try:
                b.publish("q", b"after", key="k")
            except partq.StorageFull:
                return False
            return True
        wait_until(published, 10, "a publish once the disk has room again")
        assert b.store.usage()["disk_full"] is False
        flow = b.bind("q", "c")
        assert [m.payload for m in flow.receive(10, timeout=30)] == [b"after"]


def test_a_commit_the_disk_cuts_short_is_storage_full_and_keeps_nothing(small_disk):
    """LMDB reports a commit it could write only in part as an I/O error: on a full disk that
    is StorageFull, not a damaged store, and the batch left nothing."""
    store = small_disk / "store"
    with partq.Broker.open(store) as b:
        b.create_queue("q")
        b.publish("q", b"first")
        big = [os.urandom(100 << 10) for _ in range(400)]        # 40 MiB in one commit
        with pytest.raises(partq.StorageFull) as info:
            b.publish_many("q", big)
        assert "full" in str(info.value) and "CorruptStore" not in repr(info.value)
        assert b.queue_status("q").depth == 1
        flow = b.bind("q", "c")
        assert [m.payload for m in drain(flow, timeout=0.5)] == [b"first"]
    checked = cli("verify", "--json", data=store)
    assert checked.returncode == 0, checked.stdout + checked.stderr
