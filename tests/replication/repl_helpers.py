"""Helpers shared by the replication tests and by the process scripts they start.

The tests run a REAL primary and a REAL DR-standby as separate processes (the ``proc_*.py``
scripts of this folder), talking over real sockets on 127.0.0.1, and kill them with SIGKILL.
Scripts and tests exchange small files:

* a *log* file: one line ``idx queue partition seq`` per message, written after ``publish``
  returned (the evidence of what a caller was told is stored);
* a *status* file: one JSON object, replaced atomically (``os.replace``), so a reader never
  sees a torn write, even right after a SIGKILL.

Payloads and keys are functions of the message index, so any stored message can be checked
without keeping the payloads around.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import msgpack
from helpers import wait_until

HERE = Path(__file__).resolve().parent
PY = sys.executable
PAYLOAD_SIZE = 256

# meta keys that are bookkeeping of one side only (never replicated, see storage/txn.py)
LOCAL_META = {b"lsn", b"slots", b"role", b"applied_lsn", b"applied_time_ns", b"standby_id",
              b"timeline", b"timelines", b"applied_crc", b"slots_invalidated", b"followed",
              b"fence_primary", b"fence_error", b"superseded", b"supersede_secret",
              b"snapshot_proof"}
# databases whose content must be identical on a standby that caught up
REPLICATED_DBS = ("queues", "heads", "acks", "log", "state")


# ---------------------------------------------------------------------- messages
def payload(idx: int) -> bytes:
    """256 bytes determined by ``idx`` (and recognisably so in a hex dump)."""
    head = b"msg-%010d-" % idx
    return (head * (PAYLOAD_SIZE // len(head) + 1))[:PAYLOAD_SIZE]


def key(idx: int) -> str | None:
    """Most messages keyed (a few hundred keys), one in eleven unkeyed."""
    return None if idx % 11 == 0 else f"key-{idx % 389}"


# ---------------------------------------------------------------------- files
def write_json(path: str | os.PathLike, obj) -> None:
    """Replace ``path`` atomically with ``obj`` as JSON."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def read_json(path: str | os.PathLike):
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_log(path: str | os.PathLike) -> list[tuple[int, str, int, int]]:
    """Complete lines of a publish log as (idx, queue, partition, seq); extra fields (a time) are
    ignored. A torn last line (the writer was killed mid-write) does not count: its publish is
    not known to have returned."""
    out = []
    try:
        with open(path) as f:
            data = f.read()
    except FileNotFoundError:
        return out
    for line in data.split("\n")[:-1]:
        idx, queue, p, seq = line.split()[:4]
        out.append((int(idx), queue, int(p), int(seq)))
    return out


# ---------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A script of this folder running in its own process, output captured to files."""

    def __init__(self, workdir: Path, name: str, script: str, *args) -> None:
        self.name = name
        self.out = Path(workdir) / f"{name}.out"
        # the scripts import this module and tests/helpers.py (wait_until) by name
        path = [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH")]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(filter(None, path)))
        with open(self.out, "ab") as out:
            self.popen = subprocess.Popen([PY, str(HERE / script), *map(str, args)],
                                          stdout=out, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the process stays, its sockets stay open, it does nothing (a stalled host).
        Returns once the kernel shows it stopped: on a busy machine a signalled process may
        still run for a moment (and, say, ack one more commit)."""
        self.popen.send_signal(signal.SIGSTOP)
        wait_until(lambda: _state(self.popen.pid) in ("T", "t"), 30, "the process stopped")

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM (the scripts close their broker cleanly) and wait; SIGKILL if it hangs."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.name} did not stop within {timeout}s:\n{self.tail()}")
        return self.popen.returncode

    def tail(self, n: int = 4000) -> str:
        try:
            return self.out.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def check_alive(self) -> None:
        if not self.alive():
            raise AssertionError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")


# ---------------------------------------------------------------------- stores
@contextlib.contextmanager
def open_store(path):
    """Open a (stopped) partq directory with ``partq.storage.Store`` for inspection."""
    from partq.storage import Store
    store = Store.open(path, create=False)
    try:
        yield store
    finally:
        store.close()


def dump_db(store, name: str) -> dict[bytes, bytes]:
    """Every key and value of one of the store's LMDB databases, raw."""
    with store.env.begin(db=store.dbs[name]) as txn:
        return {bytes(k): bytes(v) for k, v in txn.cursor()}


def meta_of(path) -> dict[bytes, bytes]:
    with open_store(path) as s:
        return dump_db(s, "meta")


def u64(raw: bytes | None) -> int:
    return 0 if raw is None else int.from_bytes(raw, "big")


def snapshot_queues(path) -> dict:
    """Everything a broker keeps per queue, read through the storage API: config, state blob and,
    per partition, head, ack state (floor, above, delivered mark) and the raw stored records."""
    out = {}
    with open_store(path) as store:
        with store.read() as r:
            for name, config in sorted(r.queues().items()):
                qid = config["qid"]
                parts = {}
                # partitions beyond the count (dropped by scaling down) keep their heads
                for p in range(config["partitions"]):
                    ack = r.ack_state(qid, p)
                    parts[p] = {"head": r.head(qid, p), "floor": ack.floor,
                                "above": sorted(ack.above), "delivered_mark": ack.delivered_mark,
                                "records": r.records(qid, p, 0, 1 << 62)}
                out[name] = {"config": config, "state": r.state(qid), "partitions": parts}
    return out


def compare_stores(primary, standby, limit: int = 20) -> list[str]:
    """Differences between two stopped partq directories, as readable lines (empty: identical).
    Compares every replicated database byte for byte, the replicated meta keys, and the per-queue
    view through the storage API."""
    diffs: list[str] = []
    with open_store(primary) as a, open_store(standby) as b:
        for db in REPLICATED_DBS + ("meta",):
            da, dbb = dump_db(a, db), dump_db(b, db)
            if db == "meta":
                da = {k: v for k, v in da.items() if k not in LOCAL_META}
                dbb = {k: v for k, v in dbb.items() if k not in LOCAL_META}
            if da == dbb:
                continue
            only_a = sorted(set(da) - set(dbb))
            only_b = sorted(set(dbb) - set(da))
            differ = sorted(k for k in set(da) & set(dbb) if da[k] != dbb[k])
            diffs.append(f"db {db}: {len(only_a)} keys only on primary (first {only_a[:3]}), "
                         f"{len(only_b)} only on standby (first {only_b[:3]}), "
                         f"{len(differ)} with different values (first {differ[:3]})")
    qa, qb = snapshot_queues(primary), snapshot_queues(standby)
    if set(qa) != set(qb):
        diffs.append(f"queues differ: primary {sorted(qa)}, standby {sorted(qb)}")
    for name in sorted(set(qa) & set(qb)):
        a, b = qa[name], qb[name]
        if a["config"] != b["config"]:
            diffs.append(f"{name}: config {a['config']} != {b['config']}")
        if a["state"] != b["state"]:
            sa = msgpack.unpackb(a["state"], raw=False) if a["state"] else None
            sb = msgpack.unpackb(b["state"], raw=False) if b["state"] else None
            diffs.append(f"{name}: state blob differs: {sa} != {sb}")
        for p in sorted(set(a["partitions"]) | set(b["partitions"])):
            pa, pb = a["partitions"].get(p), b["partitions"].get(p)
            if pa is None or pb is None:
                diffs.append(f"{name}/{p}: partition only on one side")
                continue
            for field in ("head", "floor", "above", "delivered_mark"):
                if pa[field] != pb[field]:
                    diffs.append(f"{name}/{p}: {field} {pa[field]!r:.80} != {pb[field]!r:.80}")
            if pa["records"] != pb["records"]:
                sa, sb = dict(pa["records"]), dict(pb["records"])
                diffs.append(f"{name}/{p}: records differ: {len(sa)} vs {len(sb)}, missing on "
                             f"standby {sorted(set(sa) - set(sb))[:5]}, extra "
                             f"{sorted(set(sb) - set(sa))[:5]}, changed "
                             f"{[s for s in sorted(set(sa) & set(sb)) if sa[s] != sb[s]][:5]}")
    return diffs[:limit]


def stored_payloads(path) -> dict[tuple[str, int, int], bytes]:
    """(queue, partition, seq) -> payload of every record stored in a stopped directory."""
    from partq.storage import decode_record
    out = {}
    for name, q in snapshot_queues(path).items():
        for p, part in q["partitions"].items():
            for seq, raw in part["records"]:
                out[(name, p, seq)] = decode_record(raw, name, p, seq).payload
    return out


def _state(pid: int) -> str:
    """The process's state letter in /proc (R running, S sleeping, T stopped, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
