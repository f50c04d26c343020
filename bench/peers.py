#!/usr/bin/env python3
"""partq side by side with its peers: publish, consume and open, at the same durability.

Every figure is measured in this run on this machine, 256-byte payloads, and every system is set
up so that a publish (put, XADD) or an ack returns only after its data was fsynced:

* partq: ``Broker.open(durability="sync")`` (LMDB ``sync=True``: fdatasync before the commit
  returns; group commit shares one among concurrent publishers), a 4-partition keyed queue.
* raw py-lmdb, the physical limit: ``lmdb.open(sync=True)``, one write transaction per batch, one
  ``txn.put`` of the payload per message under a 16-byte big-endian key.
* persist-queue: ``persistqueue.SQLiteAckQueue(path, auto_commit=True)``. It opens SQLite in WAL
  mode and leaves ``synchronous`` at SQLite's default, which for this build is FULL (read back
  from the connection and recorded in peers.md): in WAL mode FULL syncs the WAL at every commit,
  so each put (and each get, and each ack: every one is its own commit) is fsynced. The bench
  sets ``PRAGMA synchronous=FULL`` explicitly anyway, so a different SQLite default cannot
  weaken it. Items are pickled (its API); ``get`` marks a row unacked (a commit), ``ack`` marks
  it acked (a commit).
* litequeue: ``LiteQueue(path)`` sets ``PRAGMA synchronous=NORMAL`` in WAL mode, which does NOT
  sync a commit (only checkpoints): it is not durable per put. The bench sets
  ``PRAGMA synchronous=FULL`` after construction to make it so. Its payloads are ``str``: a
  256-character ASCII string.
* Redis: a ``redis-server`` started by this bench on 127.0.0.1 (a free port, data in a temp
  folder) with ``--appendonly yes --appendfsync always --save ''``, checked with CONFIG GET
  before use: the AOF is fdatasynced before the replies of an event-loop iteration are sent, so
  an XADD (or a pipeline of them, or an XREADGROUP/XACK) has been fsynced when its reply
  arrives. AOF auto-rewrite is turned off (``--auto-aof-rewrite-percentage 0``) so a background
  rewrite does not compete for the disk mid-measurement; it has no bearing on durability. The
  ``redis`` Python client over loopback TCP; the server is stopped by its pid at the end, also on
  errors. When ``redis-server`` is not on PATH, the Redis lines say ``skipped``.

Publish: partq ``publish`` from 1 thread and from 32 threads, ``publish_async`` from 1 thread
with 64 in flight (a message counts once durable), ``publish_many`` with 100 and 1000 per batch; raw
LMDB with 1, 32, 100 and 1000 puts per transaction; raw LMDB group commit (1 and
32 Python threads each blocking until a committing thread's fsynced transaction holds its put:
the ceiling of the 32-threads-vs-1 ratio for any Python broker with blocking publishers);
persist-queue ``put``; litequeue ``put``; Redis ``XADD`` one at a time and pipelined by 100.
Raw LMDB doing the same necessary work as ``publish_many(1000)`` (records of partq's size,
each msgpack-framed with a crc32c, encoded in the loop, in partq's chunk layout; see
bench/workloads.py) is the peer of its 0.85x target; bare raw puts stay as context.
Method (bench/method.py): all systems of a group run slice after slice, one warm-up round, then
``--rounds`` rounds (7 by default), ``--seconds`` per system in all; each figure is the median
of its rounds and each ratio the median of the rounds' ratios (``ratio_min``/``ratio_max``
beside it), so that all see the same disk while its speed drifts (others share this machine).
The first line, ``load_average_at_start``, carries the load average and CPU count.

Consume: each slice pre-fills a fresh queue (untimed; with fsyncs off where the system allows it)
and then times draining it: partq ``receive(100)`` + ``ack_many`` with 1 flow (bound to all 4
partitions of a 4-partition queue) and with 4 flows (4 threads, each its own flow holding one
partition of the same kind of queue); persist-queue ``get`` + ``ack`` per message; litequeue
``pop`` + ``done`` per message; Redis ``XREADGROUP COUNT 100`` + ``XACK`` of those 100 ids,
unpipelined. partq once more with ``ack_many_async``: each flow receives its next 100 while the
previous acks commit, and counts a message once its ack is durable. A slice stops when drained or
after its share of ``--seconds``.

Open: ``Broker.open`` + ``queue_status`` + ``close`` on a directory holding 1M, 5M and 10M
messages (``--sizes``), median of ``--open-reps`` after one untimed open (the page cache is
warm: the bench does not drop caches on a shared machine). The directories are built once
(``publish_many`` by 10,000, ``durability="async"``, then the data file is fsynced; each size
starts from a copy of the next smaller one) under ``--cache`` and reused by later runs; a size
whose directory would not fit in the free space is skipped with the reason.

Output: one JSON object per line on stdout, each with ``name``, ``unit``, ``value``, ``peer``,
``peer_value`` and ``ratio`` (``value / peer_value``: partq over peer for throughputs; for open
times the peer is the smallest size's time). A peer that cannot run gives a line with
``"skipped": "<reason>"`` and null figures, never a number; a partq figure whose peer was
skipped keeps its value and says why it has no ratio in ``"peer_skipped"``. The lines are also
written to
``OUT/peers.jsonl`` with a Markdown table (``OUT/peers.md``, including the targets and whether
they pass) and a log-scale bar chart of the throughputs (``OUT/peers.png``, if matplotlib is
installed). ``--out`` defaults to bench/results; with ``--quick`` nothing is written unless
``--out`` is given.

Usage: ``python bench/peers.py [--quick] [--seconds S] [--rounds N] [--sizes 1M,5M,10M]
[--cache DIR] [--out DIR]``. ``--quick`` is a smoke run (well under 30 s; open sizes 10k and
50k) whose numbers mean little.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from statistics import median

import lmdb
from method import DEFAULT_PAIRS, Skip, header, interleave, ratios
from workloads import (
    KEYS,
    PARTITIONS,
    PAYLOAD,
    partq_broker,
    partq_publish,
    partq_publish_async,
    partq_publish_many,
    raw_lmdb_group_commit,
    raw_lmdb_partitioned_puts,
    raw_lmdb_puts,
    raw_lmdb_same_work,
    repeat_rate,
    scratch_dir,
    threads_rate,
    timed_rate,
)

import partq

PAYLOAD_STR = ("0123456789abcdef" * 16)          # litequeue stores text: 256 ASCII characters
REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results"
BYTES_PER_MSG_GUESS = 500          # on-disk bytes per 256-byte message before one was measured


# ---------------------------------------------------------------------------- output
class Report:
    def __init__(self) -> None:
        self.lines: list[dict] = []
        self.by_name: dict[str, dict] = {}
        self.samples: dict[str, list[float]] = {}

    def emit(self, name: str, unit: str, value: float | None, peer: str | None = None,
             skipped: str | None = None, digits: int = 1, samples: list[float] | None = None,
             **extra) -> dict:
        """``samples``: the figure of each interleaved round (bench/method.py); beside a peer
        that has them too, the ratio is the median of the rounds' ratios, with min and max."""
        assert name not in self.by_name, name
        line = {"name": name, "unit": unit,
                "value": None if value is None else round(value, digits),
                "peer": peer, "peer_value": None, "ratio": None}
        if samples:
            self.samples[name] = samples
        if peer is not None:
            ref = self.by_name[peer]
            line["peer_value"] = ref["value"]
            if ref["value"] is None:
                line["peer_skipped"] = ref.get("skipped") or "no figure"
            elif line["value"] is not None and samples and self.samples.get(peer):
                rs = ratios(samples, self.samples[peer])
                if rs:
                    line.update(ratio=round(median(rs), 3), ratio_min=round(min(rs), 3),
                                ratio_max=round(max(rs), 3), pairs=len(rs))
            elif line["value"] is not None and ref["value"]:
                line["ratio"] = round(line["value"] / ref["value"], 3)  # of the printed figures
        if skipped:
            line["skipped"] = skipped
        line.update(extra)
        self.lines.append(line)
        self.by_name[name] = line
        print(json.dumps(line), flush=True)
        return line

    def skip(self, name: str, unit: str, reason: str) -> dict:
        return self.emit(name, unit, None, skipped=reason)


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- partq
def partq_prefill(path: str, count: int) -> None:
    """A 4-partition keyed queue with ``count`` messages, written without fsyncs, then synced."""
    with partq_broker(path, durability="async") as b:
        batch = 10_000
        items = [(PAYLOAD, KEYS[i % 1024]) for i in range(batch)]
        left = count
        while left > 0:
            b.publish_many("q", items[:min(batch, left)])
            left -= batch
    fsync_file(os.path.join(path, "data.mdb"))


def partq_consume(flows: int, prefill: int, seconds: float, pipelined: bool = False) -> float:
    """receive(100) + ack_many, ``flows`` threads each with its own flow, until drained. With
    ``pipelined`` each flow acks with ``ack_many_async`` and receives its next batch while the
    acks commit; a message counts once its ack is durable (``Pending.result()``)."""
    with scratch_dir() as path:
        partq_prefill(path, prefill)
        with partq_broker(path, create=False) as b:
            bound = [b.bind("q", name=f"consumer-{i}") for i in range(flows)]
            give_up = time.monotonic() + 10
            while not all(len(f.partitions) == PARTITIONS // flows for f in bound):
                if time.monotonic() > give_up:
                    raise RuntimeError(f"{flows} flows on {PARTITIONS} partitions did not settle "
                                       f"to an even split within 10 s: "
                                       f"{[sorted(f.partitions) for f in bound]}")
                time.sleep(0.005)

            def consumer(i: int, end: float) -> int:
                flow, n = bound[i], 0
                while time.perf_counter() < end:
                    msgs = flow.receive(100, timeout=0)
                    if not msgs:
                        break
                    flow.ack_many(msgs)
                    n += len(msgs)
                return n

            def pipelined_consumer(i: int, end: float) -> int:
                flow, n, previous = bound[i], 0, None
                while time.perf_counter() < end:
                    msgs = flow.receive(100, timeout=0)
                    if not msgs:
                        break
                    pending = flow.ack_many_async(msgs)
                    if previous is not None:
                        previous[0].result()
                        n += previous[1]
                    previous = (pending, len(msgs))
                if previous is not None:
                    previous[0].result()
                    n += previous[1]
                return n

            return threads_rate(pipelined_consumer if pipelined else consumer, flows, seconds)[0]


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------- raw LMDB
# ---------------------------------------------------------------------------- persist-queue
SQLITE_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def persistqueue_default_sync() -> str:
    """What SQLiteAckQueue gives without being told: journal mode and synchronous level."""
    import persistqueue
    with scratch_dir() as path:
        q = persistqueue.SQLiteAckQueue(path, auto_commit=True)
        try:
            mode = q._putter.execute("PRAGMA journal_mode").fetchone()[0]
            level = q._putter.execute("PRAGMA synchronous").fetchone()[0]
        finally:
            q.close()
    return f"journal_mode={mode}, synchronous={SQLITE_SYNC_NAMES.get(level, level)}"


@contextmanager
def persistqueue_queue():
    try:
        import persistqueue
    except ImportError as exc:
        raise Skip(f"persist-queue is not installed ({exc}); pip install persist-queue") from None
    with scratch_dir() as path:
        q = persistqueue.SQLiteAckQueue(path, auto_commit=True)
        try:
            q._putter.execute("PRAGMA synchronous=FULL")  # = its default here; stated, not assumed
            assert q._putter is q._getter  # one connection (multithreading=False)
            yield q
        finally:
            q.close()


def persistqueue_put(seconds: float) -> float:
    with persistqueue_queue() as q:
        q.put(PAYLOAD)
        return repeat_rate(lambda: q.put(PAYLOAD), 1, seconds)


def persistqueue_get_ack(prefill: int, seconds: float) -> float:
    with persistqueue_queue() as q:
        from persistqueue.exceptions import Empty
        q._putter.execute("PRAGMA synchronous=OFF")   # untimed pre-fill
        for _ in range(prefill):
            q.put(PAYLOAD)
        q._putter.execute("PRAGMA synchronous=FULL")
        q._putter.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        def loop(deadline: float) -> int:
            n = 0
            while time.perf_counter() < deadline:
                try:
                    item = q.get(block=False, raw=True)
                except Empty:
                    break
                q.ack(id=item["pqid"])
                n += 1
            return n
        return timed_rate(loop, seconds)


# ---------------------------------------------------------------------------- litequeue
@contextmanager
def litequeue_queue():
    try:
        from litequeue import LiteQueue
    except ImportError as exc:
        raise Skip(f"litequeue is not installed ({exc}); pip install litequeue") from None
    with scratch_dir() as path:
        q = LiteQueue(os.path.join(path, "queue.sqlite3"))
        try:
            q.conn.execute("PRAGMA synchronous=FULL")    # it sets NORMAL: not durable per put
            yield q
        finally:
            q.conn.close()


def litequeue_put(seconds: float) -> float:
    with litequeue_queue() as q:
        q.put(PAYLOAD_STR)
        return repeat_rate(lambda: q.put(PAYLOAD_STR), 1, seconds)


def litequeue_pop_done(prefill: int, seconds: float) -> float:
    with litequeue_queue() as q:
        q.conn.execute("PRAGMA synchronous=OFF")      # untimed pre-fill
        with q.transaction():
            for _ in range(prefill):
                q.put(PAYLOAD_STR)
        q.conn.execute("PRAGMA synchronous=FULL")
        q.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

        def loop(deadline: float) -> int:
            n = 0
            while time.perf_counter() < deadline:
                msg = q.pop()
                if msg is None:
                    break
                q.done(msg.message_id)
                n += 1
            return n
        return timed_rate(loop, seconds)


# ---------------------------------------------------------------------------- Redis
class RedisServer:
    """A redis-server child with fsync-always AOF on a free loopback port, in a temp folder."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.dir: str | None = None
        self.client = None
        self.version = ""
        self._streams = 0

    def start(self) -> None:
        try:
            import redis
        except ImportError as exc:
            raise Skip(f"the redis Python client is not installed ({exc}); pip install redis") \
                from None
        binary = shutil.which("redis-server")
        if binary is None:
            raise Skip("redis-server is not on PATH (Debian: apt-get install -y redis-server)")
        self.version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                      timeout=10).stdout.strip()
        self.dir = tempfile.mkdtemp(prefix="partq-bench-redis-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--auto-aof-rewrite-percentage", "0", "--daemonize", "no",
             "--logfile", os.path.join(self.dir, "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client = redis.Redis(host="127.0.0.1", port=port)
        give_up = time.monotonic() + 15
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace").strip()
                raise Skip(f"redis-server exited with {self.proc.returncode} at start: "
                           f"{err or self._log_tail()}")
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > give_up:
                    raise Skip(f"redis-server did not answer on 127.0.0.1:{port} within 15 s")
                time.sleep(0.02)
        config = {**client.config_get("appendonly"), **client.config_get("appendfsync")}
        if config != {"appendonly": "yes", "appendfsync": "always"}:
            raise Skip(f"redis-server did not take the durability settings: {config}")
        self.client = client
        log(f"started {self.version.split(' sha')[0]} pid {self.proc.pid} on 127.0.0.1:{port}")

    def _log_tail(self) -> str:
        try:
            return Path(self.dir, "redis.log").read_text().strip().splitlines()[-1]
        except (OSError, IndexError, TypeError):
            return "no log"

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()                       # SIGTERM to its pid
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.proc = self.client = self.dir = None

    @contextmanager
    def stream(self):
        self._streams += 1
        name = f"bench-{self._streams}"
        try:
            yield name
        finally:
            self.client.delete(name)

    def xadd(self, pipeline: int, seconds: float) -> float:
        r = self.client
        fields = {"p": PAYLOAD}
        with self.stream() as s:
            r.xadd(s, fields)
            if pipeline == 1:
                return repeat_rate(lambda: r.xadd(s, fields), 1, seconds)

            def send() -> None:
                pipe = r.pipeline(transaction=False)
                for _ in range(pipeline):
                    pipe.xadd(s, fields)
                pipe.execute()
            return repeat_rate(send, pipeline, seconds)

    def xreadgroup_xack(self, prefill: int, seconds: float) -> float:
        r = self.client
        fields = {"p": PAYLOAD}
        with self.stream() as s:
            for start in range(0, prefill, 1000):               # untimed pre-fill
                pipe = r.pipeline(transaction=False)
                for _ in range(min(1000, prefill - start)):
                    pipe.xadd(s, fields)
                pipe.execute()
            r.xgroup_create(s, "g", id="0")

            def loop(deadline: float) -> int:
                n = 0
                while time.perf_counter() < deadline:
                    got = r.xreadgroup("g", "c", {s: ">"}, count=100)
                    ids = [mid for mid, _ in got[0][1]] if got else []
                    if not ids:
                        break
                    r.xack(s, "g", *ids)
                    n += len(ids)
                return n
            return timed_rate(loop, seconds)


# ---------------------------------------------------------------------------- open
def parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    mult = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * mult)


def size_label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def dir_bytes(path: str) -> int:
    total = 0
    for entry in os.scandir(path):
        if entry.is_file(follow_symlinks=False):
            total += entry.stat().st_blocks * 512
    return total


def open_once(path: str) -> tuple[float, int]:
    start = time.perf_counter()
    b = partq.Broker.open(path)
    try:
        depth = b.queue_status("q").depth
    finally:
        b.close()
    return (time.perf_counter() - start) * 1000, depth


def build_open_dir(cache: Path, n: int, notes: dict) -> Path:
    """The cached directory holding ``n`` messages, built (from a copy of the largest smaller
    one, if any) when missing or unusable. Raises Skip when it would not fit on the disk."""
    final = cache / f"open-{n}"
    if final.is_dir():
        try:
            _, depth = open_once(str(final))
            if depth == n:
                return final
            log(f"{final} holds {depth} messages, not {n}: rebuilding")
        except Exception as exc:  # e.g. an older storage format: rebuild it
            log(f"{final} cannot be opened ({exc!r}): rebuilding")
        shutil.rmtree(final)
    bases = sorted((int(p.name.split("-")[1]), p) for p in cache.glob("open-*")
                   if p.is_dir() and p.name.split("-")[1].isdigit()
                   and int(p.name.split("-")[1]) < n)
    base_n, base = bases[-1] if bases else (0, None)
    per_msg = notes.get("bytes_per_msg") or BYTES_PER_MSG_GUESS
    need = int(n * per_msg * 1.25) + (256 << 20)
    free = shutil.disk_usage(cache).free
    if need > free:
        raise Skip(f"a {n:,}-message directory needs ~{need / 1e9:.1f} GB in {cache}; "
                   f"{free / 1e9:.1f} GB free")
    partial = cache / f"open-{n}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    start = time.perf_counter()
    if base is not None:
        shutil.copytree(base, partial)
        log(f"building {n:,} messages from a copy of {base_n:,} in {partial} "
            f"(~{need / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free)")
        with partq_broker(str(partial), durability="async", create=False) as b:
            _fill(b, n - base_n)
    else:
        log(f"building {n:,} messages in {partial} "
            f"(~{need / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free)")
        with partq_broker(str(partial), durability="async") as b:
            _fill(b, n)
    fsync_file(str(partial / "data.mdb"))
    partial.rename(final)
    log(f"built {final} in {time.perf_counter() - start:.0f} s")
    return final


def _fill(b, count: int) -> None:
    batch = 10_000
    items = [(PAYLOAD, KEYS[i % 1024]) for i in range(batch)]
    done, last_note = 0, time.monotonic()
    while done < count:
        b.publish_many("q", items[:min(batch, count - done)])
        done += min(batch, count - done)
        if time.monotonic() - last_note > 15:
            log(f"  ... {done:,}/{count:,}")
            last_note = time.monotonic()


def open_bench(report: Report, sizes: list[int], cache: Path, reps: int, notes: dict) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    ref = None
    for n in sorted(sizes):
        name = f"partq_open_{size_label(n)}_msgs"
        try:
            path = build_open_dir(cache, n, notes)
        except Skip as exc:
            report.skip(name, "ms", str(exc))
            continue
        size = dir_bytes(str(path))
        notes["bytes_per_msg"] = size / n
        notes.setdefault("open_dirs", []).append((n, size))
        open_once(str(path))                                   # untimed: warm the page cache
        times = []
        for _ in range(reps):
            ms, depth = open_once(str(path))
            if depth != n:
                raise RuntimeError(f"{path} reports depth {depth}, expected {n}")
            times.append(ms)
        report.emit(name, "ms", median(times), peer=ref, digits=2)
        ref = ref or name


# ---------------------------------------------------------------------------- main
COMPARISONS = [
    # name, partq metric, peer metric
    ("partq_publish_1_thread", None, "raw_lmdb_put_batch_1"),
    ("partq_publish_1_thread_vs_persistqueue_put", "partq_publish_1_thread", "persistqueue_put"),
    ("partq_publish_1_thread_vs_litequeue_put", "partq_publish_1_thread", "litequeue_put"),
    ("partq_publish_1_thread_vs_redis_xadd", "partq_publish_1_thread", "redis_xadd"),
    ("partq_publish_32_threads", None, "raw_lmdb_put_batch_32"),
    ("partq_publish_32_vs_1_threads", "partq_publish_32_threads", "partq_publish_1_thread"),
    ("partq_publish_async_1_thread_window_64", None, "partq_publish_1_thread"),
    ("partq_publish_32_threads_vs_raw_lmdb_group_commit_32", "partq_publish_32_threads",
     "raw_lmdb_group_commit_32_threads"),
    ("raw_lmdb_group_commit_32_vs_1_threads", "raw_lmdb_group_commit_32_threads",
     "raw_lmdb_group_commit_1_thread"),
    ("partq_publish_many_batch_100", None, "raw_lmdb_put_batch_100"),
    ("partq_publish_many_batch_100_vs_redis_xadd_pipeline_100", "partq_publish_many_batch_100",
     "redis_xadd_pipeline_100"),
    ("partq_publish_many_batch_1000", None, "raw_lmdb_put_batch_1000"),
    ("partq_publish_many_batch_1000_vs_raw_lmdb_same_layout", "partq_publish_many_batch_1000",
     "raw_lmdb_partitioned_put_batch_1000"),
    ("partq_publish_many_batch_1000_vs_raw_lmdb_same_work", "partq_publish_many_batch_1000",
     "raw_lmdb_same_work_batch_1000"),
    ("partq_publish_many_batch_1000_vs_redis_xadd_pipeline_100", "partq_publish_many_batch_1000",
     "redis_xadd_pipeline_100"),
]
CONSUME_COMPARISONS = [
    ("partq_receive_ack_many_1_flow", None, "redis_xreadgroup_xack_100"),
    ("partq_receive_ack_many_1_flow_vs_persistqueue_get_ack", "partq_receive_ack_many_1_flow",
     "persistqueue_get_ack"),
    ("partq_receive_ack_many_1_flow_vs_litequeue_pop_done", "partq_receive_ack_many_1_flow",
     "litequeue_pop_done"),
    ("partq_receive_ack_many_4_flows", None, "redis_xreadgroup_xack_100"),
    ("partq_receive_ack_many_4_flows_vs_persistqueue_get_ack", "partq_receive_ack_many_4_flows",
     "persistqueue_get_ack"),
    ("partq_receive_ack_many_4_flows_vs_litequeue_pop_done", "partq_receive_ack_many_4_flows",
     "litequeue_pop_done"),
    ("partq_receive_ack_many_4_vs_1_flows", "partq_receive_ack_many_4_flows",
     "partq_receive_ack_many_1_flow"),
    ("partq_receive_ack_many_async_1_flow", None, "redis_xreadgroup_xack_100"),
    ("partq_receive_ack_many_async_4_flows", None, "redis_xreadgroup_xack_100"),
    ("partq_receive_ack_many_async_1_flow_vs_persistqueue_get_ack",
     "partq_receive_ack_many_async_1_flow", "persistqueue_get_ack"),
]


FSYNC_NOTE = ("LMDB fsyncs twice per commit (data pages, then the meta page) where SQLite in WAL "
              "mode fsyncs once: a single-message commit of partq pays two fsyncs to "
              "persist-queue's and litequeue's one")
TARGETS_BY_LINE = {"partq_publish_many_batch_1000_vs_raw_lmdb_same_work": 0.85,
                   "partq_publish_32_threads_vs_raw_lmdb_group_commit_32": 0.8,
                   "partq_publish_async_1_thread_window_64": 20.0,
                   "partq_receive_ack_many_1_flow_vs_persistqueue_get_ack": 50.0,
                   "partq_receive_ack_many_4_flows_vs_persistqueue_get_ack": 50.0,
                   "partq_receive_ack_many_1_flow_vs_litequeue_pop_done": 50.0,
                   "partq_receive_ack_many_4_flows_vs_litequeue_pop_done": 50.0}
NOTES_BY_LINE = {"partq_publish_1_thread_vs_persistqueue_put": FSYNC_NOTE,
                 "partq_publish_1_thread_vs_litequeue_put": FSYNC_NOTE,
                 "partq_publish_1_thread": FSYNC_NOTE}


def run_group(report: Report, jobs, seconds: float, rounds: int, comparisons) -> None:
    """Interleave ``jobs`` (bench/method.py: a warm-up round, then ``rounds`` rounds of
    ``seconds / rounds`` each); emit the peers' medians (and raw LMDB's) on their own lines,
    then each partq median with its peer as listed in ``comparisons``, the ratio the median of
    the rounds' ratios."""
    t = seconds / rounds
    got = interleave([(name, lambda fn=fn: fn(t)) for name, fn in jobs], rounds, script="peers")

    def emit(name: str, source: str, peer: str | None = None) -> None:
        figures = got[source]
        extra = {}
        if name in TARGETS_BY_LINE:
            extra["target"] = TARGETS_BY_LINE[name]
        if name in NOTES_BY_LINE:
            extra["note"] = NOTES_BY_LINE[name]
        if isinstance(figures, str):
            report.emit(name, "msgs/s", None, peer=peer, skipped=figures, **extra)
        else:
            report.emit(name, "msgs/s", median(figures), peer=peer, samples=figures, **extra)

    for name in got:
        if not name.startswith("partq_"):
            emit(name, name)
    for name, source, peer in comparisons:
        emit(name, source or name, peer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run under ~30 s: short slices, open sizes 10k,50k")
    parser.add_argument("--seconds", type=float, default=None,
                        help="measuring time per system and metric (default 3, 0.15 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds after the warm-up round, systems alternating "
                             f"slice by slice (default {DEFAULT_PAIRS}, 1 with --quick)")
    parser.add_argument("--sizes", default=None,
                        help="open sizes, comma-separated, k/M suffixes (default 1M,5M,10M; "
                             "10k,50k with --quick; '' for none)")
    parser.add_argument("--open-reps", type=int, default=None,
                        help="timed opens per size (default 7, 3 with --quick)")
    parser.add_argument("--cache", default="/tmp/partq-bench-cache",
                        help="where the open-benchmark directories are built and kept")
    parser.add_argument("--out", default=None,
                        help="directory for peers.jsonl/.md/.png (default bench/results; "
                             "with --quick, none unless given)")
    args = parser.parse_args(argv)
    quick = args.quick
    seconds = args.seconds if args.seconds is not None else (0.15 if quick else 3.0)
    rounds = max(1, args.rounds if args.rounds is not None else (1 if quick else DEFAULT_PAIRS))
    sizes_text = args.sizes if args.sizes is not None else ("10k,50k" if quick else "1M,5M,10M")
    sizes = [parse_size(s) for s in sizes_text.split(",") if s.strip()]
    reps = args.open_reps or (3 if quick else 7)
    out = Path(args.out) if args.out else (None if quick else DEFAULT_OUT)
    # pre-fill per consume slice, sized so that a slice usually drains its queue
    prefill = {"partq": 2_000 if quick else 30_000, "redis": 2_000 if quick else 30_000,
               "sqlite": 100 if quick else 1_500}

    notes: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_start": os.getloadavg(),
                   "seconds": seconds, "rounds": rounds, "quick": quick}
    report = Report()
    head = header("peers", rounds, slice_seconds=round(seconds / rounds, 3))
    report.emit(head.pop("name"), head.pop("unit"), head.pop("value"), digits=2, **head)
    redis_server = RedisServer()
    t0 = time.perf_counter()
    try:
        redis_skip = None
        try:
            redis_server.start()
        except Skip as exc:
            redis_skip = str(exc)
            log(f"Redis skipped: {redis_skip}")
        notes["redis_version"] = redis_server.version or f"skipped: {redis_skip}"

        def redis_job(fn):
            def job(t):
                if redis_skip:
                    raise Skip(redis_skip)
                return fn(t)
            return job

        try:
            notes["persistqueue_default"] = persistqueue_default_sync()
        except Exception as exc:  # e.g. an older storage format: rebuild it
            notes["persistqueue_default"] = f"unknown ({exc})"

        log("publish ...")
        publish_jobs = [
            ("raw_lmdb_put_batch_1", lambda t: raw_lmdb_puts(1, t)),
            ("partq_publish_1_thread", lambda t: partq_publish(1, t)[0]),
            ("persistqueue_put", persistqueue_put),
            ("litequeue_put", litequeue_put),
            ("redis_xadd", redis_job(lambda t: redis_server.xadd(1, t))),
            ("raw_lmdb_put_batch_32", lambda t: raw_lmdb_puts(32, t)),
            ("partq_publish_32_threads", lambda t: partq_publish(32, t)[0]),
            ("partq_publish_async_1_thread_window_64", lambda t: partq_publish_async(64, t)),
            ("raw_lmdb_group_commit_1_thread", lambda t: raw_lmdb_group_commit(1, t)),
            ("raw_lmdb_group_commit_32_threads", lambda t: raw_lmdb_group_commit(32, t)),
            ("raw_lmdb_put_batch_100", lambda t: raw_lmdb_puts(100, t)),
            ("partq_publish_many_batch_100", lambda t: partq_publish_many(100, t)),
            ("redis_xadd_pipeline_100", redis_job(lambda t: redis_server.xadd(100, t))),
            ("raw_lmdb_put_batch_1000", lambda t: raw_lmdb_puts(1000, t)),
            ("raw_lmdb_partitioned_put_batch_1000", lambda t: raw_lmdb_partitioned_puts(1000, t)),
            ("raw_lmdb_same_work_batch_1000", lambda t: raw_lmdb_same_work(1000, t)),
            ("partq_publish_many_batch_1000", lambda t: partq_publish_many(1000, t)),
        ]
        run_group(report, publish_jobs, seconds, rounds, COMPARISONS)

        log("consume ...")
        consume_jobs = [
            ("partq_receive_ack_many_1_flow", lambda t: partq_consume(1, prefill["partq"], t)),
            ("redis_xreadgroup_xack_100",
             redis_job(lambda t: redis_server.xreadgroup_xack(prefill["redis"], t))),
            ("persistqueue_get_ack", lambda t: persistqueue_get_ack(prefill["sqlite"], t)),
            ("partq_receive_ack_many_4_flows", lambda t: partq_consume(4, prefill["partq"], t)),
            ("partq_receive_ack_many_async_1_flow",
             lambda t: partq_consume(1, prefill["partq"], t, pipelined=True)),
            ("partq_receive_ack_many_async_4_flows",
             lambda t: partq_consume(4, prefill["partq"], t, pipelined=True)),
            ("litequeue_pop_done", lambda t: litequeue_pop_done(prefill["sqlite"], t)),
        ]
        run_group(report, consume_jobs, seconds, rounds, CONSUME_COMPARISONS)
    finally:
        redis_server.stop()

    if sizes:
        log(f"open {', '.join(size_label(n) for n in sizes)} under {args.cache} ...")
        open_bench(report, sizes, Path(args.cache), reps, notes)

    notes["load_end"] = os.getloadavg()
    notes["elapsed"] = time.perf_counter() - t0
    log(f"done in {notes['elapsed']:.0f} s; load average {notes['load_start'][0]:.2f} at start, "
        f"{notes['load_end'][0]:.2f} at the end")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "peers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in report.lines))
        (out / "peers.md").write_text(markdown(report, notes, sizes))
        chart(report, out / "peers.png", [n for n, _ in publish_jobs + consume_jobs])
    return 0


# ---------------------------------------------------------------------------- reports
TARGETS = [
    # label, line name, kind, threshold (issue 18). Redis is a server reached over a socket: it
    # is compared with partq reached over a socket in bench/remote.py, and the in-process lines
    # beside it here are context, not targets.
    ("publish_many(1000) >= 0.85x raw py-lmdb doing the same necessary work (crc32c + msgpack "
     "records of partq's size, same transactions)",
     "partq_publish_many_batch_1000_vs_raw_lmdb_same_work", "ratio>=", 0.85),
    ("publish from 32 threads >= 0.8x raw py-lmdb group commit from 32 threads (same run)",
     "partq_publish_32_threads_vs_raw_lmdb_group_commit_32", "ratio>=", 0.8),
    ("publish_async from 1 thread >= 20x blocking publish", "partq_publish_async_1_thread_window_64",
     "ratio>=", 20.0),
    ("receive+ack_many, 1 flow >= 50x persist-queue get+ack",
     "partq_receive_ack_many_1_flow_vs_persistqueue_get_ack", "ratio>=", 50.0),
    ("receive+ack_many, 4 flows >= 50x persist-queue get+ack",
     "partq_receive_ack_many_4_flows_vs_persistqueue_get_ack", "ratio>=", 50.0),
    ("receive+ack_many, 1 flow >= 50x litequeue pop+done",
     "partq_receive_ack_many_1_flow_vs_litequeue_pop_done", "ratio>=", 50.0),
    ("open of 10M messages < 100 ms", "partq_open_10m_msgs", "value<", 100.0),
]


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and abs(v) < 100 and v != int(v):
        return f"{v:,.3g}" if abs(v) < 1 else f"{v:,.2f}"
    return f"{v:,.0f}"


def markdown(report: Report, notes: dict, sizes: list[int]) -> str:
    rows = ["| metric | partq | peer | peer value | ratio |", "|---|---:|---|---:|---:|"]
    for line in report.lines:
        if line["peer"] is None:
            continue
        ratio = "-" if line["ratio"] is None else f"{line['ratio']:.3g}"
        if line.get("ratio_min") is not None:
            ratio += f" ({line['ratio_min']:.3g}-{line['ratio_max']:.3g})"
        peer_value = (f"skipped: {line['peer_skipped']}" if line.get("peer_skipped")
                      else f"{_fmt(line['peer_value'])} {line['unit']}")
        rows.append(f"| {line['name']} | {_fmt(line['value'])} {line['unit']} | {line['peer']} | "
                    f"{peer_value} | {ratio} |")
    standalone = ["| measurement | value |", "|---|---:|"]
    for line in report.lines:
        if line["peer"] is None:
            val = (f"skipped: {line['skipped']}" if line.get("skipped")
                   else f"{_fmt(line['value'])} {line['unit']}")
            standalone.append(f"| {line['name']} | {val} |")
    targets = ["| target | measured | result |", "|---|---:|---|"]
    for label, name, kind, threshold in TARGETS:
        line = report.by_name.get(name)
        if line is None:
            targets.append(f"| {label} | not measured | n/a |")
            continue
        if line.get("skipped") or (kind == "ratio>=" and line.get("peer_skipped")):
            why = line.get("skipped") or f"peer {line['peer']} skipped: {line['peer_skipped']}"
            targets.append(f"| {label} | {why} | n/a |")
            continue
        if kind == "ratio>=":
            got, ok = line["ratio"], line["ratio"] is not None and line["ratio"] >= threshold
            shown = f"{got:.3g}x" if got is not None else "-"
        else:
            got, ok = line["value"], line["value"] < threshold
            shown = f"{got:.1f} ms"
        targets.append(f"| {label} | {shown} | {'PASS' if ok else 'FAIL'} |")
    la, lb = notes["load_start"], notes["load_end"]
    versions = _versions(notes)
    disk = ""
    if notes.get("open_dirs"):
        disk = "; ".join(f"{n:,} messages: {_bytes(b)} ({b / n:.0f} B/msg)"
                         for n, b in notes["open_dirs"])
    return "\n".join([
        "# partq against its peers",
        "",
        f"Generated by `bench/peers.py{' --quick' if notes['quick'] else ''}` on "
        f"{notes['started']}, {os.cpu_count()} CPUs, {platform.platform()}. Load average "
        f"(1/5/15 min) {la[0]:.2f}/{la[1]:.2f}/{la[2]:.2f} at the start, "
        f"{lb[0]:.2f}/{lb[1]:.2f}/{lb[2]:.2f} at the end: other jobs shared the machine. "
        f"{notes['elapsed']:.0f} s in all; each throughput is the median of {notes['rounds']} "
        f"interleaved rounds after a warm-up round, {notes['seconds']:g} s per system and "
        "metric, and each ratio the median of the rounds' ratios.",
        "",
        "256-byte payloads. Every publish/put/XADD and every ack returns only after an fsync:",
        "partq `durability=\"sync\"`; raw py-lmdb `sync=True`; persist-queue SQLiteAckQueue with "
        f"auto_commit=True (its default here: {notes.get('persistqueue_default')}; the bench sets "
        "`PRAGMA synchronous=FULL` explicitly); litequeue with `PRAGMA synchronous=FULL` set by the "
        "bench (litequeue itself sets NORMAL, which in WAL mode does not sync commits); Redis "
        "`--appendonly yes --appendfsync always --save ''` (AOF auto-rewrite off), over loopback "
        "TCP. Consume slices pre-fill untimed, then time the drain. Open times: warm page cache, "
        f"median of the timed opens. Versions: {versions}.",
        "",
        "## Targets",
        "",
        *targets,
        "",
        "## partq against each peer",
        "",
        *rows,
        "",
        "## Every measurement",
        "",
        *standalone,
        "",
        f"Open-benchmark directories: {disk or 'none'}.",
        "",
    ])


def _bytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _versions(notes: dict) -> str:
    from importlib import metadata
    parts = [f"Python {platform.python_version()}", f"lmdb {lmdb.__version__}"]
    for dist in ("persist-queue", "litequeue", "redis"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist} not installed")
    import sqlite3
    parts.append(f"SQLite {sqlite3.sqlite_version}")
    parts.append(notes.get("redis_version") or "redis-server: n/a")
    return ", ".join(parts)


def chart(report: Report, path: Path, order: list[str]) -> None:
    """Bars for the throughputs named in ``order``, in that order."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no chart")
        return
    bars = [report.by_name[n] for n in order if n in report.by_name]
    bars = [bar for bar in bars if not bar.get("skipped") and bar["value"]]
    if not bars:
        return
    names = [bar["name"] for bar in bars]
    values = [bar["value"] for bar in bars]
    colours = ["tab:blue" if n.startswith("partq_") else
               "tab:gray" if n.startswith("raw_lmdb") else "tab:orange" for n in names]
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(bars) + 1.5))
    y = range(len(bars))
    ax.barh(list(y), values, color=colours)
    ax.set_yticks(list(y), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("messages per second (log scale), 256-byte payloads, fsync before return")
    for yi, v in zip(y, values, strict=True):
        ax.text(v, yi, f" {v:,.0f}", va="center", fontsize=7)
    ax.set_title("partq (blue) vs raw LMDB (grey) and peers (orange)")
    ax.set_xlim(right=max(values) * 8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
