"""Staged publishing: rows written by many tasks become messages in one commit, exactly once (S28).

A *job* (one Spark write, or any batch of cooperating writers) has an id. Each *task attempt*
stages its rows under its own prefix; nothing staged is visible to consumers. The job's
coordinator then calls ``commit_job`` with the attempts that succeeded: in ONE write transaction
their rows are published (task partitions in ascending order, each attempt's rows in staging
order, so per-key order within one task partition is kept), every staged row of the job is
dropped (failed and speculative attempts included), and a job marker is written. A second
``commit_job`` of the same job publishes nothing; ``abort_job`` drops the job's rows. Once a job is
committed or aborted, staging for it is refused in the same transaction that would stage, so a
zombie attempt that outlives its job can never leave rows behind.

Layout in the ``staging`` database (see ``partq.storage.txn``)::

    key   = b"job/" || job_id (32 ascii hex) || task_partition (u32) || attempt_id (u64)   # prefix
            || chunk number (u64)
    value = msgpack [keys: list[str | None], records: list[bytes]]    # records already encoded

Rows are staged in chunks of about ``CHUNK_BYTES`` so a million-row job is a few thousand LMDB
values, not a million. The job marker lives in the ``meta`` database under
``b"staged-job/" || job_id``: msgpack ``{"state": "committed" | "aborted", "rows", "discarded",
"time_ns"}``.

A message's ``publish_time_ns`` is the time its row was *staged* (the record is encoded then), not
the time of the job commit.

Thread-safety: every function may be called from any thread of the process that opened the
broker. Never pass a broker across ``fork()``: Spark executors open their own.
"""
from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack

from partq.errors import CorruptStore, InvalidConfig, PartqError
from partq.hashing import crc32c_of
from partq.publishing import encode_one
from partq.storage.encoding import decode_record, pack_u64

__all__ = ["JobAborted", "JobFinished", "StagedRowsMismatch", "JobCommit", "StagedAttempt",
           "Stager", "new_job_id", "stage_rows", "commit_job", "abort_job", "job_state",
           "list_stages", "orphaned_stages", "DEFAULT_BATCH_ROWS"]

DEFAULT_BATCH_ROWS = 10_000         # rows per staging transaction
BATCH_BYTES = 64 << 20              # ... or fewer, when their records pass this many bytes
CHUNK_BYTES = 256 << 10             # target size of one staged value

_TAG = b"job/"
_JOB_ID = re.compile(r"^[0-9a-f]{32}$")
_JOB_PREFIX_WIDTH = len(_TAG) + 32
_ATTEMPT_PREFIX_WIDTH = _JOB_PREFIX_WIDTH + 4 + 8
_MARKER = b"staged-job/"
_U32_MAX = 0xFFFFFFFF
_U64_MAX = (1 << 64) - 1


class JobFinished(PartqError):
    """Staging was refused: the job was already committed or aborted (a late or zombie attempt)."""


class JobAborted(PartqError):
    """``commit_job`` was called for a job that was aborted: its staged rows are gone."""


class StagedRowsMismatch(PartqError):
    """An attempt's staged rows differ from the count its task reported: nothing was published."""


@dataclass(frozen=True)
class JobCommit:
    """What ``commit_job`` did. ``already_committed``: an earlier commit of this job published
    its rows; this one published nothing. ``discarded``: rows counted and dropped because the
    queue's ingress was disabled without reject (S19)."""
    job_id: str
    published: int
    discarded: int = 0
    already_committed: bool = False


@dataclass(frozen=True)
class StagedAttempt:
    """Rows staged by one task attempt and not yet committed or aborted. ``job_state`` is None
    while the job is open (running, or its coordinator died), else the state its marker records
    (a leftover, which the refusal rule above should make impossible). ``staged_at_ns`` is the
    wall time its first row was staged."""
    job_id: str
    task_partition: int
    attempt_id: int
    chunks: int
    rows: int
    staged_at_ns: int | None
    job_state: str | None


def new_job_id() -> str:
    """A fresh job id (32 lowercase hex digits)."""
    return uuid.uuid4().hex


# ---------------------------------------------------------------------- key layout
def _check_job_id(job_id: str) -> bytes:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise InvalidConfig(f"job id must be 32 lowercase hex digits (use new_job_id()), "
                            f"not {job_id!r}")
    return job_id.encode()


def _job_prefix(job_id: str) -> bytes:
    return _TAG + _check_job_id(job_id)


def _attempt_prefix(job_id: str, task_partition: int, attempt_id: int) -> bytes:
    for name, value, high in (("task_partition", task_partition, _U32_MAX),
                              ("attempt_id", attempt_id, _U64_MAX)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise InvalidConfig(f"{name} must be an integer from 0 to {high}, not {value!r}")
    return _job_prefix(job_id) + task_partition.to_bytes(4, "big") + attempt_id.to_bytes(8, "big")


def _marker_key(job_id: str) -> bytes:
    return _MARKER + _check_job_id(job_id)


def _read_marker(r, job_id: str) -> dict | None:
    raw = r.meta(_marker_key(job_id))
    if raw is None:
        return None
    try:
        return msgpack.unpackb(raw, raw=False)
    except Exception:
        raise CorruptStore(f"the marker of staged job {job_id} is damaged; restore from a "
                           f"DR-standby or backup") from None


def _chunk(r, prefix: bytes, number: int) -> bytes | None:
    """Chunk ``number`` of an attempt (chunks are numbered 0, 1, ... without gaps)."""
    found = r.staged(prefix + pack_u64(number))
    return found[0] if found else None


def _decode_chunk(raw: bytes, where: str) -> tuple[list, list]:
    try:
        keys, records = msgpack.unpackb(raw, raw=False)
    except Exception:
        raise CorruptStore(f"staged rows of {where} are damaged; abort the job "
                           f"(partq.staging.abort_job) and run it again") from None
    if len(keys) != len(records):
        raise CorruptStore(f"staged rows of {where} are damaged; abort the job and run it again")
    return keys, records


def _chunk_rows(raw: bytes) -> int:
    """Row count of a chunk from the msgpack header of its key list, without decoding it."""
    if len(raw) >= 2 and raw[0] == 0x92:
        b = raw[1]
        if 0x90 <= b <= 0x9F:
            return b & 0x0F
        if b == 0xDC and len(raw) >= 4:
            return int.from_bytes(raw[2:4], "big")
        if b == 0xDD and len(raw) >= 6:
            return int.from_bytes(raw[2:6], "big")
    return len(_decode_chunk(raw, "a staged chunk")[0])


# ---------------------------------------------------------------------- staging
class Stager:
    """Stages the rows of one task attempt, ``batch_rows`` rows per write transaction (fewer
    when their records pass ``BATCH_BYTES``, so big payloads do not make huge transactions).

    ``add``/``add_many`` encode rows at once (a bad payload or key raises ``InvalidMessage``
    before anything of its batch is written); ``close()`` writes the last batch and returns the
    row count to report to the coordinator. The first write also drops anything an earlier
    incarnation of the same attempt id left under its prefix.
    """

    def __init__(self, broker, queue: str, job_id: str, task_partition: int, attempt_id: int,
                 batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise InvalidConfig(f"batch_rows must be a positive integer, not {batch_rows!r}")
        self._broker = broker
        self._job_id = job_id
        self._prefix = _attempt_prefix(job_id, task_partition, attempt_id)
        self._marker = _marker_key(job_id)
        self._publisher = broker.publisher
        self._config = broker.publisher.config(queue)   # QueueNotFound before anything is staged
        self._batch_rows = batch_rows
        self._keys: list = []
        self._records: list[bytes] = []
        self._bytes = 0
        self._chunks: list[bytes] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._next_chunk = 0
        self.rows = 0

    def add(self, payload, key: str | None = None, headers: dict | None = None) -> None:
        _, record = encode_one(self._config, payload, key, headers, self._broker.clock.wall_ns())
        self._keys.append(key)
        self._records.append(record)
        self._bytes += len(record)
        self._pending_rows += 1
        if self._bytes >= CHUNK_BYTES:
            self._pending_bytes += self._bytes
            self._seal_chunk()
            if self._pending_bytes >= BATCH_BYTES:
                self.flush()
                return
        if self._pending_rows >= self._batch_rows:
            self.flush()

    def add_many(self, payloads: Iterable, keys: Iterable | None = None) -> None:
        """Stage ``payloads[i]`` with ``keys[i]`` (or unkeyed when ``keys`` is None)."""
        add = self.add
        if keys is None:
            for payload in payloads:
                add(payload)
        else:
            for payload, key in zip(payloads, keys, strict=True):
                add(payload, key)

    def _seal_chunk(self) -> None:
        if self._keys:
            self._chunks.append(msgpack.packb((self._keys, self._records), use_bin_type=True))
            self._keys, self._records, self._bytes = [], [], 0

    def flush(self) -> None:
        """Write everything added so far in one transaction."""
        self._seal_chunk()
        if not self._chunks:
            return
        chunks, first, start = self._chunks, self._next_chunk == 0, self._next_chunk
        prefix, marker, job_id = self._prefix, self._marker, self._job_id

        def op(w):
            raw = w.meta(marker)
            if raw is not None:
                state = msgpack.unpackb(raw, raw=False).get("state")
                raise JobFinished(f"job {job_id} was already {state}; this task attempt is late "
                                  f"and its rows were not staged (nothing to do)")
            if first:
                w.drop_staged(prefix)
            w.stage(prefix, start, chunks)
        self._broker.store.write(op)
        self._next_chunk += len(chunks)
        self.rows += self._pending_rows
        self._chunks, self._pending_rows, self._pending_bytes = [], 0, 0

    def close(self) -> int:
        self.flush()
        return self.rows


def stage_rows(broker, queue: str, job_id: str, task_partition: int, attempt_id: int,
               rows: Iterable, batch_rows: int = DEFAULT_BATCH_ROWS) -> int:
    """Stage ``rows`` for one task attempt and return how many were staged. Items are those of
    ``Broker.publish_many``: ``payload``, ``(payload, key)`` or ``(payload, key, headers)``."""
    stager = Stager(broker, queue, job_id, task_partition, attempt_id, batch_rows)
    add = stager.add
    for item in rows:
        if isinstance(item, tuple):
            n = len(item)
            add(item[0], item[1] if n > 1 else None, item[2] if n > 2 else None)
        else:
            add(item)
    return stager.close()


# ---------------------------------------------------------------------- commit / abort
def _attempt_list(attempts: Iterable) -> list[tuple[int, int, int | None]]:
    out: dict[int, tuple[int, int, int | None]] = {}
    for attempt in attempts:
        if len(attempt) == 2:
            tp, aid, rows = attempt[0], attempt[1], None
        else:
            tp, aid, rows = attempt[0], attempt[1], attempt[2]
        if tp in out:
            raise InvalidConfig(f"task partition {tp} is listed twice (attempts {out[tp][1]} and "
                                f"{aid}); pass exactly one successful attempt per task partition")
        out[tp] = (tp, aid, rows)
    return [out[tp] for tp in sorted(out)]


def commit_job(broker, queue: str, job_id: str, attempts: Iterable) -> JobCommit:
    """Publish the staged rows of the successful ``attempts`` in one transaction, exactly once.

    ``attempts``: ``(task_partition, attempt_id)`` or ``(task_partition, attempt_id, rows)``
    per task partition; with ``rows`` the staged count is checked and a difference fails the
    whole commit (``StagedRowsMismatch``) with nothing published. Rows go to partitions by the
    partition count the transaction sees (S1, S2), in ascending task partition order. Every row
    staged for the job, by any attempt, is dropped. Idempotent: committing a committed job
    publishes nothing and returns ``already_committed=True``; committing an aborted job raises
    ``JobAborted``.
    """
    ordered = [(tp, aid, rows, _attempt_prefix(job_id, tp, aid)) for tp, aid, rows in _attempt_list(attempts)]
    job_prefix, marker = _job_prefix(job_id), _marker_key(job_id)
    broker.publisher.config(queue)   # QueueNotFound with its hint before any work
    with broker.store.read() as r:
        chunks = r.staged_prefixes(_JOB_PREFIX_WIDTH).get(job_prefix, 0)
    # The published copy cannot reuse the staged rows' pages within the same transaction.
    broker.store.reserve(2 * chunks * CHUNK_BYTES)

    def op(w):
        state = _read_marker(w, job_id)
        if state is not None:
            if state.get("state") == "committed":
                w.drop_staged(job_prefix)
                return JobCommit(job_id, 0, 0, already_committed=True)
            raise JobAborted(f"job {job_id} was aborted and its staged rows dropped; run the "
                             f"job again")
        published = discarded = 0
        for tp, aid, expected, prefix in ordered:
            where = f"job {job_id} task partition {tp} attempt {aid}"
            n = number = 0
            while True:
                raw = _chunk(w, prefix, number)
                if raw is None:
                    break
                keys, records = _decode_chunk(raw, where)
                if keys:
                    hashed = [(None if k is None else crc32c_of(k.encode()), r)
                              for k, r in zip(keys, records, strict=True)]
                    _, dropped = broker.publisher.place_count(w, queue, hashed)
                    discarded += dropped
                n += len(keys)
                number += 1
            if expected is not None and n != expected:
                raise StagedRowsMismatch(f"{where} reported {expected} rows but {n} are staged; "
                                         f"nothing was published: abort the job and run it again")
            published += n
        w.drop_staged(job_prefix)
        published -= discarded
        w.put_meta(marker, msgpack.packb({"state": "committed", "rows": published,
                                          "discarded": discarded, "time_ns": time.time_ns()}))
        return JobCommit(job_id, published, discarded)
    return broker.store.write(op)


def abort_job(broker, job_id: str) -> int:
    """Drop every row staged for ``job_id`` and mark it aborted, so late attempts stage nothing
    and a later ``commit_job`` raises ``JobAborted``. Returns the rows dropped. Aborting a job
    that was already committed changes nothing (its rows are published) and returns 0."""
    job_prefix, marker = _job_prefix(job_id), _marker_key(job_id)

    def op(w):
        state = _read_marker(w, job_id)
        if state is not None and state.get("state") == "committed":
            w.drop_staged(job_prefix)
            return 0
        dropped = sum(a.rows for a in _stages(w, job_prefix))
        w.drop_staged(job_prefix)
        if state is None:
            w.put_meta(marker, msgpack.packb({"state": "aborted", "rows": dropped,
                                              "time_ns": time.time_ns()}))
        return dropped
    return broker.store.write(op)


def job_state(broker, job_id: str) -> dict | None:
    """The job's marker (``{"state": "committed" | "aborted", "rows", ...}``) or None while the
    job is open or unknown."""
    with broker.store.read() as r:
        return _read_marker(r, job_id)


# ---------------------------------------------------------------------- inspection
def _stages(r, under: bytes = _TAG) -> list[StagedAttempt]:
    out = []
    states: dict[str, str | None] = {}
    for prefix, chunks in sorted(r.staged_prefixes(_ATTEMPT_PREFIX_WIDTH).items()):
        if not prefix.startswith(under) or len(prefix) != _ATTEMPT_PREFIX_WIDTH:
            continue
        job_id = prefix[len(_TAG):_JOB_PREFIX_WIDTH].decode("ascii", "replace")
        tp = int.from_bytes(prefix[_JOB_PREFIX_WIDTH:_JOB_PREFIX_WIDTH + 4], "big")
        aid = int.from_bytes(prefix[_JOB_PREFIX_WIDTH + 4:], "big")
        rows, staged_at, number = 0, None, 0
        for number in range(chunks):
            raw = _chunk(r, prefix, number)
            if raw is None:
                break
            rows += _chunk_rows(raw)
            if staged_at is None:
                keys, records = _decode_chunk(raw, f"job {job_id}")
                if records:
                    staged_at = decode_record(records[0], "(staged)", tp, 0).publish_time_ns
        if job_id not in states:
            try:
                marker = _read_marker(r, job_id)
            except InvalidConfig:   # not a job id this module wrote
                marker = None
            states[job_id] = marker.get("state") if marker else None
        out.append(StagedAttempt(job_id, tp, aid, chunks, rows, staged_at, states[job_id]))
    return out


def list_stages(broker) -> list[StagedAttempt]:
    """Every task attempt with staged rows, by job, task partition and attempt. Reads every
    staged chunk's header: an inspection tool, not a hot path."""
    with broker.store.read() as r:
        return _stages(r)


def orphaned_stages(broker, older_than: float = 3600.0, now_ns: int | None = None) -> list[StagedAttempt]:
    """Staged attempts no running job is likely to commit: those of a committed or aborted job,
    and those whose first row was staged more than ``older_than`` seconds ago (the job's
    coordinator probably died). Remove them with ``abort_job(broker, s.job_id)``."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    limit = now_ns - int(older_than * 1e9)
    return [s for s in list_stages(broker)
            if s.job_state is not None or (s.staged_at_ns is not None and s.staged_at_ns <= limit)]
