"""Committing and aborting staged jobs: exactly once (rule `spark-exactly-once`), one batch a transaction.

``commit_job`` runs in two steps. *Begin*, one short transaction: every accepted attempt's
staged row count is checked against what its task reported (a difference publishes nothing:
``StagedRowsMismatch``), the whole job passes the gate every publish passes
(``Publisher.admit``: rules `ingress-egress` and `quota`, all its rows and their bytes at
once): refused (``IngressDisabled``, ``QueueFull``), nothing is published and the job stays
open, to be committed again or aborted; discarded (ingress off, or over a quota, where the
queue discards), the whole job is dropped and counted. Then the job is marked *committing* with
its queue, accepted attempts and progress. From then on no attempt may stage for it. *Slices*:
each transaction moves the next chunks of at most ``slice_rows`` rows (``SLICE_BYTES``) into
the queue, drops them from staging and records how far it got, all in that transaction; the
last one also drops every other staged row of the job (failed and speculative attempts) and
marks the job committed. Another publisher waits for one slice at most, never for the whole
job. Each slice passes the gate again (another publisher may have filled the queue since the
begin, or ingress was disabled): a slice refused leaves the job committing (below); one
discarded is counted in the job's ``discarded``.

Chunks staged by partition (see ``partq.jobs.staged``) are appended as they are when the queue still
has the partition count they were staged for; otherwise (a scale meanwhile, an exclusive queue,
unkeyed rows) their rows are placed one by one by the count and partitioner the slice's
transaction sees (rules `key-hash` and `unkeyed-partitioner`).

Exactly once across failures: each slice's progress commits with its rows, so a commit that
stops part way (its process died, ingress was disabled with reject under it, the queue reached
its quota, the store filled up) leaves the job *committing* with the rest staged, and
``commit_job`` of the same job or ``resume_commits`` goes on from there. ``abort_job`` keeps a
committing job's rows (part of the job is published already: dropping the rest would lose it).
Consumers see a job's rows appear slice by slice while it commits.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from partq.errors import (
    IngressDisabled,
    InvalidConfig,
    JobAborted,
    QueueFull,
    QueueNotFound,
    StagedRowsMismatch,
)
from partq.jobs.staged import (
    JOB_PREFIX_WIDTH,
    TAG,
    attempt_prefix,
    chunk_at,
    chunk_key,
    chunk_record_bytes,
    chunk_rows,
    decode_chunk,
    job_prefix,
    read_marker,
    write_marker,
)
from partq.publish import quota

log = logging.getLogger("partq.staging")

DEFAULT_SLICE_ROWS = 10_000        # rows per commit transaction
SLICE_BYTES = 16 << 20             # ... or fewer, once their staged chunks pass this many bytes


@dataclass(frozen=True)
class JobCommit:
    """What ``commit_job`` did. ``already_committed``: an earlier commit of this job published
    its rows; this one published nothing. ``discarded``: rows counted and dropped because the
    queue's ingress was disabled without reject (rule `ingress-egress`)."""
    job_id: str
    published: int
    discarded: int = 0
    already_committed: bool = False


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


def commit_job(broker, queue: str, job_id: str, attempts: Iterable,
               slice_rows: int = DEFAULT_SLICE_ROWS) -> JobCommit:
    """Publish the staged rows of the successful ``attempts``, exactly once, in transactions of
    at most ``slice_rows`` rows (see the module documentation).

    ``attempts``: ``(task_partition, attempt_id)`` or ``(task_partition, attempt_id, rows)``
    per task partition; with ``rows`` the staged count is checked first and a difference fails
    the whole commit (``StagedRowsMismatch``) with nothing published. Idempotent: committing a
    committed job publishes nothing and returns ``already_committed=True``; committing an
    aborted job raises ``JobAborted``; committing a job left *committing* finishes it.
    """
    if isinstance(slice_rows, bool) or not isinstance(slice_rows, int) or slice_rows < 1:
        raise InvalidConfig(f"slice_rows must be a positive integer, not {slice_rows!r}")
    ordered = [(tp, aid, rows, attempt_prefix(job_id, tp, aid))
               for tp, aid, rows in _attempt_list(attempts)]
    publisher = broker.publisher
    publisher.config(queue)   # QueueNotFound with its hint before any work

    def begin(w):
        marker = read_marker(w, job_id)
        if marker is not None:
            state = marker.get("state")
            if state == "committed":
                w.drop_staged(job_prefix(job_id))
                return JobCommit(job_id, 0, 0, already_committed=True)
            if state != "committing":
                raise JobAborted(f"job {job_id} was aborted and its staged rows dropped; run the "
                                 f"job again")
            if marker["queue"] != queue or marker["attempts"] != [[tp, aid] for tp, aid, _, _ in ordered]:
                raise InvalidConfig(f"job {job_id} is being committed into queue "
                                    f"{marker['queue']!r} with attempts {marker['attempts']}; "
                                    f"finish it with resume_commits")
            return None
        total = 0
        for tp, aid, expected, prefix in ordered:
            n = sum(chunk_rows(raw) for raw in w.staged(prefix))
            if expected is not None and n != expected:
                raise StagedRowsMismatch(
                    f"job {job_id} task partition {tp} attempt {aid} reported {expected} rows but "
                    f"{n} are staged; nothing was published: abort the job and run it again")
            total += n
        config = publisher.config_in(w, queue)
        # the bytes are read (every chunk decoded) only for a queue with max_bytes
        nbytes = sum(chunk_record_bytes(raw) for _, _, _, prefix in ordered
                     for raw in w.staged(prefix)) if config.max_bytes and total else 0
        try:
            # the whole job through the gate of every publish: IngressDisabled raised here
            # writes nothing and leaves the job open; a QueueFull is counted, then raised
            if total and not publisher.admit(w, config, total, nbytes):
                w.drop_staged(job_prefix(job_id))     # discarded whole, and counted
                write_marker(w, job_id, {"state": "committed", "rows": 0, "discarded": total,
                                         "time_ns": time.time_ns()})
                return JobCommit(job_id, 0, total)
        except QueueFull as full:
            quota.count_refused(w, config.qid, total)
            return _job_refused(full, f"job {job_id} was not published: its {total} rows stay "
                                      f"staged; commit it again once there is room, or abort it")
        write_marker(w, job_id, {"state": "committing", "queue": queue, "qid": config.qid,
                                 "attempts": [[tp, aid] for tp, aid, _, _ in ordered],
                                 "at": [0, 0], "rows": 0, "discarded": 0, "total": total,
                                 "time_ns": time.time_ns()})
        return None

    done = quota.refusal_raised(broker.store.write(begin))
    return done if done is not None else _finish(broker, job_id, slice_rows)


def _job_refused(full: QueueFull, what: str) -> QueueFull:
    """``full`` with what became of the job added to its message (its fields unchanged)."""
    full.args = (f"{full}. {what}",)
    return full


def _finish(broker, job_id: str, slice_rows: int) -> JobCommit:
    """Run the slices of a committing job until it is committed."""
    while True:
        try:
            marker = quota.refusal_raised(broker.store.write(
                lambda w: _slice(w, broker.publisher, job_id, slice_rows)))
        except QueueFull as full:
            state = read_state(broker, job_id)
            raise _job_refused(
                full, f"Job {job_id} had published {state.get('rows', 0)} of "
                      f"{state.get('total', '?')} rows; the rest stay staged: once consumers have "
                      f"made room, finish it with partq.jobs.staging.resume_commits (the next "
                      f"partq Spark write to this directory does), do not run the job again") \
                from None
        except IngressDisabled as exc:
            state = read_state(broker, job_id)
            raise IngressDisabled(
                f"{exc}. Job {job_id} had published {state.get('rows', 0)} of "
                f"{state.get('total', '?')} rows when ingress was disabled; the rest stay staged: "
                f"enable ingress and finish it with partq.jobs.staging.resume_commits (the next partq "
                f"Spark write to this directory does), do not run the job again") from None
        if marker.get("state") == "committed":
            return JobCommit(job_id, marker.get("rows", 0), marker.get("discarded", 0))


def read_state(broker, job_id: str) -> dict:
    with broker.store.read() as r:
        return read_marker(r, job_id) or {}


def _slice(w, publisher, job_id: str, slice_rows: int) -> dict | QueueFull:
    """One commit transaction: the next chunks of at most ``slice_rows`` rows. Returns the
    marker as it stands after it, or the ``QueueFull`` that refused the slice (counted; nothing
    else written)."""
    marker = read_marker(w, job_id)
    if marker is None or marker.get("state") == "aborted":
        raise JobAborted(f"job {job_id} was aborted while it was being committed")
    if marker["state"] == "committed":
        return marker                       # another commit of the job finished it
    queue, attempts = marker["queue"], marker["attempts"]
    i, number = marker["at"]
    config = publisher.config_in(w, queue)
    if config.qid != marker["qid"]:
        raise QueueNotFound(f"queue {queue!r} was deleted while job {job_id} was being committed "
                            f"into it; drop the job's rows with partq.jobs.staging.abort_job")
    fast = config.partitioned
    placed: dict[int, list[bytes]] = {}
    unplaced: list = []
    taken: list[bytes] = []         # keys of the chunks moved, dropped once the slice is admitted
    moved = size = 0
    while i < len(attempts) and moved < slice_rows and size < SLICE_BYTES:
        prefix = attempt_prefix(job_id, *attempts[i])
        raw = chunk_at(w, prefix, number)
        if raw is None:
            i, number = i + 1, 0
            continue
        chunk = decode_chunk(raw, f"job {job_id} task partition {attempts[i][0]}")
        if moved and moved + chunk.rows > slice_rows:
            break                   # the next slice takes it (a chunk never passes a batch)
        if fast and chunk.partition >= 0 and chunk.partition_count == config.partitions:
            placed.setdefault(chunk.partition, []).extend(chunk.records)
        else:
            unplaced.extend(zip(chunk.hashes(f"job {job_id}"), chunk.records, strict=True))
        taken.append(chunk_key(prefix, number))
        number += 1
        moved += chunk.rows
        size += len(raw)
    nbytes = sum(len(r) for records in placed.values() for r in records) + \
        sum(len(r) for _, r in unplaced) if config.max_bytes else 0
    try:
        admitted = publisher.admit(w, config, moved, nbytes) if moved else True
    except QueueFull as full:
        quota.count_refused(w, config.qid, moved)
        return full
    for key in taken:
        w.drop_staged(key)
    published = discarded = 0
    if admitted:
        for p in sorted(placed):
            w.append(config.qid, p, placed[p])
        if unplaced:
            publisher.append_admitted(w, config, unplaced)
        published = moved
    else:
        discarded = moved                   # ingress off or over a quota, and the queue discards
    rows, discarded = marker["rows"] + published, marker["discarded"] + discarded
    if i >= len(attempts):
        w.drop_staged(job_prefix(job_id))     # failed and speculative attempts
        marker = {"state": "committed", "rows": rows, "discarded": discarded,
                  "time_ns": time.time_ns()}
    else:
        marker = {**marker, "at": [i, number], "rows": rows, "discarded": discarded}
    write_marker(w, job_id, marker)
    return marker


def abort_job(broker, job_id: str) -> int:
    """Drop every row staged for ``job_id`` and mark it aborted, so late attempts stage nothing
    and a later ``commit_job`` raises ``JobAborted``. Returns the rows dropped. Aborting a job
    that was already committed changes nothing (its rows are published) and returns 0; so does
    aborting a job whose commit began (part of it is published: ``resume_commits`` finishes
    it), unless its queue is gone."""
    prefix = job_prefix(job_id)

    def op(w):
        marker = read_marker(w, job_id) or {}
        state = marker.get("state")
        if state == "committing":
            raw = w.queue_raw(marker["queue"])
            if raw is not None and w.queue(marker["queue"])["qid"] == marker["qid"]:
                return None
        if state == "committed":
            w.drop_staged(prefix)
            return 0
        dropped = sum(chunk_rows(raw) for raw in w.staged(prefix))
        w.drop_staged(prefix)
        if state != "aborted":
            write_marker(w, job_id, {"state": "aborted", "rows": dropped, "time_ns": time.time_ns()})
        return dropped
    dropped = broker.store.write(op)
    if dropped is None:
        log.warning("job %s is being committed (part of it is published), so aborting it keeps "
                    "its staged rows; partq.jobs.staging.resume_commits publishes the rest", job_id)
        return 0
    return dropped


def committing_jobs(broker) -> list[str]:
    """Jobs whose commit began and did not finish."""
    with broker.store.read() as r:
        jobs = sorted({p[len(TAG):JOB_PREFIX_WIDTH].decode("ascii", "replace")
                       for p in r.staged_prefixes(JOB_PREFIX_WIDTH)})
        return [job for job in jobs if (read_marker(r, job) or {}).get("state") == "committing"]


def resume_commits(broker, slice_rows: int = DEFAULT_SLICE_ROWS) -> list[JobCommit]:
    """Finish every job whose commit began and stopped (its coordinator died, or ingress was
    disabled under it); returns what each did. Safe while such a commit still runs elsewhere:
    each slice moves on from the progress its own transaction reads."""
    done = []
    for job_id in committing_jobs(broker):
        log.warning("finishing the interrupted commit of staged job %s", job_id)
        done.append(_finish(broker, job_id, slice_rows))
    return done
