"""How the Spark source reaches a queue: the directory on this host, or ``partq serve`` (rule `spark-remote`).

``open_access(where)`` returns a ``LocalAccess`` (``path``: LMDB opened in this process, right
for Spark's local mode and one host) or a ``RemoteAccess`` (``address``: every read, bind,
staging and commit goes through ``partq serve``, which keeps the exactly-once protocol on the
server). Both have the same methods; each Spark task or driver step opens one, uses it and
closes it (LMDB environments never cross ``fork()``).
"""
from __future__ import annotations

from collections.abc import Iterable

from partq.errors import InvalidConfig, NotAPartqStore
from partq.jobs.log_ranges import QueueLogs, RangeRead, queue_logs, read_range
from partq.spark.options import Where


def open_access(where: Where, consume: bool = False):
    """An access to ``where``. ``consume``: this process will bind a flow (opens a full broker,
    with its timers, instead of the store alone)."""
    if where.address is not None:
        return RemoteAccess(where)
    return LocalAccess(where, consume)


class _Closing:
    """``with`` closes: each access below has ``close()``."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalAccess(_Closing):
    def __init__(self, where: Where, consume: bool = False) -> None:
        from partq.broker import Broker
        from partq.storage import Store
        self.where = where
        self.queue = where.queue
        self._broker: Broker | None = None
        try:
            if consume:
                self._broker = Broker.open(str(where.path), create=False)
                self.store: Store = self._broker.store
            else:
                self.store = Store.open(str(where.path), create=False)
        except NotAPartqStore as exc:
            raise NotAPartqStore(f"{exc}: check option path") from None

    def logs(self, known: Iterable[int] = ()) -> QueueLogs:
        return queue_logs(self.store, self.queue, known)

    def read(self, qid: int, partition: int, start: int, end: int, cache: list | None) -> RangeRead:
        return read_range(self.store, self.queue, qid, partition, start, end, cache=cache)

    def bind(self, name: str):
        if self._broker is None:
            raise InvalidConfig("this access was opened to read only; open it with consume=True")
        return self._broker.bind(self.queue, name=name)

    def close(self) -> None:
        if self._broker is not None:
            self._broker.close()
        else:
            self.store.close()


class RemoteAccess(_Closing):
    def __init__(self, where: Where) -> None:
        from partq.remote.client import connect
        self.where = where
        self.queue = where.queue
        self.client = connect(where.address, token=where.token, ssl=where.ssl_context())

    def logs(self, known: Iterable[int] = ()) -> QueueLogs:
        return QueueLogs.from_doc(self.client.call({"op": "logs", "queue": self.queue,
                                                    "known": sorted(known)})["logs"])

    def read(self, qid: int, partition: int, start: int, end: int, cache: list | None) -> RangeRead:
        doc = self.client.call({"op": "read", "queue": self.queue, "qid": qid,
                                "partition": partition, "start": start, "end": end})
        return RangeRead([(int(s), bytes(r)) for s, r in doc["records"]], int(doc["next"]))

    def bind(self, name: str):
        return self.client.bind(self.queue, name=name)

    def close(self) -> None:
        self.client.close()


# ---------------------------------------------------------------------- the writer's side
class LocalJobs(_Closing):
    """Staging and committing jobs in the directory on this host (``partq.jobs.staging``)."""

    def __init__(self, where: Where) -> None:
        from partq.broker import Broker
        self.queue = where.queue
        try:
            self._broker = Broker.open(str(where.path), create=False, auto_tick=False)
        except NotAPartqStore as exc:
            raise NotAPartqStore(f"{exc} (or pass .option('partitions', N) to create the store "
                                 f"and the queue)") from None

    def stager(self, job_id: str, task_partition: int, attempt_id: int, batch_rows: int):
        from partq.jobs.staging import Stager
        return Stager(self._broker, self.queue, job_id, task_partition, attempt_id, batch_rows)

    def commit(self, job_id: str, attempts: list, slice_rows: int):
        from partq.jobs.staging import commit_job
        return commit_job(self._broker, self.queue, job_id, attempts, slice_rows)

    def abort(self, job_id: str) -> int:
        from partq.jobs.staging import abort_job
        return abort_job(self._broker, job_id)

    def resume(self, slice_rows: int) -> int:
        from partq.jobs.staging import resume_commits
        return len(resume_commits(self._broker, slice_rows))

    def close(self) -> None:
        self._broker.close()


def ensure_local_queue(path: str, queue: str, partitions: int | None) -> None:
    """Make sure ``queue`` exists in ``path``, creating both when ``partitions`` is given."""
    from partq.broker import Broker
    from partq.jobs.staging import ensure_queue
    try:
        broker = Broker.open(path, create=partitions is not None, auto_tick=False)
    except NotAPartqStore as exc:
        raise NotAPartqStore(f"{exc} (or pass .option('partitions', N) to create the store and "
                             f"the queue)") from None
    try:
        ensure_queue(broker, queue, partitions, f"in {path}")
    finally:
        broker.close()


class RemoteJobs(_Closing):
    """The same verbs as ``LocalJobs``, run by ``partq serve`` (``partq.jobs.staging.spark_request``)."""

    def __init__(self, where: Where) -> None:
        from partq.remote.client import connect
        self.queue = where.queue
        self.client = connect(where.address, token=where.token, ssl=where.ssl_context())

    def stager(self, job_id: str, task_partition: int, attempt_id: int, batch_rows: int):
        return RemoteStager(self, job_id, task_partition, attempt_id, batch_rows)

    def commit(self, job_id: str, attempts: list, slice_rows: int):
        from partq.jobs.commit import JobCommit
        doc = self.client.call({"op": "commit_job", "queue": self.queue, "job": job_id,
                                "attempts": [list(a) for a in attempts], "slice_rows": slice_rows})
        return JobCommit(job_id, doc["published"], doc["discarded"], doc["already_committed"])

    def abort(self, job_id: str) -> int:
        return int(self.client.call({"op": "abort_job", "job": job_id})["dropped"])

    def resume(self, slice_rows: int) -> int:
        return int(self.client.call({"op": "resume_commits", "slice_rows": slice_rows})["jobs"])

    def ensure_queue(self, partitions: int | None) -> None:
        self.client.call({"op": "ensure_queue", "queue": self.queue, "partitions": partitions})

    def close(self) -> None:
        self.client.close()


class RemoteStager:
    """A task attempt's ``Stager`` on the server: rows go in requests of at most a batch (and a
    quarter of the server's frame limit); each is staged in one transaction there."""

    def __init__(self, jobs: RemoteJobs, job_id: str, task_partition: int, attempt_id: int,
                 batch_rows: int) -> None:
        self._jobs = jobs
        self._frame = {"op": "stage", "queue": jobs.queue, "job": job_id,
                       "task_partition": task_partition, "attempt": attempt_id}
        self._batch_rows = batch_rows
        self._payloads: list[bytes] = []
        self._keys: list = []
        self._size = 0
        self._next_chunk = 0
        self.rows = 0

    def add_many(self, payloads: Iterable, keys: Iterable | None = None) -> None:
        payloads = list(payloads)
        keys = [None] * len(payloads) if keys is None else list(keys)
        if len(keys) != len(payloads):
            raise InvalidConfig("add_many needs as many keys as payloads")
        limit = self._jobs.client.max_frame // 4
        for payload, key in zip(payloads, keys, strict=True):
            self._payloads.append(payload)
            self._keys.append(key)
            self._size += len(payload) + 64
            if len(self._payloads) >= self._batch_rows or self._size >= limit:
                self.flush()

    def flush(self) -> None:
        if not self._payloads:
            return
        doc = self._jobs.client.call({**self._frame, "next_chunk": self._next_chunk,
                                      "payloads": self._payloads, "keys": self._keys})
        self.rows += int(doc["rows"])
        self._next_chunk = int(doc["next_chunk"])
        self._payloads, self._keys, self._size = [], [], 0

    def close(self) -> int:
        self.flush()
        return self.rows


def open_jobs(where: Where):
    return RemoteJobs(where) if where.address is not None else LocalJobs(where)
