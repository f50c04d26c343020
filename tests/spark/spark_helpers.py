"""Helpers shared by the Spark and staging tests (imported by name: tests/spark is on sys.path)."""
from __future__ import annotations

import os
import shutil

import pytest

import partq
from partq.storage import decode_record


def require_spark() -> None:
    """Skip unless PySpark (the spark extra) and a Java runtime are installed."""
    pytest.importorskip("pyspark", reason="needs the spark extra: pip install -e '.[spark]'")
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        pytest.skip("needs a Java runtime (17 or later) for Spark")


def read_queue(path, queue: str) -> dict[int, list[tuple[str | None, bytes]]]:
    """Every stored message of ``queue`` as (key, payload) per partition, in log order, without
    consuming anything."""
    with partq.Broker.open(path, create=False, auto_tick=False) as broker:
        config = broker.queue_config(queue)
        out: dict[int, list[tuple[str | None, bytes]]] = {}
        with broker.store.read() as r:
            for p in range(config.partitions):
                out[p] = [(rec.key, rec.payload) for rec in
                          (decode_record(raw, queue, p, seq)
                           for seq, raw in r.records(config.qid, p, 0, 1 << 40))]
        return out


def all_messages(path, queue: str) -> list[tuple[int, str | None, bytes]]:
    """(partition, key, payload) of every stored message, partition by partition."""
    return [(p, k, v) for p, msgs in sorted(read_queue(path, queue).items()) for k, v in msgs]
