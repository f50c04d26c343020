"""``spark.readStream.format("partq")``: a queue consumed by a Structured Streaming query (rule
`spark-stream`).

The query is one named consumer of the queue: its driver-side reader binds a flow (option
``consumer``; by default a name chosen when the query starts and kept in its checkpoint's
offsets, so a restarted query is the same consumer and gets its partitions back, rule `named-flows`) and
reads only the logs that flow holds, so no other consumer of the queue is given the same
messages. Offsets are per-log sequences (``spark.offsets``). A micro-batch reads the range
between two offsets straight from the logs, in Spark tasks, and reads it identically as long as
Spark has not committed it (nothing inside it is acked before). ``commit(end)`` acks every log
the flow holds up to ``end`` (``Flow.ack_through``): the queue drains and truncates as the
query commits, and with a checkpoint and a file sink every message lands exactly once across a
killed and restarted query.

Spark commits a micro-batch when it plans the next one; after a micro-batch that read messages,
the next trigger plans one even without new messages (an empty one, see ``spark.offsets``), so
an idle or available-now query leaves nothing unacked.

What can go wrong, each with one error: the queue deleted (or deleted and created again),
``QueueNotFound``; a scale-down that removed a partition the query had not read to its end,
``PartitionNotFound`` (messages deleted unread; ``failOnDataLoss=false`` goes on, logged);
a missing record inside a range, ``CorruptStore``; a damaged one, ``CorruptRecord``. Partitions
added by a scale-up are read from their first message. A partition the rebalancer moves to
another consumer stops advancing here; if it moves while a micro-batch that read it is not yet
committed, its new consumer gets those messages too, and the commit logs a warning saying so.
"""
from __future__ import annotations

import logging
import uuid

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from partq.errors import FlowClosed, FlowFenced, InvalidConfig, PartitionNotFound, QueueNotFound
from partq.jobs.log_ranges import QueueLogs
from partq.spark import offsets
from partq.spark.access import open_access
from partq.spark.options import Where
from partq.spark.ranges import LogRange, read_batches

log = logging.getLogger("partq.spark")


class _Consumer:
    """The flow a running query holds, in the driver process that plans its micro-batches."""

    def __init__(self, where: Where, name: str) -> None:
        self.name = name
        self.access = open_access(where, consume=True)
        try:
            self.flow = self.access.bind(name)
        except BaseException:
            self.access.close()
            raise
        log.info("stream bound to queue %r as consumer %r: partitions %s", where.queue, name,
                 sorted(self.flow.partitions))

    def held(self) -> frozenset[int]:
        if self.flow.closed:        # unbound under it (a change of access type): bind again
            log.warning("consumer %r was unbound (%s); binding again", self.name,
                        self.flow.closed_reason)
            self.flow = self.access.bind(self.name)
        return self.flow.partitions

    def close(self) -> None:
        try:
            self.flow.unbind()
        finally:
            self.access.close()


class PartqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark builds one in the process that plans the query (where it binds, lazily) and others
    to run tasks; only plain values are pickled."""

    def __init__(self, where: Where, consumer: str | None, max_rows: int | None,
                 fail_on_data_loss: bool, split_rows: int) -> None:
        self.where, self.consumer, self.max_rows = where, consumer, max_rows
        self.fail_on_data_loss, self.split_rows = fail_on_data_loss, split_rows
        self._chosen: str | None = None          # the name of a new query's consumer
        self._target: dict[int, int] | None = None
        self._run: _Consumer | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_run": None}

    # ------------------------------------------------------------------ the consumer
    def _consumer(self, offset: dict | None) -> _Consumer:
        name = self.consumer or (offset or {}).get("consumer") or self._new_name()
        if self._run is None or self._run.name != name:
            if self._run is not None:
                self._run.close()
            self._run = _Consumer(self.where, name)
        return self._run

    def _new_name(self) -> str:
        if self._chosen is None:
            self._chosen = f"spark-{uuid.uuid4().hex[:16]}"
        return self._chosen

    def _logs(self, offset: dict | None = None) -> QueueLogs:
        run = self._consumer(offset)
        try:
            logs = run.access.logs(known=offsets.seqs_of(offset) if offset else ())
        except QueueNotFound as exc:
            if offset is None:
                raise
            raise QueueNotFound(f"queue {self.where.queue!r} was deleted while this query read "
                                f"it ({exc}); its unread messages are gone") from None
        if offset is not None and logs.qid != offset["qid"]:
            raise QueueNotFound(f"queue {logs.queue!r} was deleted and created again since this "
                                f"query read it (its checkpoint is for the old queue); start the "
                                f"query with a new checkpoint")
        return logs

    # ------------------------------------------------------------------ offsets
    def initialOffset(self) -> dict:
        logs = self._logs()
        return offsets.make(logs.queue, logs.qid, self._consumer(None).name,
                            {s.partition: s.floor for s in logs.logs}, unacked=False)

    def getDefaultReadLimit(self):
        return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

    def prepareForTriggerAvailableNow(self) -> None:
        with open_access(self.where) as access:
            self._target = {s.partition: s.head for s in access.logs().logs}

    def latestOffset(self, start: dict, limit) -> dict:
        logs = self._logs(start)
        seqs = offsets.seqs_of(start)
        self._check_gone(logs, seqs)
        heads = {s.partition: s.head for s in logs.logs}
        if self._target is not None:       # available now: never past what was there at start
            heads = {p: min(h, self._target.get(p, 0)) for p, h in heads.items()}
        floors = {s.partition: s.floor for s in logs.logs}
        if not isinstance(limit, (ReadAllAvailable, ReadMaxRows, ReadMinRows)):
            raise InvalidConfig(f"the partq source limits micro-batches in messages "
                                f"(maxMessagesPerTrigger), not by {type(limit).__name__}")
        end = offsets.plan_end(seqs, floors, heads, self._consumer(start).held(),
                               limit.max_rows if isinstance(limit, ReadMaxRows) else None,
                               limit.min_rows if isinstance(limit, ReadMinRows) else 0)
        if end == seqs:
            return {**start, "unacked": False} if start.get("unacked") else start
        return offsets.make(logs.queue, logs.qid, start["consumer"], end, unacked=True)

    def _check_gone(self, logs: QueueLogs, seqs: dict[int, int]) -> None:
        """Logs of the offsets that no longer exist (a scale-down): fine when the query had read
        them to their end, data loss otherwise."""
        for p, head in logs.gone:
            if seqs[p] >= head:
                continue
            text = (f"partition {p} of queue {logs.queue!r} was removed (scaled down to "
                    f"{logs.partitions} partitions) with messages {seqs[p]} to {head - 1} that "
                    f"this query had not read")
            if self.fail_on_data_loss:
                raise PartitionNotFound(f"{text}: they are gone. Drain the queue before scaling "
                                        f"it down; to go on without them, restart the query with "
                                        f".option('failOnDataLoss', 'false')")
            log.warning("%s; going on without them (failOnDataLoss=false)", text)

    # ------------------------------------------------------------------ micro-batches
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = offsets.seqs_of(start), offsets.seqs_of(end)
        if begin == finish:
            return []
        with open_access(self.where) as access:     # no flow needed: the range is fixed
            logs = access.logs()
        if logs.qid != end["qid"]:
            raise QueueNotFound(f"queue {logs.queue!r} was deleted and created again while this "
                                f"query read it; start the query with a new checkpoint")
        floors = {s.partition: s.floor for s in logs.logs}
        return [LogRange(end["qid"], p, lo, hi)
                for p, lo, hi in offsets.ranges(begin, finish, self.split_rows, floors)]

    def read(self, partition: InputPartition):
        return read_batches(self.where, partition)

    def commit(self, end: dict) -> None:
        """Ack, in every log this consumer holds, everything up to ``end`` (one commit each,
        all at once); a log it no longer holds is the new consumer's (logged)."""
        run = self._consumer(end)
        held = run.held()
        pending, lost = [], []
        seqs = offsets.seqs_of(end)
        for p, seq in seqs.items():
            if seq <= 0:
                continue
            if p not in held:
                lost.append(p)
                continue
            pending.append((p, run.flow.ack_through(p, seq - 1)))
        for p, done in pending:
            try:
                done.result()
            except FlowFenced:
                lost.append(p)
            except FlowClosed as exc:
                raise QueueNotFound(f"consumer {run.name!r} of queue {self.where.queue!r} was "
                                    f"unbound ({exc}); was the queue deleted?") from None
        if lost:
            floors = {s.partition: s.floor for s in run.access.logs().logs}
            behind = sorted(p for p in lost if floors.get(p, seqs[p]) < seqs[p])
            if behind:
                log.warning("consumer %r no longer holds partition(s) %s of queue %r: messages "
                            "it read there and Spark committed are not acked; their new consumer "
                            "gets them too", run.name, behind, self.where.queue)

    def stop(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None
