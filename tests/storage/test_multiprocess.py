"""Several processes on one directory: concurrent appends and stale reader slots.

The helpers run as ``python -c`` subprocesses (not multiprocessing), so they import partq exactly
as a user's process would. They run with the repository root on PYTHONPATH, which makes them
independent of how the virtualenv was installed.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from partq.storage import Store, decode_record

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 120

WRITER = r"""
import json, sys
from partq.storage import Store, encode_record
path, name, qid, partitions, n, map_size, durability = sys.argv[1:8]
qid, partitions, n, map_size = int(qid), int(partitions), int(n), int(map_size)
store = Store.open(path, map_size=map_size, durability=durability)
print("ready", flush=True)
assert sys.stdin.readline().strip() == "go"
placed = []
for i in range(n):
    p = i % partitions
    record = encode_record(i, name, {"proc": name, "i": i}, b"%s:%d" % (name.encode(), i))
    placed.append((p, store.write(lambda w: w.append(qid, p, [record]))))
grown = store.env.info()["map_size"]
store.close()
print(json.dumps({"placed": placed, "map_size": grown}), flush=True)
"""

HOLD_READ = r"""
import sys, time
from partq.storage import Store
store = Store.open(sys.argv[1])
with store.read() as r:
    r.head(1, 0)
    print("ready", flush=True)
    time.sleep(600)     # holds the read transaction until the test kills this process
"""

HOLD_OPEN = r"""
import sys, time
from partq.storage import Store
store = Store.open(sys.argv[1])
print("ready", flush=True)
time.sleep(600)         # keeps the store open until the test kills this process
"""


def spawn(script: str, *args) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        out, _ = proc.communicate(timeout=TIMEOUT)
        pytest.fail(f"helper did not start: {line!r} {out!r}")
    return proc


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:  # only the helpers this test started
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=TIMEOUT)


def make_queue(path, partitions: int) -> int:
    with Store.open(path) as store:
        def op(w):
            qid = w.allocate_qid()
            w.put_queue("q", {"name": "q", "qid": qid, "partitions": partitions})
            for p in range(partitions):
                w.init_partition(qid, p)
            return qid
        return store.write(op)


# "async" skips only the fsync: what is under test is how two processes share the log, and 4000
# fsynced commits would take 2-20 s depending on the disk. One sync run keeps fsync covered.
@pytest.mark.parametrize("partitions,durability,n", [(1, "async", 2000), (2, "async", 2000),
                                                     (2, "sync", 300)])
def test_two_processes_append_to_the_same_partitions(tmp_path, procs, partitions, durability, n):
    path = tmp_path / "d"
    qid = make_queue(path, partitions)
    # A 64 KiB initial map: both processes must grow it, and adopt the other's growth.
    map_size = 64 << 10 if n >= 2000 else 16 << 10
    for name in ("A", "B"):
        procs.append(spawn(WRITER, path, name, qid, partitions, n, map_size, durability))
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = {}
    for name, proc in zip(("A", "B"), procs, strict=True):
        out, _ = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"writer {name} failed"
        results[name] = json.loads(out.strip().splitlines()[-1])

    with Store.open(path) as store, store.read() as r:
        heads = [r.head(qid, p) for p in range(partitions)]
        log = {p: r.records(qid, p, 0, 10 * n) for p in range(partitions)}
        decoded = {(p, seq): decode_record(raw, "q", p, seq) for p in log for seq, raw in log[p]}
    assert sum(heads) == 2 * n
    for p in range(partitions):
        seqs = [seq for seq, _ in log[p]]
        assert seqs == list(range(heads[p])), f"partition {p}: gaps or duplicates in the log"
    assert len(decoded) == 2 * n
    if partitions == 1:
        assert heads == [2 * n]

    # Every record a process was told it wrote is where it was told, with its content.
    for name, result in results.items():
        placed = result["placed"]
        assert len(placed) == n and len(set(map(tuple, placed))) == n
        for i, (p, seq) in enumerate(placed):
            rec = decoded[(p, seq)]
            assert rec.payload == b"%s:%d" % (name.encode(), i)
            assert rec.key == name and rec.headers == {"proc": name, "i": i}
        assert result["map_size"] > map_size  # the map grew in both processes
    # Every stored record belongs to exactly one writer's acknowledged appends.
    owners = {tuple(pos): name for name, res in results.items() for pos in res["placed"]}
    assert set(owners) == set(decoded)
    # The two writers really overlapped: their records interleave in the log.
    order = [owners[(0, seq)] for seq, _ in log[0]]
    switches = sum(a != b for a, b in zip(order, order[1:], strict=False))
    assert switches >= 2, "the writers ran one after the other; the test proved nothing"


def test_killed_readers_slot_is_cleared_on_next_open(tmp_path, procs):
    """A process killed while it holds a read transaction leaves its slot in lock.mdb's reader
    table; it would pin old pages forever. The next open clears it and says so.

    LMDB resets the whole reader table when an environment is opened by the only process using
    it, so the stale slot is only *observable* while another process keeps the store open: the
    holder below. Without it the table is reset on open and the report shows 0, which is just
    as safe."""
    path = tmp_path / "d"
    make_queue(path, 1)
    holder = spawn(HOLD_OPEN, path)
    procs.append(holder)
    reader = spawn(HOLD_READ, path)
    procs.append(reader)
    reader.send_signal(signal.SIGKILL)
    reader.wait(timeout=TIMEOUT)
    assert reader.returncode == -signal.SIGKILL

    with Store.open(path) as store:
        assert store.report.stale_readers_cleared >= 1
        assert store.report.as_dict()["stale_readers_cleared"] >= 1
        with store.read() as r:
            assert r.queue("q") is not None
    assert holder.poll() is None  # the live process was left alone


def test_live_readers_are_not_cleared(tmp_path, procs):
    path = tmp_path / "d"
    make_queue(path, 1)
    procs.append(spawn(HOLD_READ, path))
    with Store.open(path) as store:
        assert store.report.stale_readers_cleared == 0
