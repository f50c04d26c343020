"""The workloads the benchmarks share: partq's publishing paths and raw py-lmdb puts.

Each returns messages per second over ``seconds``; scratch directories are removed after.
(Imported by ``bench/publish.py`` and ``bench/peers.py``: a script's own folder is on sys.path.)
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from contextlib import contextmanager

import lmdb

import partq

PAYLOAD = bytes(range(256))
PARTITIONS = 4
KEYS = [f"customer-{i}" for i in range(1024)]


@contextmanager
def scratch_dir():
    path = tempfile.mkdtemp(prefix="partq-bench-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def timed_rate(loop, seconds: float) -> float:
    """``loop(deadline)`` returns the messages it handled; messages per second."""
    start = time.perf_counter()
    n = loop(start + seconds)
    return n / (time.perf_counter() - start)


def repeat_rate(call, per_call: int, seconds: float) -> float:
    """Messages per second of calling ``call()``, which handles ``per_call`` messages, over and
    over for ``seconds``."""
    def loop(deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            call()
            n += per_call
        return n
    return timed_rate(loop, seconds)


def threads_rate(body, threads: int, seconds: float) -> tuple[float, int]:
    """Run ``body(i, deadline) -> messages handled`` in ``threads`` threads released together;
    return messages per second over all of them and the total. A thread's error is raised."""
    counts = [0] * threads
    errors: list[BaseException] = []
    start_line = threading.Barrier(threads + 1)
    deadline = [0.0]

    def run(i: int) -> None:
        try:
            start_line.wait()
            counts[i] = body(i, deadline[0])
        except BaseException as exc:  # raised by the caller's thread below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    deadline[0] = start + seconds
    start_line.wait()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(counts) / elapsed, sum(counts)


# ---------------------------------------------------------------------------- partq
@contextmanager
def partq_broker(path: str | None = None, durability: str = "sync", create: bool = True):
    with (scratch_dir() if path is None else _nullctx(path)) as d:
        b = partq.Broker.open(d, durability=durability)
        try:
            if create:
                b.create_queue("q", partitions=PARTITIONS, rebalance_delay=0.0,
                               max_handoff_time=0.0)
            yield b
        finally:
            b.close()


@contextmanager
def _nullctx(value):
    yield value


def partq_publish(threads: int, seconds: float) -> tuple[float, float]:
    """Messages per second, and messages per group commit (from the store's counters)."""
    with partq_broker() as b:
        b.publish("q", PAYLOAD, key=KEYS[0])  # warm the config cache
        commits_before = b.store.commit_counts()[0]

        def publisher(t: int, end: float) -> int:
            publish, n, k = b.publish, 0, t
            while time.perf_counter() < end:
                publish("q", PAYLOAD, key=KEYS[k % 1024])
                n += 1
                k += threads
            return n

        rate, total = threads_rate(publisher, threads, seconds)
        return rate, total / max(b.store.commit_counts()[0] - commits_before, 1)


def partq_publish_async(window: int, seconds: float) -> float:
    """One thread with up to ``window`` ``publish_async`` calls in flight; a message counts once
    its ``result()`` returned (it is durable)."""
    from collections import deque
    with partq_broker() as b:
        b.publish("q", PAYLOAD, key=KEYS[0])

        def loop(deadline: float) -> int:
            publish, inflight, n, k = b.publish_async, deque(), 0, 0
            while time.perf_counter() < deadline:
                inflight.append(publish("q", PAYLOAD, key=KEYS[k % 1024]))
                k += 1
                if len(inflight) >= window:
                    inflight.popleft().result()
                    n += 1
            for pending in inflight:
                pending.result()
            return n + len(inflight)
        return timed_rate(loop, seconds)


def partq_publish_many(batch: int, seconds: float) -> float:
    with partq_broker() as b:
        items = [(PAYLOAD, KEYS[i % 1024]) for i in range(batch)]
        b.publish_many("q", items[:1])
        return repeat_rate(lambda: b.publish_many("q", items), batch, seconds)


# ---------------------------------------------------------------------------- raw LMDB
def _raw_lmdb_rate(write_batch, seconds: float) -> float:
    """Messages per second of ``write_batch(txn, n) -> messages put``, one fsynced write
    transaction (``sync=True``) per call, in a scratch environment."""
    with scratch_dir() as path:
        env = lmdb.open(path, map_size=8 << 30, sync=True)
        try:
            def loop(deadline: float) -> int:
                n = 0
                while time.perf_counter() < deadline:
                    with env.begin(write=True) as txn:
                        n += write_batch(txn, n)
                return n
            return timed_rate(loop, seconds)
        finally:
            env.close()


def raw_lmdb_puts(batch: int, seconds: float) -> float:
    """``batch`` puts per transaction of the payload under sequential 16-byte keys."""
    def write_batch(txn, n: int) -> int:
        put = txn.put
        for i in range(n, n + batch):
            put(i.to_bytes(16, "big"), PAYLOAD)
        return batch
    return _raw_lmdb_rate(write_batch, seconds)


def raw_lmdb_partitioned_puts(batch: int, seconds: float) -> float:
    """The physical limit for partq's own data shape (storage format 2): the batch spread over 4
    partitions' key ranges of one database, each partition's share one chunk (a msgpack list of
    crc-framed records of partq's size, packed in the loop) under its last sequence's 16-byte
    (queue, partition, seq) key. What partq adds on top is encoding each message, choosing its
    partition and its bookkeeping."""
    import struct

    import msgpack

    from partq.storage.encoding import encode_record
    key = struct.Struct(">IIQ").pack
    pack = msgpack.Packer(use_bin_type=True).pack
    record = encode_record(time.time_ns(), "k0000", None, PAYLOAD)
    per = batch // 4
    records = [record] * per

    def write_batch(txn, n: int) -> int:
        put = txn.put
        first = n // 4
        for p in range(4):
            put(key(1, p, first + per - 1), pack([first, *records]))
        return 4 * per
    return _raw_lmdb_rate(write_batch, seconds)


def raw_lmdb_same_work(batch: int, seconds: float) -> float:
    """The physical limit of ``publish_many(batch)`` doing the same necessary work (issue 18):
    every message of every batch encoded in the loop with the leanest plain-Python encoder using
    partq's packages, into a record of partq's size: ``crc32c(body) || body`` with ``body`` the
    msgpack of ``(publish_time_ns, key, None, payload)`` (the keys and payload of partq's
    workload); the batch's records spread over 4 partitions by position (no key hashing: less
    work than partq's keyed choice), each partition's share one chunk (a msgpack list) under a
    16-byte key, one fsynced transaction per batch, as partq stores it. It does no validation,
    no key hashing, no partition state and no bookkeeping: what partq adds beyond the work any
    durable, checksummed, partitioned log must do."""
    import struct

    import crc32c
    import msgpack
    key = struct.Struct(">IIQ").pack
    frame = struct.Struct(">I").pack
    pack = msgpack.Packer(use_bin_type=True).pack
    crc = crc32c.crc32c
    items = [(PAYLOAD, KEYS[i % 1024]) for i in range(batch)]
    parts = range(PARTITIONS)

    def write_batch(txn, n: int) -> int:
        now = time.time_ns()
        shares: list[list] = [[] for _ in parts]
        for i, (payload, k) in enumerate(items):
            body = pack((now, k, None, payload))
            shares[i % PARTITIONS].append(frame(crc(body)) + body)
        put, first = txn.put, n // PARTITIONS
        for p in parts:
            records = shares[p]
            put(key(1, p, first + len(records) - 1), pack([first, *records]))
        return batch
    return _raw_lmdb_rate(write_batch, seconds)


def raw_lmdb_group_commit(threads: int, seconds: float) -> float:
    """The ceiling of partq's threading model with nothing of partq in it: ``threads`` Python
    threads each hand one put (the 256-byte payload) to a committing thread and block until its
    fsynced transaction (``sync=True``) holds it; the committer takes everything waiting, as
    group commit does. What this loses from 1 to 32 threads is the cost of waking blocked
    Python threads through one GIL, which no broker written in Python escapes."""
    from _thread import allocate_lock
    with scratch_dir() as path:
        env = lmdb.open(path, map_size=8 << 30, sync=True)
        waiting: list = []
        cond = threading.Condition()
        stop = [False]

        def committer() -> None:
            seq = 0
            while True:
                with cond:
                    while not waiting and not stop[0]:
                        cond.wait()
                    if not waiting:
                        return
                    batch = waiting[:]
                    waiting.clear()
                with env.begin(write=True) as txn:
                    put = txn.put
                    for _ in batch:
                        put(seq.to_bytes(16, "big"), PAYLOAD)
                        seq += 1
                for done in batch:
                    done.release()

        def publisher(t: int, end: float) -> int:
            n = 0
            while time.perf_counter() < end:
                done = allocate_lock()
                done.acquire()
                with cond:
                    waiting.append(done)
                    cond.notify()
                done.acquire()
                n += 1
            return n

        writer = threading.Thread(target=committer)
        writer.start()
        try:
            rate, _ = threads_rate(publisher, threads, seconds)
        finally:
            with cond:
                stop[0] = True
                cond.notify()
            writer.join()
            env.close()
        return rate
