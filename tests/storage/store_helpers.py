"""Helpers of the store tests (tests/storage is on sys.path through pytest's ``pythonpath``):
a queue made by hand, records appended and read back, a disk filled up."""
from __future__ import annotations

import os

from partq.storage import decode_record, encode_record

KIB, MIB = 1 << 10, 1 << 20


def make_queue(store, name="q", partitions=1) -> int:
    def op(w):
        qid = w.allocate_qid()
        w.put_queue(name, {"name": name, "qid": qid, "partitions": partitions})
        for p in range(partitions):
            w.init_partition(qid, p)
        return qid
    return store.write(op)


def rec(payload: bytes, key: str | None = None, ts: int = 1) -> bytes:
    return encode_record(ts, key, None, payload)


def append(store, qid, p, payloads) -> int:
    records = [rec(x) for x in payloads]
    return store.write(lambda w: w.append(qid, p, records))


def payloads_of(store, qid, p, start=0, limit=1 << 30, queue="q") -> dict[int, bytes]:
    with store.read() as r:
        return {seq: decode_record(raw, queue, p, seq).payload
                for seq, raw in r.records(qid, p, start, limit)}


def head(store, qid, p=0) -> int:
    with store.read() as r:
        return r.head(qid, p)


def fill(path, leave: int = 0) -> None:
    """Write ``path`` until the disk holding it has no byte left, then give back ``leave``
    bytes of it (a disk nearly full)."""
    with open(path, "wb", buffering=0) as f:
        chunk = b"\0" * (64 << 10)
        while True:
            try:
                f.write(chunk)
            except OSError:
                break
        while chunk:        # the last bytes the disk has
            chunk = chunk[:len(chunk) // 2]
            try:
                f.write(chunk)
            except OSError:
                continue
    assert os.statvfs(path).f_bavail == 0
    if leave:
        os.truncate(path, os.path.getsize(path) - leave)
        assert os.statvfs(path).f_bavail * os.statvfs(path).f_frsize >= leave
