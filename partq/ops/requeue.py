"""Requeue: send the messages of a dead message queue back to the queues they died in (their
``origin_queue`` header) or to another queue, each published with its key, payload and own
headers (the ``dead_*``, ``origin_*`` and ``delivery_count`` headers the dead-letter step added
removed) and then acked in the dead message queue. ``partq dead requeue`` parses, calls
``requeue`` and prints its ``RequeueReport``.

It is a copy-out of the dead message queue (``partq.ops.copy_out``: ``plan`` and ``copy``) into
a sink that publishes each message to its own destination, with its dead-message-queue
partition's checkpoint in that destination, and acks it afterwards; ``keep`` leaves the
messages the filters (keys, dead reasons) pass over, or that have nowhere to go, untouched in
the dead message queue. A re-run after any interruption publishes nothing twice:

* every batch published into a destination stores, in the same commit, the checkpoint "the
  messages of this dead-message-queue partition below ``last_seq + 1`` that this requeue sends
  there are published" (``Broker.publish_many(checkpoint=...)``, as a copy-out into a queue);
* a message is acked in the dead message queue only once it is published, so a run that
  stopped between the two leaves messages unacked below a checkpoint: the next run of the same
  requeue (same destination rule, keys and reasons: the checkpoint's name says which) finds
  them there and acks them without publishing them again.

A requeue with other options has other checkpoints and would not know the first one's batch
was published, so a run marks its start and its end in the dead message queue (two checkpoints
holding a run number and its options' hash): while a run stopped in the middle of a batch, a
requeue with other options is refused until that one ran again. Two requeues of one dead
message queue never run at once (a lock file beside the queues' delivery locks).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from partq.config import QueueConfig
from partq.delivery.dead_letter import REASONS
from partq.delivery.lock import LOCK_DIR, OwnerLock
from partq.errors import (
    CopyOutError,
    IngressDisabled,
    InvalidConfig,
    InvalidMessage,
    LockHeld,
    PartqError,
    QueueFull,
    QueueNotFound,
)
from partq.ops.browse import load_config, log_partitions
from partq.ops.copy_out import PartitionReport, copy, plan
from partq.storage import Record

if TYPE_CHECKING:
    from partq.broker import Broker

DEAD_PREFIXES = ("dead_", "origin_")        # headers the dead-letter step adds, removed again
DEAD_NAMES = ("delivery_count",)
RUN_OPEN = "dead-requeue/run-opened"        # checkpoints of the dead message queue: a run
RUN_CLOSED = "dead-requeue/run-closed"      # number (high 32 bits) and its options' hash
ACKERS = 8                                  # acks of a batch in flight at once (shared commits)


def clean_headers(headers: dict | None) -> dict | None:
    """A dead message's headers as it had them before it died: without ``dead_*``,
    ``origin_*`` and ``delivery_count`` (None when nothing is left)."""
    if not headers:
        return None
    kept = {k: v for k, v in headers.items()
            if not (isinstance(k, str) and (k.startswith(DEAD_PREFIXES) or k in DEAD_NAMES))}
    return kept or None


@dataclass
class RequeueReport:
    """What ``requeue`` did. ``requeued``: published now; ``already_requeued``: published by an
    interrupted earlier run, acked now; the ``left_*`` counts stay in the dead message queue
    untouched. ``complete`` is False when ``stop()`` or ``limit`` ended it early: the same
    requeue run again continues."""
    queue: str
    to_queue: str | None
    keys: list[str]
    reasons: list[str]
    limit: int
    requeued: int = 0
    already_requeued: int = 0
    destinations: dict[str, int] = field(default_factory=dict)
    left_unmatched: int = 0
    left_no_origin: int = 0
    left_origin_missing: dict[str, int] = field(default_factory=dict)
    complete: bool = True
    partitions: list[PartitionReport] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The report as ``partq dead requeue --json`` prints it."""
        return {"queue": self.queue, "to_queue": self.to_queue, "keys": self.keys,
                "reasons": self.reasons, "limit": self.limit, "requeued": self.requeued,
                "already_requeued": self.already_requeued, "destinations": self.destinations,
                "left_unmatched": self.left_unmatched, "left_no_origin": self.left_no_origin,
                "left_origin_missing": self.left_origin_missing, "complete": self.complete,
                "partitions": [{"partition": p.partition, "from_seq": p.start, "to_seq": p.end,
                                "requeued": p.copied, "skipped_acked": p.skipped_acked,
                                "skipped_corrupt": p.skipped_corrupt} for p in self.partitions]}

    @classmethod
    def from_dict(cls, doc: dict) -> RequeueReport:
        """The report ``as_dict`` gave (``partq dead requeue --address`` reads it from
        ``partq serve``)."""
        parts = [PartitionReport(p["partition"], p["from_seq"], p["to_seq"], False, p["requeued"],
                                 p["skipped_acked"], list(p["skipped_corrupt"]))
                 for p in doc["partitions"]]
        fields = {k: v for k, v in doc.items() if k != "partitions"}
        return cls(**fields, partitions=parts)


def options_tag(to_queue: str | None, keys: list[str], reasons: list[str]) -> str:
    """What tells one requeue from another in checkpoint names: a hash of its destination rule
    and filters ("" for the plain requeue: every message to its origin queue)."""
    if to_queue is None and not keys and not reasons:
        return ""
    spec = json.dumps({"to": to_queue is not None, "keys": sorted(set(keys)),
                       "reasons": sorted(set(reasons))}, sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def describe_options(queue: str, to_queue: str | None, keys: list[str],
                     reasons: list[str]) -> str:
    """The ``partq dead requeue`` command line of a requeue (for messages)."""
    words = ["partq dead requeue", shlex.quote(queue)]
    words += [f"--to {shlex.quote(to_queue)}"] if to_queue else []
    words += [f"--key {shlex.quote(k)}" for k in keys] + [f"--reason {r}" for r in reasons]
    return " ".join(words)


class RequeueSink:
    """The destinations of a requeue, as a copy-out sink (``partq.ops.copy_targets``): ``write``
    publishes each batch's messages to their destinations with this requeue's checkpoint, and
    passes over what an interrupted earlier run published (counted in ``already``)."""

    def __init__(self, broker: Broker, source: QueueConfig, to_queue: str | None,
                 tag: str) -> None:
        self.broker, self.source, self.to_queue, self.tag = broker, source, to_queue, tag
        self.already = 0
        self.destinations: dict[str, int] = {}
        self.half_done = False      # a batch published somewhere and not acked yet

    def destination(self, record: Record) -> str | None:
        """Where ``record`` goes: ``to_queue``, else its ``origin_queue`` header (None: none)."""
        if self.to_queue is not None:
            return self.to_queue
        origin = (record.headers or {}).get("origin_queue")
        return origin if isinstance(origin, str) and origin != self.source.name else None

    def checkpoint_name(self, partition: int) -> str:
        """This requeue's checkpoint of ``partition`` of the dead message queue, kept in each
        destination (queue ids are never reused: a dead message queue made again starts
        afresh)."""
        return f"dead-requeue/{self.source.qid}/{partition}" + (f"/{self.tag}" if self.tag else "")

    def resume_after(self, partition: int) -> None:
        """Every run starts at the ack floor: what it passed over stays unacked there, and what
        it requeued is acked (``write`` knows what an interrupted run published)."""
        return None

    def write(self, partition: int, last_seq: int, items: list[tuple[int, Record]]) -> int:
        """Publish ``items`` to their destinations, each group with the checkpoint
        ``last_seq + 1``, except those a destination's checkpoint shows published already;
        returns how many were published now."""
        groups: dict[str, list[tuple[int, Record]]] = {}
        for seq, record in items:
            dest = self.destination(record)
            assert dest is not None             # keep() passed over the others
            groups.setdefault(dest, []).append((seq, record))
        name = self.checkpoint_name(partition)
        published = 0
        for dest, group in groups.items():
            done = self.broker.checkpoint(dest, name)
            fresh = [(s, r) for s, r in group if done is None or s >= done]
            self.already += len(group) - len(fresh)
            if not fresh:
                continue
            was, self.half_done = self.half_done, True  # until the batch is acked
            try:
                results = self.broker.publish_many(
                    dest, [(r.payload, r.key, clean_headers(r.headers)) for _, r in fresh],
                    checkpoint=(name, last_seq + 1))
            except (QueueFull, IngressDisabled, InvalidMessage):
                self.half_done = was    # refused before anything was written: nothing to ack
                raise
            if len(results) != len(fresh):
                raise CopyOutError(f"queue {dest!r} holds a checkpoint of this requeue beyond "
                                   f"seq {last_seq} of {self.source.name!r}: another requeue "
                                   f"ran meanwhile; run this one again")
            published += len(results)
            self.destinations[dest] = self.destinations.get(dest, 0) + len(results)
        return published


def check_requeue(queue: str, to_queue: str | None, keys: list[str], reasons: list[str],
                  limit: int, batch: int) -> None:
    """Raise ``InvalidConfig`` when a ``requeue`` request is inconsistent, before anything is
    opened."""
    unknown = sorted(set(reasons) - set(REASONS))
    if unknown:
        raise InvalidConfig(f"--reason must be one of {', '.join(REASONS)}, not {unknown[0]!r}")
    if to_queue == queue:
        raise InvalidConfig(f"--to must name another queue than the dead message queue "
                            f"{queue!r}")
    if limit < 0:
        raise InvalidConfig("--limit must be 0 (no limit) or more")
    if batch < 1:
        raise InvalidConfig("--batch must be at least 1")


def requeue(broker: Broker, queue: str, *, to_queue: str | None = None,
            keys: list[str] | None = None, reasons: list[str] | None = None, limit: int = 0,
            batch: int = 1000, ignore_interrupted: bool = False,
            progress: Callable[[int, int], None] | None = None,
            stop: Callable[[], bool] | None = None) -> RequeueReport:
    """Send the messages of dead message queue ``queue`` (those with one of ``keys``, and one
    of the dead ``reasons``, when given) to ``to_queue``, or each to its ``origin_queue``;
    ``batch`` messages per commit, at most ``limit`` (0: all). Messages without an origin
    queue, or whose origin queue does not exist, stay where they are (counted), as do those
    the filters pass over. Returns the ``RequeueReport``.

    Refused (``CopyOutError``) while another requeue of ``queue`` runs, and while a requeue
    with other options stopped in the middle of a batch, unless ``ignore_interrupted`` (that
    batch may then be requeued twice). ``progress(n, total)`` and ``stop()`` as
    ``copy_out``'s."""
    keys, reasons = list(keys or []), list(reasons or [])
    check_requeue(queue, to_queue, keys, reasons, limit, batch)
    with broker.store.read() as r:
        config = load_config(r, queue)
        parts = log_partitions(r, config)
    if not config.ingress_enabled:
        raise CopyOutError(f"dead message queue {queue!r} has ingress disabled; a requeue keeps "
                           f"the record of its runs there: enable it with `partq queue update "
                           f"{queue} --ingress on` first")
    if to_queue is not None:
        target = broker.queue_config(to_queue)          # QueueNotFound
        if not target.ingress_enabled:
            raise CopyOutError(f"queue {to_queue!r} has ingress disabled, so requeued messages "
                               f"would be lost; enable it with `partq queue update {to_queue} "
                               f"--ingress on`")
    tag = options_tag(to_queue, keys, reasons)
    report = RequeueReport(queue, to_queue, keys, reasons, limit)
    sink = RequeueSink(broker, config, to_queue, tag)
    with _locked(broker, config), _run(broker, config, tag, sink, ignore_interrupted,
                                       describe_options(queue, to_queue, keys, reasons)):
        report.partitions = plan(broker.store, config, parts, 0, None, sink)
        total = sum(max(rep.end - rep.start + 1, 0) for rep in report.partitions)
        if progress is not None:
            progress(0, total)
        with ThreadPoolExecutor(ACKERS) as pool:
            def remove_from(partition: int) -> Callable[[list[int]], None]:
                def remove(seqs: list[int]) -> None:
                    list(pool.map(lambda seq: broker.ack_message(queue, partition, seq), seqs))
                    sink.half_done = False
                return remove
            taken = 0
            keep = _keeper(broker, sink, keys, reasons, report)
            for rep in report.partitions:
                taken += copy(broker.store, config, [rep], sink, batch, True,
                              advance=(lambda n: progress(n, total)) if progress else _ignore,
                              stop=stop or (lambda: False), remove=remove_from(rep.partition),
                              keep=keep, limit=limit - taken if limit else 0)
                if limit and taken >= limit:
                    break
    report.requeued = sum(rep.copied for rep in report.partitions)
    report.already_requeued = sink.already
    report.destinations = sink.destinations
    report.complete = not (stop is not None and stop()) and not (limit and taken >= limit)
    return report


def _ignore(n: int) -> None:
    pass


def _keeper(broker: Broker, sink: RequeueSink, keys: list[str], reasons: list[str],
            report: RequeueReport) -> Callable[[int, Record], bool]:
    """``keep(seq, record)`` for ``copy``: the messages to requeue; the others are counted in
    ``report`` as left."""
    exists: dict[str, bool] = {}

    def keep(seq: int, record: Record) -> bool:
        if (keys and record.key not in keys) or (
                reasons and (record.headers or {}).get("dead_reason") not in reasons):
            report.left_unmatched += 1
            return False
        dest = sink.destination(record)
        if dest is None:
            report.left_no_origin += 1
            return False
        if dest not in exists:
            try:
                broker.queue_config(dest)
                exists[dest] = True
            except QueueNotFound:
                exists[dest] = False
        if not exists[dest]:
            report.left_origin_missing[dest] = report.left_origin_missing.get(dest, 0) + 1
            return False
        return True
    return keep


@contextlib.contextmanager
def _locked(broker: Broker, config: QueueConfig) -> Iterator[None]:
    """One requeue of a dead message queue at a time (``DIR/delivery-locks/requeue-<qid>.lock``,
    released by the kernel if this process dies)."""
    directory = os.path.join(broker.path, LOCK_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        lock = OwnerLock(os.path.join(directory, f"requeue-{config.qid}.lock"))
    except LockHeld as exc:
        raise CopyOutError(f"another requeue of {config.name!r} is running ({exc.holder}); wait "
                           f"for it to end") from None
    try:
        yield
    finally:
        lock.release()


def _tag_hash(tag: str) -> int:
    return int(tag[:8], 16) if tag else 0


def _runs_file(broker: Broker, config: QueueConfig) -> str:
    """The command lines of a dead message queue's requeues by their options' hash, kept only
    to name an interrupted one in a refusal."""
    return os.path.join(broker.path, LOCK_DIR, f"requeue-{config.qid}.json")


def _commands(broker: Broker, config: QueueConfig) -> dict:
    try:
        with open(_runs_file(broker, config)) as f:
            commands = json.load(f)
    except (OSError, ValueError):
        return {}
    return commands if isinstance(commands, dict) else {}


def _remember(broker: Broker, config: QueueConfig, tag_hash: int, command: str) -> None:
    commands = {**_commands(broker, config), f"{tag_hash:08x}": command}
    with contextlib.suppress(OSError):
        with open(_runs_file(broker, config), "w") as f:
            json.dump(commands, f)


@contextlib.contextmanager
def _run(broker: Broker, config: QueueConfig, tag: str, sink: RequeueSink,
         ignore_interrupted: bool, command: str) -> Iterator[None]:
    """Mark the run's start and end in the dead message queue; refuse to start while a run
    with other options stopped in the middle of a batch. The end is marked only when no batch
    is half done (published and not acked)."""
    queue, mine = config.name, _tag_hash(tag)
    opened = broker.checkpoint(queue, RUN_OPEN) or 0
    closed = broker.checkpoint(queue, RUN_CLOSED) or 0
    if opened > closed and opened & 0xFFFFFFFF != mine and not ignore_interrupted:
        raise CopyOutError(
            f"an earlier requeue of {queue!r} with other options stopped in the middle of a "
            f"batch; run it again first ({_earlier(broker, config, opened)}), so that nothing is "
            f"requeued twice, or pass --ignore-interrupted to go on anyway (the messages of "
            f"that batch may then be requeued twice)")
    run = (max(opened, closed) >> 32) + 1
    value = run << 32 | mine
    _remember(broker, config, mine, command)
    broker.publish_many(queue, [], checkpoint=(RUN_OPEN, value))
    try:
        yield
    except BaseException:
        if not sink.half_done:
            with contextlib.suppress(PartqError):   # the error that ended the run says more
                broker.publish_many(queue, [], checkpoint=(RUN_CLOSED, value))
        raise
    broker.publish_many(queue, [], checkpoint=(RUN_CLOSED, value))


def _earlier(broker: Broker, config: QueueConfig, opened: int) -> str:
    """The command line of the run that marked ``opened``, as far as it is known."""
    command = _commands(broker, config).get(f"{opened & 0xFFFFFFFF:08x}")
    return f"`{command}`" if isinstance(command, str) else "with the options it had"
