"""The rows Spark reads from a queue: the schema, and stored records turned into Arrow batches.

Columns (rule `spark-read`): ``partition`` (bigint: the storage partition, ``partq.PARENT`` = 4294967295 for
the parent queue's log), ``seq`` (bigint), ``key`` (string, null when unkeyed), ``payload``
(binary), ``headers`` (map<string,string>: string values as they are, other values as JSON,
bytes as base64 strings inside it; null when the message has none), ``publish_time``
(timestamp, UTC, microseconds). Every record's crc32c is checked before it is decoded (rule `checksums`): a
damaged one fails the task with ``CorruptRecord`` naming queue, partition and sequence.
"""
from __future__ import annotations

import base64
import json

import msgpack

from partq.storage.checksum import crc32c
from partq.storage.encoding import corruption

SCHEMA_DDL = ("partition bigint, seq bigint, key string, payload binary, "
              "headers map<string,string>, publish_time timestamp")
COLUMNS = ("partition", "seq", "key", "payload", "headers", "publish_time")

_crc = crc32c
_unpack = msgpack.unpackb
_from_bytes = int.from_bytes


def arrow_schema():
    """The Arrow schema Spark expects the batches in (``to_arrow_schema`` of ``SCHEMA_DDL``)."""
    import pyarrow as pa
    return pa.schema([("partition", pa.int64()), ("seq", pa.int64()), ("key", pa.string()),
                      ("payload", pa.binary()), ("headers", pa.map_(pa.string(), pa.string())),
                      ("publish_time", pa.timestamp("us", tz="UTC"))])


def _json_default(value):
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot show a {type(value).__name__} header value")


def header_map(headers: dict) -> list[tuple[str, str | None]]:
    """A message's headers as map entries: strings as they are, None as null, anything else as
    JSON (bytes as base64)."""
    return [(k, v if v is None or type(v) is str else
             json.dumps(v, default=_json_default, separators=(",", ":")))
            for k, v in headers.items()]


def to_batch(queue: str, partition: int, records: list[tuple[int, bytes]], schema,
             keys: frozenset | None = None):
    """One Arrow record batch of the given records of one partition, in order; with ``keys``,
    of those whose key is one of them."""
    import pyarrow as pa
    seqs: list[int] = []
    key_col: list[str | None] = []
    payloads: list[bytes] = []
    times: list[int] = []
    headers: list = []
    any_headers = False
    for seq, raw in records:
        body = raw[4:]
        if len(raw) < 5 or _crc(body) != _from_bytes(raw[:4], "big"):
            raise corruption(raw, queue, partition, seq)
        try:
            ts, key, hdrs, payload = _unpack(body, raw=False, strict_map_key=False)
        except Exception:  # msgpack raises a zoo of types on bad input
            raise corruption(raw, queue, partition, seq) from None
        if type(payload) is not bytes or type(ts) is not int:
            raise corruption(raw, queue, partition, seq)
        if keys is not None and key not in keys:
            continue
        seqs.append(seq)
        key_col.append(key)
        payloads.append(payload)
        times.append(ts // 1000)
        if hdrs:
            any_headers = True
            headers.append(header_map(hdrs))
        else:
            headers.append(None)
    n = len(seqs)
    return pa.RecordBatch.from_arrays([
        pa.array([partition] * n, pa.int64()),
        pa.array(seqs, pa.int64()),
        pa.array(key_col, pa.string()),
        pa.array(payloads, pa.binary()),
        pa.array(headers, schema.field("headers").type) if any_headers
        else pa.nulls(n, schema.field("headers").type),
        pa.array(times, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    ], schema=schema)
