"""Copy-out: the unacked messages of a queue to another queue or to a file, re-runnable after any
interruption (SIGKILL included) without duplicates or gaps. ``copy_out`` is the whole operation
(``partq copy-out`` parses, calls it and prints its ``CopyReport``); ``plan``, ``copy`` and
``proven_copied`` are its steps, and ``partq.ops.copy_targets`` holds the destinations and how each makes a
re-run exact.

The upper bound of each partition is its head when the copy starts, so a busy publisher cannot
keep a copy running forever; run the copy again to take what came since.

The parent queue's log (``partq.PARENT``) is copied like any partition: its checkpoint names and
file records carry the integer 4294967295 as its partition. Copying it into the queue itself
(``to_queue=queue, parent=True``) is how an operator recovers the messages a change from
exclusive to non-exclusive left there, undelivered (rule `ingress-egress`); ``move`` also removes each copied
batch from the parent log once its copy is durable.

Nothing here handles signals: the caller passes ``stop()``, checked between batches.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from partq.config import QueueConfig
from partq.errors import CopyOutError, CorruptRecord, InvalidConfig
from partq.ops.browse import check_range, load_config, log_partitions, select_logs
from partq.ops.copy_targets import FORMATS, FileSink, QueueSink, checkpoint_name
from partq.ops.formatting import partition_label
from partq.storage import Record, decode_record
from partq.storage.encoding import PARENT, record_fields

if TYPE_CHECKING:
    from partq.broker import Broker
    from partq.storage import Store

READ_WINDOW = 10_000     # records per read snapshot when checking what an earlier run copied


@dataclass
class PartitionReport:
    """What a copy did with one log (a partition, or the parent queue's log)."""
    partition: int
    start: int                  # first sequence this run looked at
    end: int                    # last sequence this run may copy (-1: nothing to copy)
    resumed: bool               # an earlier run had copied up to start
    copied: int = 0
    skipped_acked: int = 0
    skipped_corrupt: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The report as ``partq copy-out --json`` prints it (``from_seq``, ``to_seq``, ...)."""
        return {"partition": self.partition, "from_seq": self.start, "to_seq": self.end,
                "resumed": self.resumed, "copied": self.copied,
                "skipped_acked": self.skipped_acked, "skipped_corrupt": self.skipped_corrupt}


@dataclass
class CopyReport:
    """What ``copy_out`` did. ``complete`` is False when ``stop()`` ended it between batches:
    everything reported was copied, and the same copy run again continues from there."""
    queue: str
    destination: dict           # the sink's description: to_queue, or to_file, format, ...
    copied: int
    complete: bool
    partitions: list[PartitionReport]
    removed_from_parent: int | None = None     # with move: messages removed from the parent log

    def as_dict(self) -> dict:
        """The report as ``partq copy-out --json`` prints it."""
        doc = {"queue": self.queue, **self.destination, "copied": self.copied,
               "complete": self.complete, "partitions": [p.as_dict() for p in self.partitions]}
        if self.removed_from_parent is not None:
            doc["removed_from_parent"] = self.removed_from_parent
        return doc

    @classmethod
    def from_dict(cls, doc: dict) -> CopyReport:
        """The report ``as_dict`` gave (``partq copy-out --address`` reads it from ``partq
        serve``)."""
        own = {"queue", "copied", "complete", "partitions", "removed_from_parent"}
        parts = [PartitionReport(p["partition"], p["from_seq"], p["to_seq"], p["resumed"],
                                 p["copied"], p["skipped_acked"], list(p["skipped_corrupt"]))
                 for p in doc["partitions"]]
        return cls(doc["queue"], {k: v for k, v in doc.items() if k not in own}, doc["copied"],
                   doc["complete"], parts, doc.get("removed_from_parent"))


def check_copy(queue: str, *, to_queue: str | None = None, to_file: str | None = None,
               fmt: str = "jsonl", overwrite: bool = False, partition: int | None = None,
               parent: bool = False, move: bool = False, from_seq: int | None = None,
               to_seq: int | None = None, batch: int = 1000) -> None:
    """Raise ``InvalidConfig`` when a ``copy_out`` request is inconsistent, before anything is
    opened (``copy_out`` checks it too)."""
    if parent and partition is not None and partition != PARENT:
        raise InvalidConfig("pass either --parent or --partition, not both")
    if (to_queue is None) == (to_file is None):
        raise InvalidConfig("pass exactly one of --to-queue DEST and --to-file PATH")
    if fmt not in FORMATS:
        raise InvalidConfig(f"--format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if batch < 1:
        raise InvalidConfig("--batch must be at least 1")
    check_range(from_seq, to_seq)
    parent = parent or partition == PARENT     # the integer --json prints for the parent log
    if move and not parent:
        raise InvalidConfig("--move applies to the parent-queue log only: pass --parent")
    if move and to_file == "-":
        raise InvalidConfig("--move removes what a durable copy holds: pass --to-queue DEST or "
                            "--to-file PATH, not standard output")
    if overwrite and to_file is None:
        raise InvalidConfig("--overwrite applies to --to-file only")
    if to_queue == queue and not parent:
        raise InvalidConfig("--to-queue must name another queue than the source (only --parent "
                            "copies into the source queue itself: its parent-queue log into its "
                            "partitions)")


def copy_out(broker: Broker | None, store: Store, queue: str, *, to_queue: str | None = None,
             to_file: str | None = None, fmt: str = "jsonl", overwrite: bool = False,
             partition: int | None = None, parent: bool = False, move: bool = False,
             from_seq: int | None = None, to_seq: int | None = None, batch: int = 1000,
             skip_corrupt: bool = False, progress: Callable[[int, int], None] | None = None,
             stop: Callable[[], bool] | None = None) -> CopyReport:
    """Copy the unacked messages of ``queue`` (every log, or ``partition`` / the ``parent``
    log; sequences ``from_seq`` to ``to_seq``) to queue ``to_queue`` or file ``to_file`` ("-":
    standard output) in ``fmt`` ("jsonl" or "msgpack"), ``batch`` messages per commit or fsync.
    Returns the ``CopyReport``.

    Run again after any interruption, the same copy continues where it stopped. ``broker``
    (the one ``store`` belongs to) is needed for ``to_queue`` and ``move``; None will do for a
    file. ``skip_corrupt`` copies past records that fail their checksum (else the copy stops at
    the first with ``CopyOutError``). ``move`` (parent log of a partitioned queue only) removes
    each batch from the parent log once its copy is durable, and first what an interrupted
    earlier run proved copied. ``progress(n, total)`` is called with 0 and the number of
    sequences to go through once they are known, then with each batch's count; ``stop()`` is
    checked between batches and ends the copy early (the report says ``complete=False``)."""
    check_copy(queue, to_queue=to_queue, to_file=to_file, fmt=fmt, overwrite=overwrite,
               partition=partition, parent=parent, move=move, from_seq=from_seq, to_seq=to_seq,
               batch=batch)
    if partition == PARENT:
        parent, partition = True, None
    if broker is None and (to_queue is not None or move):
        raise InvalidConfig("copying into a queue, or with move, needs the Broker: pass it")
    range_tag = ""       # an explicit range is a copy of its own (its own checkpoints)
    if from_seq is not None or to_seq is not None:
        range_tag = f":{from_seq or 0}-{'' if to_seq is None else to_seq}"
    with store.read() as r:
        config = load_config(r, queue)
        parts = select_logs(log_partitions(r, config), queue, partition, parent)
    if to_queue == queue and not config.partitioned:
        raise CopyOutError(f"queue {queue!r} is exclusive: its parent-queue log is the log it "
                           f"delivers, so copying it into {queue!r} would duplicate every "
                           f"message; copy it to another queue or a file, or make {queue!r} "
                           f"non-exclusive first (`partq queue update {queue} --access-type "
                           f"non-exclusive`)")
    if move and not config.partitioned:
        raise CopyOutError(f"queue {queue!r} is exclusive: it delivers its parent-queue log, so "
                           f"--move would take messages from its consumers; drop --move, or "
                           f"make it non-exclusive first")
    sink: QueueSink | FileSink
    if to_queue is not None:
        sink = QueueSink(broker, config, to_queue, range_tag)
    else:
        assert to_file is not None          # check_copy demands one destination
        sink = FileSink(to_file, fmt, config, overwrite)
    try:
        reports = plan(store, config, parts, from_seq or 0, to_seq, sink)
        moved = [0]
        remove = None
        if move and broker is not None:
            mover = broker

            def remove(seqs: list[int]) -> None:
                moved[0] += mover.ack_parent(queue, seqs)
            # an interrupted move may have copied a batch without removing it: remove what
            # that run (this same copy of this same queue) proved copied, and nothing else
            with store.read() as r:
                floor = r.ack_state(config.qid, PARENT).floor
            earlier = sink.copied_before(PARENT, max(from_seq or 0, floor))
            for seqs in proven_copied(store, config, PARENT, earlier):
                if seqs:
                    remove(seqs)
        total = sum(max(rep.end - rep.start + 1, 0) for rep in reports)
        if progress is not None:
            progress(0, total)
        copy(store, config, reports, sink, batch, skip_corrupt,
             advance=(lambda n: progress(n, total)) if progress is not None else (lambda n: None),
             stop=stop or (lambda: False), remove=remove)
    finally:
        sink.close()
    return CopyReport(queue, sink.describe(), sum(rep.copied for rep in reports),
                      complete=not (stop is not None and stop()), partitions=reports,
                      removed_from_parent=moved[0] if move else None)


def plan(store, config: QueueConfig, partitions: list[int], from_seq: int, to_seq: int | None,
         sink) -> list[PartitionReport]:
    """Where each partition starts (after what earlier runs copied) and ends (its head now):
    one ``PartitionReport`` per partition, nothing copied yet."""
    reports = []
    with store.read() as r:
        for p in partitions:
            head = r.head(config.qid, p)
            floor = r.ack_state(config.qid, p).floor
            done = sink.resume_after(p)
            start = max(from_seq, floor, 0 if done is None else done + 1)
            end = head - 1 if to_seq is None else min(to_seq, head - 1)
            reports.append(PartitionReport(p, start, end, resumed=done is not None
                                           and done + 1 > max(from_seq, floor)))
    return reports


def copy(store, config: QueueConfig, reports: list[PartitionReport], sink, batch: int,
         skip_corrupt: bool, advance: Callable[[int], None], stop: Callable[[], bool],
         remove: Callable[[list[int]], None] | None = None,
         keep: Callable[[int, Record], bool] | None = None, limit: int = 0) -> int:
    """Copy every unacked message of each planned partition, batch by batch, counting into
    ``reports``; ``advance(n)`` is told how many sequences each batch covered; ``stop()`` ends
    the copy between batches; ``remove(seqs)``, if given, is called with each batch's sequences
    once its copy is durable (move). ``keep(seq, record)``, if given, picks the messages to
    copy: the others are passed over, neither copied nor removed (a batch's ``last_seq``
    covers them all the same). ``limit`` (0: none) ends the copy once that many messages went
    to the sink, the last batch cut short there. Returns how many went to the sink. Raises
    ``CopyOutError`` at a corrupt record unless ``skip_corrupt``."""
    queue, qid = config.name, config.qid
    taken = 0
    for rep in reports:
        pos = rep.start
        while pos <= rep.end:
            if stop() or (limit and taken >= limit):
                return taken
            with store.read() as r:
                ack = r.ack_state(qid, rep.partition)
                records = r.records(qid, rep.partition, pos, min(batch, rep.end - pos + 1))
            items: list[tuple[int, Record]] = []
            last = None
            failure = None
            for seq, raw in records:
                if seq > rep.end:
                    break
                if ack.is_acked(seq):
                    rep.skipped_acked += 1
                    last = seq
                    continue
                try:
                    record = decode_record(raw, queue, rep.partition, seq)
                except CorruptRecord as exc:
                    if not skip_corrupt:
                        failure = exc
                        break
                    rep.skipped_corrupt.append(seq)
                else:
                    if keep is None or keep(seq, record):
                        items.append((seq, record))
                last = seq
                if limit and taken + len(items) >= limit:
                    break
            if last is not None:
                rep.copied += sink.write(rep.partition, last, items)
                taken += len(items)
                if remove is not None and items:
                    remove([seq for seq, _ in items])
                advance(last - pos + 1)
                pos = last + 1
            if failure is not None:
                raise CopyOutError(
                    f"corrupt record in queue {queue!r} partition {partition_label(rep.partition)} "
                    f"seq {failure.seq} "
                    f"({failure.reason}); everything before it was copied: run copy-out again "
                    f"with --skip-corrupt to copy past it, and `partq verify {queue}` to list "
                    f"damaged records")
            if last is None:
                break  # nothing left at or below the bound (acked and truncated meanwhile)
    return taken


def proven_copied(store, config: QueueConfig, partition: int,
                  seqs: range | list[int]) -> Iterator[list[int]]:
    """Of ``seqs`` (what an earlier run of this copy covered), those it really copied: the
    unacked records that are sound (a corrupt one was skipped, not copied). Yields them in
    lists, one per read snapshot."""
    if not seqs:
        return
    members = seqs if isinstance(seqs, range) else set(seqs)
    pos, end = min(seqs), max(seqs)
    while pos <= end:
        with store.read() as r:
            ack = r.ack_state(config.qid, partition)
            records = r.records(config.qid, partition, pos, min(READ_WINDOW, end - pos + 1))
        if not records:
            return
        yield [seq for seq, raw in records if seq <= end and seq in members
               and not ack.is_acked(seq) and record_fields(raw) is not None]
        pos = records[-1][0] + 1


@dataclass(frozen=True)
class Stranded:
    """Messages a change to non-exclusive left in a partitioned queue's parent-queue log,
    which nothing delivers any more (rule `ingress-egress`)."""
    queue: str
    count: int
    copied: bool    # already copied into the queue's partitions: its copy-out checkpoint
                    # covers the parent log's head; only their removal (move) is left to do


def stranded_state(broker: Broker, queue: str, parent_depth: int | None) -> Stranded | None:
    """What is stranded in the parent queue of ``queue``, given its ``parent_depth`` (from
    ``queue_status``): None when nothing is (no messages there, or the queue is exclusive and
    delivers that log), else a ``Stranded`` saying whether a copy into the queue itself
    (``copy_out(..., to_queue=queue, parent=True)``) already covers them."""
    if not parent_depth:
        return None
    config = broker.queue_config(queue)
    if not config.partitioned:
        return None
    done = broker.checkpoint(queue, checkpoint_name(config.qid, PARENT))
    copied = False
    if done is not None:
        with broker.store.read() as r:
            copied = done >= r.head(config.qid, PARENT)
    return Stranded(queue, parent_depth, copied)
