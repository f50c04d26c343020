"""Opening on a full disk, on a real small tmpfs: creating a store (``partq init``,
``Broker.open`` of a new directory) or opening one whose ``lock.mdb`` must be made again is a
typed ``StorageFull`` that says how much room is needed, never a process killed by SIGBUS
(LMDB writes its lock file through a memory map, which a full disk cannot back), and leaves
nothing that later commands misread: once space is freed, the directory opens as it should.

The mount needs the right to mount (root, or a user namespace): without it these tests skip
(``small_disk``, in conftest.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import run_child
from store_helpers import fill

import partq

KiB = 1 << 10

OPEN = """
    import json, sys, partq
    try:
        with partq.Broker.open(sys.argv[1]) as b:
            out = {"opened": True, "queues": [c.name for c in b.queues()]}
    except partq.PartqError as exc:
        out = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(out))
"""


def cli(*args, data) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partq", "--data", str(data), *args],
                          capture_output=True, text=True, timeout=120)


def assert_storage_full(done: subprocess.CompletedProcess, *fragments: str) -> str:
    """A clean refusal: exit status 1 (not a signal), one error line saying what is needed."""
    assert done.returncode == 1, f"exit {done.returncode} (a negative one is a signal): {done.stderr}"
    line = done.stderr.strip()
    assert line.count("\n") == 0 and line.startswith("Error: "), done.stderr
    for fragment in fragments:
        assert fragment in line, line
    return line


# no room at all; room for a page or two of lock.mdb only; room for lock.mdb but not data.mdb
@pytest.mark.parametrize("leave", [0, 16 * KiB, 72 * KiB])
def test_creating_a_store_on_a_full_disk_is_storage_full_and_leaves_no_half_store(small_disk,
                                                                                  leave):
    store = small_disk / "store"
    fill(small_disk / "filler", leave)

    line = assert_storage_full(cli("init", data=store), "cannot create a partq store",
                               "disk holding it is full", "needs about", "KiB", "free space")
    opened = run_child(OPEN, store)
    assert opened.returncode == 0, f"the child died ({opened.returncode}): {opened.stderr[-2000:]}"
    out = json.loads(opened.stdout)
    assert out["error"] == "StorageFull" and "needs about" in out["message"], out
    assert not (store / "data.mdb").exists(), line           # no store that is not one
    said = cli("stats", data=store)
    assert said.returncode == 1 and "holds no partq store" in said.stderr, said.stderr

    os.unlink(small_disk / "filler")
    assert cli("init", data=store).returncode == 0
    assert cli("queue", "create", "q", data=store).returncode == 0
    assert cli("publish", "q", "hello", data=store).returncode == 0
    consumed = cli("consume", "q", "--ack", "--max", "1", "--timeout", "10", "--json", data=store)
    assert consumed.returncode == 0 and json.loads(consumed.stdout)["payload"] == "hello"


def test_opening_a_store_whose_lock_file_is_gone_on_a_full_disk(small_disk):
    """``lock.mdb`` is made again by the first open after it was removed (a clean-up, a copy
    without it): on a full disk that open is refused, and the store is untouched."""
    store = small_disk / "store"
    with partq.Broker.open(store) as b:
        b.create_queue("q")
        b.publish("q", b"kept")
    os.unlink(store / "lock.mdb")
    fill(small_disk / "filler")

    opened = run_child(OPEN, store)
    assert opened.returncode == 0, f"the child died ({opened.returncode}): {opened.stderr[-2000:]}"
    out = json.loads(opened.stdout)
    assert out["error"] == "StorageFull" and "lock.mdb needs" in out["message"], out
    assert_storage_full(cli("publish", "q", "more", data=store), "lock.mdb needs", "free space")

    os.unlink(small_disk / "filler")
    out = json.loads(run_child(OPEN, store).stdout)
    assert out == {"opened": True, "queues": ["q"]}
    consumed = cli("consume", "q", "--ack", "--max", "1", "--timeout", "10", "--json", data=store)
    assert consumed.returncode == 0 and json.loads(consumed.stdout)["payload"] == "kept"
