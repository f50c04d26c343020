"""Staged publishing: rows written by many tasks become messages exactly once (rule `spark-exactly-once`).

A *job* (one Spark write, or any batch of cooperating writers) has an id. Each *task attempt*
stages its rows under its own prefix; nothing staged is visible to consumers. The job's
coordinator then calls ``commit_job`` with the attempts that succeeded: their rows are published
(task partitions in ascending order, each attempt's rows in staging order, so per-key order
within one task partition is kept), every other staged row of the job is dropped (failed and
speculative attempts), and the job is marked committed. A second ``commit_job`` of the same job
publishes nothing; ``abort_job`` drops the job's rows. Once a job's commit began, or the job was
aborted, staging for it is refused in the same transaction that would stage, so a zombie
attempt that outlives its job can never leave rows behind.

The commit is incremental (``partq.jobs.commit``): one short transaction checks every attempt's
row count and marks the job *committing*; then transactions of at most ``batch_rows`` rows each
publish the rows and record how far they got, so other publishers wait for one batch at most,
never for the whole job. A commit interrupted after it began (its process died, or ingress was
disabled under it) is finished by ``resume_commits`` or another ``commit_job`` of the job; its
rows are then all published, once.

Staging does most of the work in the tasks: rows are encoded there, keyed rows placed in their
partition (rule `key-hash`, by the partition count at staging) and sealed in chunks of one log chunk each,
so a commit that sees the same count appends them without decoding a record. Chunk layout and
markers: ``partq.jobs.staged``.

A message's ``publish_time_ns`` is the time its row was *staged* (the record is encoded then), not
the time of the job commit.

Thread-safety: every function may be called from any thread of the process that opened the
broker. Never pass a broker across ``fork()``: Spark executors open their own.
"""
from __future__ import annotations

import time
import uuid
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from partq.errors import (
    FrameError,
    InvalidConfig,
    JobAborted,
    JobFinished,
    QueueNotFound,
    StagedRowsMismatch,
)
from partq.jobs.commit import JobCommit, abort_job, commit_job, resume_commits
from partq.jobs.staged import (
    ATTEMPT_PREFIX_WIDTH,
    CHUNK_RECORDS,
    LOG_CHUNK_BYTES,
    TAG,
    UNPLACED,
    attempt_prefix,
    chunk_rows,
    decode_chunk,
    encode_chunk,
    marker_key,
    read_marker,
    split_attempt_prefix,
)
from partq.publish.encode import encode, encode_one, replayable
from partq.storage.encoding import decode_record

__all__ = ["JobAborted", "JobFinished", "StagedRowsMismatch", "JobCommit", "StagedAttempt",
           "Stager", "new_job_id", "stage_rows", "commit_job", "abort_job", "resume_commits",
           "job_state", "list_stages", "orphaned_stages", "DEFAULT_BATCH_ROWS"]

DEFAULT_BATCH_ROWS = 10_000         # rows per staging (and commit) transaction
BATCH_BYTES = 64 << 20              # ... or fewer, when their records pass this many bytes


@dataclass(frozen=True)
class StagedAttempt:
    """Rows staged by one task attempt and not yet committed or aborted. ``job_state`` is None
    while the job is open (running, or its coordinator died), else the state its marker records:
    "committing" while (or when) a commit was under way, otherwise a leftover, which the refusal
    rule above should make impossible. ``staged_at_ns`` is the wall time its first row was
    staged."""
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


class Stager:
    """Stages the rows of one task attempt, ``batch_rows`` rows per write transaction (fewer
    when their records pass ``BATCH_BYTES``, so big payloads do not make huge transactions).

    ``add``/``add_many`` encode rows at once (a bad payload or key raises ``InvalidMessage``
    before anything of its batch is written); ``close()`` writes the last batch and returns the
    row count to report to the coordinator. The first write also drops anything an earlier
    incarnation of the same attempt id left under its prefix. ``next_chunk``: where a stager
    that carries on an attempt begun by another one (``next_chunk`` of that one) numbers on.
    """

    def __init__(self, broker, queue: str, job_id: str, task_partition: int, attempt_id: int,
                 batch_rows: int = DEFAULT_BATCH_ROWS, next_chunk: int = 0) -> None:
        if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
            raise InvalidConfig(f"batch_rows must be a positive integer, not {batch_rows!r}")
        self._broker = broker
        self._job_id = job_id
        self._prefix = attempt_prefix(job_id, task_partition, attempt_id)
        self._marker = marker_key(job_id)
        self._config = broker.publisher.config(queue)   # QueueNotFound before anything is staged
        # keyed rows are placed here by this count; 0 (an exclusive queue): all placed at commit
        self._count = self._config.partitions if self._config.partitioned else 0
        self._batch_rows = batch_rows
        self._open: dict[int, list[bytes]] = {}        # partition (or UNPLACED) -> chunk filling
        self._chunks: list[bytes] = []                 # sealed, not yet written
        self._pending_rows = 0
        self._pending_bytes = 0
        self._next_chunk = next_chunk
        self.rows = 0

    def add(self, payload, key: str | None = None, headers: dict | None = None) -> None:
        now = self._broker.clock.wall_ns()
        self.add_encoded(self._encoded(lambda config: [encode_one(config, payload, key, headers,
                                                                  now)]))

    def add_many(self, payloads: Iterable, keys: Iterable | None = None) -> None:
        """Stage ``payloads[i]`` with ``keys[i]`` (or unkeyed when ``keys`` is None)."""
        self.add_items(payloads if keys is None else zip(payloads, keys, strict=True))

    def add_items(self, items: Iterable) -> None:
        """Stage items as ``Broker.publish_many`` takes them: ``payload``, ``(payload, key)``
        or ``(payload, key, headers)``."""
        items = replayable(items)
        now = self._broker.clock.wall_ns()
        self.add_encoded(self._encoded(lambda config: encode(config, items, now)))

    def _encoded(self, encode_with) -> list:
        """Rows encoded as a publish encodes them: checked against the queue's limits as this
        process knows them, and against the stored ones when those refuse a row (another
        process may have raised a limit); ``flush`` checks them again when a limit was lowered."""
        self._config, encoded = self._broker.publisher.configs.encoded(self._config.name,
                                                                          encode_with)
        return encoded

    def add_encoded(self, encoded: list) -> None:
        """Stage rows as ``partq.publish.encode.encode`` gives them: (key hash or None, record)."""
        pos = 0
        while pos < len(encoded):
            part = encoded[pos:pos + self._batch_rows - self._pending_rows]
            sizes = list(accumulate(len(record) for _, record in part))
            room = BATCH_BYTES - self._pending_bytes
            if sizes[-1] > room:    # fewer rows, so the transaction stays within BATCH_BYTES
                part = part[:bisect_left(sizes, room) + 1]
            pos += len(part)
            self._place(part)
            self._pending_rows += len(part)
            self._pending_bytes += sizes[len(part) - 1]
            if self._pending_rows >= self._batch_rows or self._pending_bytes >= BATCH_BYTES:
                self.flush()

    def _place(self, part: list) -> None:
        """Put rows into the open chunk of their partition (rule `key-hash`; unkeyed ones: UNPLACED), and
        seal each chunk that reaches one log chunk's size."""
        count = self._count
        if not count:
            ps = [UNPLACED] * len(part)
        else:
            try:
                ps = [key_hash % count for key_hash, _ in part]
            except TypeError:       # unkeyed rows among them
                ps = [UNPLACED if key_hash is None else key_hash % count for key_hash, _ in part]
        buckets: dict[int, list[bytes]] = {p: [] for p in set(ps)}
        for p, (_, record) in zip(ps, part, strict=True):
            buckets[p].append(record)
        for p, records in buckets.items():
            opened = self._open.setdefault(p, [])
            opened += records
            while len(opened) >= CHUNK_RECORDS or sum(map(len, opened)) >= LOG_CHUNK_BYTES:
                cut = min(CHUNK_RECORDS, bisect_left(list(accumulate(map(len, opened))),
                                                     LOG_CHUNK_BYTES) + 1)
                self._chunks.append(encode_chunk(count, p, opened[:cut]))
                del opened[:cut]
                if not opened:
                    del self._open[p]
                    break

    def flush(self) -> None:
        """Write everything added so far in one transaction."""
        for p, records in sorted(self._open.items()):
            self._chunks.append(encode_chunk(self._count, p, records))
        self._open.clear()
        if not self._chunks:
            return
        chunks, first, start = self._chunks, self._next_chunk == 0, self._next_chunk
        prefix, marker, job_id = self._prefix, self._marker, self._job_id
        configs, checked_with = self._broker.publisher.configs, self._config

        def op(w):
            raw = w.meta(marker)
            if raw is not None:
                state = (read_marker(w, job_id) or {}).get("state")
                raise JobFinished(f"job {job_id} was already {state}; this task attempt is late "
                                  f"and its rows were not staged (nothing to do)")
            # a limit lowered since the rows were checked refuses them, as it refuses a publish
            configs.check_again(w, checked_with, lambda: (
                record for chunk in chunks for record in decode_chunk(chunk, "staging").records))
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

    @property
    def next_chunk(self) -> int:
        return self._next_chunk


def stage_rows(broker, queue: str, job_id: str, task_partition: int, attempt_id: int,
               rows: Iterable, batch_rows: int = DEFAULT_BATCH_ROWS) -> int:
    """Stage ``rows`` for one task attempt and return how many were staged. Items are those of
    ``Broker.publish_many``: ``payload``, ``(payload, key)`` or ``(payload, key, headers)``."""
    stager = Stager(broker, queue, job_id, task_partition, attempt_id, batch_rows)
    batch: list = []
    for item in rows:
        batch.append(item)
        if len(batch) >= batch_rows:
            stager.add_items(batch)
            batch = []
    stager.add_items(batch)
    return stager.close()


def job_state(broker, job_id: str) -> dict | None:
    """The job's marker (``{"state": "committing" | "committed" | "aborted", "rows", ...}``) or
    None while the job is open or unknown."""
    with broker.store.read() as r:
        return read_marker(r, job_id)


# ---------------------------------------------------------------------- inspection
def stages(r, under: bytes = TAG) -> list[StagedAttempt]:
    """Every attempt with staged rows under ``under``, as the read snapshot ``r`` sees them."""
    out = []
    states: dict[str, str | None] = {}
    for prefix, chunks in sorted(r.staged_prefixes(ATTEMPT_PREFIX_WIDTH).items()):
        if not prefix.startswith(under) or len(prefix) != ATTEMPT_PREFIX_WIDTH:
            continue
        job_id, tp, aid = split_attempt_prefix(prefix)
        rows, staged_at = 0, None
        for raw in r.staged(prefix):   # a commit under way may have moved the first ones
            rows += chunk_rows(raw)
            if staged_at is None:
                records = decode_chunk(raw, f"job {job_id}").records
                if records:
                    staged_at = decode_record(records[0], "(staged)", tp, 0).publish_time_ns
        if job_id not in states:
            try:
                marker = read_marker(r, job_id)
            except InvalidConfig:   # not a job id this module wrote
                marker = None
            states[job_id] = marker.get("state") if marker else None
        out.append(StagedAttempt(job_id, tp, aid, chunks, rows, staged_at, states[job_id]))
    return out


def list_stages(broker) -> list[StagedAttempt]:
    """Every task attempt with staged rows, by job, task partition and attempt. Reads every
    staged chunk's header: an inspection tool, not a hot path."""
    with broker.store.read() as r:
        return stages(r)


def orphaned_stages(broker, older_than: float = 3600.0, now_ns: int | None = None) -> list[StagedAttempt]:
    """Staged attempts no running job is likely to commit: those of a committed or aborted job,
    and those whose first row was staged more than ``older_than`` seconds ago (the job's
    coordinator probably died). Remove them with ``abort_job(broker, s.job_id)``; a job left
    *committing* is finished with ``resume_commits(broker)`` instead (abort keeps its rows)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    limit = now_ns - int(older_than * 1e9)
    return [s for s in list_stages(broker)
            if s.job_state is not None or (s.staged_at_ns is not None and s.staged_at_ns <= limit)]


# ---------------------------------------------------------------------- through partq serve
SPARK_OPS = frozenset({"logs", "read", "stage", "commit_job", "abort_job", "resume_commits",
                       "ensure_queue"})


def ensure_queue(broker, queue: str, partitions: int | None, where: str) -> None:
    """Make sure ``queue`` exists (a Spark writer's target): created with ``partitions`` when
    given (another writer creating it meanwhile is fine), else ``QueueNotFound`` saying where."""
    try:
        broker.queue_config(queue)
    except QueueNotFound:
        if partitions is None:
            raise QueueNotFound(f"no queue named {queue!r} {where}; create it first or pass "
                                f".option('partitions', N) to create it") from None
        broker.create_queue(queue, partitions=partitions, exist_ok=True)


def spark_request(broker, frame: dict) -> dict:
    """Answer one request of the Spark source reaching ``broker`` through ``partq serve``
    (rule `spark-remote`; the client side is ``partq.spark.access``): the fields of the answer, which the
    server sends under the request's ``op`` and ``req``. Reads change nothing; staging and
    commits are the functions above, run on the server, so their guarantees hold there.

        logs {queue, known}                     -> {logs}    (``QueueLogs.as_doc``)
        read {queue, qid, partition, start, end} -> {records: [[seq, raw], ...], next}
        stage {queue, job, task_partition, attempt, next_chunk, payloads, keys}
                                                -> {rows, next_chunk}
        commit_job {queue, job, attempts, slice_rows} -> {published, discarded, already_committed}
        abort_job {job}                         -> {dropped}
        resume_commits {slice_rows}             -> {jobs}
        ensure_queue {queue, partitions}        -> {}    (created when partitions is given)

    A request with a missing or mistyped field raises ``FrameError`` (the connection ends);
    everything else a ``PartqError``, answered as an error frame."""
    from partq.jobs.log_ranges import queue_logs, read_range

    op = frame.get("op")

    def field(name: str, kind: type, optional: bool = False):
        value = frame.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise FrameError(f"request {op!r} needs {name!r} as {kind.__name__}, not {value!r}")
        return value

    if op == "logs":
        known = frame.get("known") or []
        if not isinstance(known, list) or not all(type(p) is int for p in known):
            raise FrameError("request 'logs' needs 'known' as a list of partitions")
        return {"logs": queue_logs(broker.store, field("queue", str), known).as_doc()}
    if op == "read":
        got = read_range(broker.store, field("queue", str), field("qid", int),
                         field("partition", int), field("start", int), field("end", int))
        return {"records": [[seq, raw] for seq, raw in got.records], "next": got.next}
    if op == "stage":
        payloads, keys = field("payloads", list), field("keys", list)
        if len(keys) != len(payloads):
            raise FrameError("request 'stage' needs as many keys as payloads")
        stager = Stager(broker, field("queue", str), field("job", str),
                        field("task_partition", int), field("attempt", int),
                        next_chunk=field("next_chunk", int))
        stager.add_many(payloads, keys)
        return {"rows": stager.close(), "next_chunk": stager.next_chunk}
    if op == "commit_job":
        attempts = field("attempts", list)
        if not all(isinstance(a, list) for a in attempts):
            raise FrameError("request 'commit_job' needs 'attempts' as a list of lists")
        done = commit_job(broker, field("queue", str), field("job", str),
                          [tuple(a) for a in attempts], field("slice_rows", int))
        return {"published": done.published, "discarded": done.discarded,
                "already_committed": done.already_committed}
    if op == "abort_job":
        return {"dropped": abort_job(broker, field("job", str))}
    if op == "resume_commits":
        return {"jobs": len(resume_commits(broker, field("slice_rows", int)))}
    if op == "ensure_queue":
        ensure_queue(broker, field("queue", str), field("partitions", int, optional=True),
                     "on the server")
        return {}
    raise FrameError(f"unknown request {op!r}")
