"""What staged jobs look like in the store: key layout, chunk format and job markers,
shared by ``partq.jobs.staging`` (the tasks' side) and ``partq.jobs.commit`` (the coordinator's side).

Layout in the ``staging`` database (see ``partq.storage.txn``)::

    key   = b"job/" || job_id (32 ascii hex) || task_partition (u32) || attempt_id (u64)   # prefix
            || chunk number (u64)
    value = msgpack [2, rows, partition_count, partition, records]

A chunk holds at most one log chunk's worth of rows (``CHUNK_RECORDS`` records, about
``CHUNK_BYTES``), already encoded as records. ``partition >= 0``: every row is keyed and belongs
to that partition of a queue of ``partition_count`` partitions (rule `key-hash`), so a commit that sees the
same count appends the records as they are, without decoding one. ``partition == -1``: unkeyed
rows of a partitioned queue, or any rows of an exclusive one (``partition_count`` 0), placed
row by row when committed (rule `unkeyed-partitioner`). A commit that must place keyed rows again (the queue
was scaled meanwhile) reads their keys back from the records.

The job marker lives in the ``meta`` database under ``b"staged-job/" || job_id``: msgpack
``{"state": "committing" | "committed" | "aborted", ...}``. While ``committing`` it holds the
accepted attempts and how far the commit got (``at``: attempt index and chunk number).
"""
from __future__ import annotations

import re

import msgpack

from partq.core.key_hash import crc32c_of
from partq.errors import CorruptStore, InvalidConfig
from partq.storage.encoding import CHUNK_BYTES as LOG_CHUNK_BYTES
from partq.storage.encoding import CHUNK_RECORDS, pack_u64, record_fields

__all__ = ["CHUNK_RECORDS", "LOG_CHUNK_BYTES"]

TAG = b"job/"
JOB_PREFIX_WIDTH = len(TAG) + 32
ATTEMPT_PREFIX_WIDTH = JOB_PREFIX_WIDTH + 4 + 8
FORMAT = 2              # staged chunk format (1: msgpack [keys, records], still read)
UNPLACED = -1           # partition of a chunk whose rows are placed when committed

_MARKER = b"staged-job/"
_JOB_ID = re.compile(r"^[0-9a-f]{32}$")
_U32_MAX = 0xFFFFFFFF
_U64_MAX = (1 << 64) - 1
_pack = msgpack.Packer(use_bin_type=True).pack


# ---------------------------------------------------------------------- keys
def check_job_id(job_id: str) -> bytes:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise InvalidConfig(f"job id must be 32 lowercase hex digits (use new_job_id()), "
                            f"not {job_id!r}")
    return job_id.encode()


def job_prefix(job_id: str) -> bytes:
    return TAG + check_job_id(job_id)


def attempt_prefix(job_id: str, task_partition: int, attempt_id: int) -> bytes:
    for name, value, high in (("task_partition", task_partition, _U32_MAX),
                              ("attempt_id", attempt_id, _U64_MAX)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise InvalidConfig(f"{name} must be an integer from 0 to {high}, not {value!r}")
    return job_prefix(job_id) + task_partition.to_bytes(4, "big") + attempt_id.to_bytes(8, "big")


def split_attempt_prefix(prefix: bytes) -> tuple[str, int, int]:
    """(job id, task partition, attempt id) of an attempt prefix."""
    job_id = prefix[len(TAG):JOB_PREFIX_WIDTH].decode("ascii", "replace")
    tp = int.from_bytes(prefix[JOB_PREFIX_WIDTH:JOB_PREFIX_WIDTH + 4], "big")
    return job_id, tp, int.from_bytes(prefix[JOB_PREFIX_WIDTH + 4:], "big")


def chunk_key(prefix: bytes, number: int) -> bytes:
    return prefix + pack_u64(number)


def chunk_at(r, prefix: bytes, number: int) -> bytes | None:
    """Chunk ``number`` of an attempt (chunks are numbered 0, 1, ... without gaps)."""
    return r.staged_value(chunk_key(prefix, number))


# ---------------------------------------------------------------------- markers
def marker_key(job_id: str) -> bytes:
    return _MARKER + check_job_id(job_id)


def read_marker(r, job_id: str) -> dict | None:
    raw = r.meta(marker_key(job_id))
    if raw is None:
        return None
    try:
        marker = msgpack.unpackb(raw, raw=False)
    except Exception:
        marker = None
    if not isinstance(marker, dict):
        raise CorruptStore(f"the marker of staged job {job_id} is damaged; restore from a "
                           f"DR-standby or backup")
    return marker


def write_marker(w, job_id: str, marker: dict) -> None:
    w.put_meta(marker_key(job_id), msgpack.packb(marker))


# ---------------------------------------------------------------------- chunks
class StagedChunk:
    """One decoded staged chunk."""

    __slots__ = ("rows", "partition_count", "partition", "records", "_hashes")

    def __init__(self, rows: int, partition_count: int, partition: int, records: list,
                 hashes: list | None = None) -> None:
        self.rows, self.partition_count, self.partition = rows, partition_count, partition
        self.records, self._hashes = records, hashes

    def hashes(self, where: str) -> list:
        """crc32c of each row's key (None for an unkeyed row), to place the rows one by one."""
        if self._hashes is not None:
            return self._hashes
        if self.partition == UNPLACED and self.partition_count:
            return [None] * self.rows       # the unkeyed rows of a partitioned queue
        out = []
        for i, raw in enumerate(self.records):
            fields = record_fields(raw)
            if fields is None:
                raise CorruptStore(f"a staged row of {where} is damaged ({i}); abort the job "
                                   f"and run it again")
            out.append(None if fields[1] is None else crc32c_of(fields[1].encode()))
        return out


def encode_chunk(partition_count: int, partition: int, records: list[bytes]) -> bytes:
    return _pack([FORMAT, len(records), partition_count, partition, records])


def decode_chunk(raw: bytes, where: str) -> StagedChunk:
    """A staged chunk of either format; ``CorruptStore`` naming ``where`` when damaged."""
    try:
        value = msgpack.unpackb(raw, raw=False)
        if len(value) == 5 and value[0] == FORMAT:
            _, rows, count, partition, records = value
            hashes = None
        else:                                   # format 1: [keys, records]
            keys, records = value
            hashes = [None if k is None else crc32c_of(k.encode()) for k in keys]
            rows, count, partition = len(records), 0, UNPLACED
            if len(hashes) != rows:
                raise ValueError("lengths differ")
        if len(records) != rows:
            raise ValueError("lengths differ")
    except Exception:
        raise CorruptStore(f"staged rows of {where} are damaged; abort the job "
                           f"(partq.jobs.staging.abort_job) and run it again") from None
    return StagedChunk(rows, count, partition, records, hashes)


def chunk_record_bytes(raw: bytes) -> int:
    """Bytes of the records of a staged chunk, as a quota counts a publish's (decodes the
    chunk)."""
    return sum(map(len, decode_chunk(raw, "a staged chunk").records))


def chunk_rows(raw: bytes) -> int:
    """Row count of a staged chunk from its first fields, without decoding its records."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw[:32])
    try:
        if unpacker.read_array_header() == 5 and unpacker.unpack() == FORMAT:
            rows = unpacker.unpack()
            if isinstance(rows, int):
                return rows
    except Exception:  # a short or damaged header: decode it all, which says what is wrong
        pass
    return decode_chunk(raw, "a staged chunk").rows
