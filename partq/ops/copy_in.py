"""Copy-in: load a copy-out export (JSON Lines or msgpack, ``partq.ops.copy_targets``) back into a queue,
idempotently: run again after any interruption, or on the same export continued by a later
``copy-out`` run, it publishes every record of the file exactly once.

How: every record of an export names its source (``queue``, ``queue_id``, ``partition``,
``seq``), and each source partition's records follow each other in increasing ``seq`` order.
Records are published in file order, in batches of one source partition, each batch through
``Broker.publish_many(dest, items, checkpoint=(name, last_seq + 1))``, which stores the position
in the destination queue in the same transaction as the messages. The checkpoint name is
``copy-in/<export>/<partition>``, where ``<export>`` identifies the export by its first record
(source queue, queue id, partition, seq and publish time, hashed): not by the file's name or
place, so a renamed or moved export, or the same export in the other format, is the same
export. A run skips each record below its partition's checkpoint. A file whose first record is
the first record of an export already copied in is taken as that export (or a continuation of
it): both hold copies of the same stored messages.

Checkpoints belong to the destination queue: deleting it deletes them, and a queue created
again under its name loads the export in full. The messages get new publish times (the
original one is in the file, not in the copy); key, headers and payload are as exported.

Refused: a file that is not an export (``CopyInError`` names the record), records of more than
one source queue in one file, and a partition's sequence going backwards. A torn last record
(a copy-out still running, or killed) is left out and reported (``torn_bytes``): run copy-in
again once the copy-out is complete. Nothing here handles signals: the caller passes ``stop()``,
checked between batches.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, cast

import msgpack

from partq.errors import CopyInError, InvalidConfig, describe_os_error
from partq.ops.copy_targets import FORMATS, JSONL_KEYS, MSGPACK_KEYS
from partq.ops.formatting import decode_json_bytes

if TYPE_CHECKING:
    from partq.broker import Broker

READ_BLOCK = 1 << 20            # bytes read at a time from a msgpack export
PROGRESS_BYTES = 1 << 20        # bytes between two progress calls while skipping
INPUT_FORMATS = ("auto", *FORMATS)
_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".msgpack": "msgpack",
             ".mpk": "msgpack", ".mp": "msgpack"}


@dataclass(frozen=True)
class ExportRecord:
    """One record of a copy-out export, decoded."""
    queue: str
    queue_id: int
    partition: int
    seq: int
    key: str | None
    publish_time_ns: int
    headers: dict | None
    payload: bytes
    end: int            # byte offset of the record's end in the file


@dataclass
class SourceReport:
    """What copy-in did with one source partition of the export."""
    partition: int
    first_seq: int | None = None        # first and last seq of the file's records
    last_seq: int | None = None
    published: int = 0
    skipped: int = 0                    # copied in already (an earlier run)

    def as_dict(self) -> dict:
        return {"partition": self.partition, "first_seq": self.first_seq,
                "last_seq": self.last_seq, "published": self.published, "skipped": self.skipped}


@dataclass
class CopyInReport:
    """What ``copy_in`` did. ``complete`` is False when ``stop()`` ended it between batches:
    everything reported was published, and the same copy-in run again continues."""
    queue: str
    from_file: str
    format: str
    export: str | None                  # the export's identity (None: an empty file)
    source_queue: str | None = None
    source_queue_id: int | None = None
    records: int = 0                    # complete records read
    published: int = 0
    skipped: int = 0
    torn_bytes: int = 0                 # a torn last record, left out
    complete: bool = True
    sources: list[SourceReport] = field(default_factory=list)

    def as_dict(self) -> dict:
        """The report as ``partq copy-in --json`` prints it."""
        return {"queue": self.queue, "from_file": self.from_file, "format": self.format,
                "export": self.export, "source_queue": self.source_queue,
                "source_queue_id": self.source_queue_id, "records": self.records,
                "published": self.published, "skipped_already_copied": self.skipped,
                "torn_bytes": self.torn_bytes, "complete": self.complete,
                "partitions": [s.as_dict() for s in self.sources]}


def detect_format(path: str, head: bytes) -> str:
    """"jsonl" or "msgpack": by the file name's suffix, else by its first byte."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    return "jsonl" if head.lstrip()[:1] == b"{" else "msgpack"


def export_identity(rec: ExportRecord) -> str:
    """The identity of the export that begins with ``rec`` (16 hex digits)."""
    text = json.dumps([rec.queue, rec.queue_id, rec.partition, rec.seq, rec.publish_time_ns])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def checkpoint_name(export: str, partition: int) -> str:
    """The checkpoint copy-in keeps in the destination queue for one source partition."""
    return f"copy-in/{export}/{partition}"


class _Torn(Exception):
    """The file ends inside a record (``bytes`` of it)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        super().__init__(nbytes)


def read_export(f: IO[bytes], fmt: str, where: str) -> Iterator[ExportRecord]:
    """The records of an export in ``fmt``, streamed (never loaded whole). Raises
    ``CopyInError`` for anything that is not an export record, and ``_Torn`` at a torn end."""
    if fmt == "jsonl":
        yield from _read_jsonl(f, where)
    else:
        yield from _read_msgpack(f, where)


def _read_jsonl(f: IO[bytes], where: str) -> Iterator[ExportRecord]:
    offset = 0
    for n, line in enumerate(f, 1):
        if not line.endswith(b"\n"):
            raise _Torn(len(line))     # copy-out ends every record with one: cut short
        offset += len(line)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise CopyInError(f"{where} line {n}: not JSON ({exc.__class__.__name__}); "
                              f"copy-in loads files `partq copy-out --to-file` wrote") from None
        yield _record(obj, JSONL_KEYS, f"{where} line {n}", offset)


def _read_msgpack(f: IO[bytes], where: str) -> Iterator[ExportRecord]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    n = fed = 0
    while block := f.read(READ_BLOCK):
        unpacker.feed(block)
        fed += len(block)
        while True:
            try:
                obj = unpacker.unpack()
            except msgpack.OutOfData:
                break
            except Exception as exc:
                raise CopyInError(f"{where} record {n + 1}: not msgpack "
                                  f"({exc.__class__.__name__}); copy-in loads files `partq "
                                  f"copy-out --to-file` wrote") from None
            n += 1
            yield _record(obj, MSGPACK_KEYS, f"{where} record {n}", unpacker.tell())
    if fed > unpacker.tell():
        raise _Torn(fed - unpacker.tell())


def _record(obj, keys: tuple[str, ...], where: str, end: int) -> ExportRecord:
    if not isinstance(obj, dict) or set(obj) != set(keys):
        raise CopyInError(f"{where}: not a copy-out record (expected an object with keys "
                          f"{', '.join(keys)}); to publish other JSON Lines use `partq publish "
                          f"--format jsonl`")
    queue, qid, p, seq = obj["queue"], obj["queue_id"], obj["partition"], obj["seq"]
    if not isinstance(queue, str) or not all(_is_count(v) for v in (qid, p, seq)):
        raise CopyInError(f"{where}: queue must be a name and queue_id, partition and seq "
                          f"integers >= 0")
    key, when, headers = obj["key"], obj["publish_time_ns"], obj["headers"]
    if key is not None and not isinstance(key, str):
        raise CopyInError(f"{where}: key must be a string or null")
    if not _is_count(when):
        raise CopyInError(f"{where}: publish_time_ns must be an integer >= 0")
    if headers is not None and not isinstance(headers, dict):
        raise CopyInError(f"{where}: headers must be an object or null")
    if "payload_b64" in obj:
        try:
            payload = base64.b64decode(obj["payload_b64"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise CopyInError(f"{where}: payload_b64 is not base64") from None
        headers = decode_json_bytes(headers)
    else:
        payload = obj["payload"]
        if not isinstance(payload, bytes):
            raise CopyInError(f"{where}: payload must be bytes")
    return ExportRecord(queue, qid, p, seq, key, when, headers, payload, end)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def copy_in(broker: Broker, queue: str, path: str, *, fmt: str = "auto", batch: int = 1000,
            progress: Callable[[int, int], None] | None = None,
            stop: Callable[[], bool] | None = None) -> CopyInReport:
    """Publish the records of the export ``path`` ("-": standard input) into ``queue``,
    ``batch`` per commit, skipping what an earlier run of the same export copied in (see the
    module's docstring). ``fmt``: "auto" (by suffix, else by the first byte), "jsonl" or
    "msgpack". ``progress(n, total)`` is called with 0 and the file's size, then with the bytes
    each batch covered (not for standard input); ``stop()`` is checked between batches.
    Returns the ``CopyInReport``."""
    if fmt not in INPUT_FORMATS:
        raise InvalidConfig(f"--format must be one of {', '.join(INPUT_FORMATS)}, not {fmt!r}")
    if type(batch) is not int or batch < 1:
        raise InvalidConfig("--batch must be at least 1")
    config = broker.queue_config(queue)                    # QueueNotFound
    if not config.ingress_enabled:
        raise CopyInError(f"queue {queue!r} has ingress disabled, so copied messages would be "
                          f"lost; enable it with `partq queue update {queue} --ingress on`")
    stream = path == "-"
    where = "standard input" if stream else path
    try:
        f: IO[bytes] = sys.stdin.buffer if stream else open(path, "rb")
    except OSError as exc:
        raise CopyInError(describe_os_error(exc, "cannot read")) from None
    try:
        # a BytesIO (a test's standard input) has no peek: read it through a buffer
        buffered = f if isinstance(f, io.BufferedReader) else io.BufferedReader(cast(Any, f))
        head = buffered.peek(64)[:64]
        if fmt == "auto":
            fmt = detect_format("" if stream else path, head)
        total = 0 if stream else os.fstat(f.fileno()).st_size
        report = CopyInReport(queue, "-" if stream else os.path.abspath(path), fmt, None)
        _Copier(broker, queue, report, batch, progress, total).run(
            read_export(buffered, fmt, where), where, stop or (lambda: False))
    except OSError as exc:
        raise CopyInError(describe_os_error(exc, "cannot read")) from None
    finally:
        if not stream:
            f.close()
    return report


class _Copier:
    """The loop of ``copy_in``: batches of one source partition, each with its checkpoint."""

    def __init__(self, broker: Broker, queue: str, report: CopyInReport, batch: int,
                 progress: Callable[[int, int], None] | None, total: int) -> None:
        self.broker, self.queue, self.report, self.batch = broker, queue, report, batch
        self.progress, self.total = progress, total
        self.sources: dict[int, SourceReport] = {}
        self.next_seq: dict[int, int] = {}       # partition -> first seq not yet copied in
        self.last_in_file: dict[int, int] = {}
        self.pending: list[ExportRecord] = []
        self.done_bytes = 0

    def run(self, records: Iterator[ExportRecord], where: str, stop: Callable[[], bool]) -> None:
        report = self.report
        if self.progress is not None and self.total:
            self.progress(0, self.total)
        try:
            for rec in records:
                report.records += 1
                if report.export is None:
                    report.export = export_identity(rec)
                    report.source_queue, report.source_queue_id = rec.queue, rec.queue_id
                elif (rec.queue, rec.queue_id) != (report.source_queue, report.source_queue_id):
                    raise CopyInError(
                        f"{where} record {report.records} is of queue {rec.queue!r} (id "
                        f"{rec.queue_id}), the file began with queue {report.source_queue!r} (id "
                        f"{report.source_queue_id}): copy-in loads one copy-out export at a time")
                self._take(rec, where)
                if len(self.pending) >= self.batch:
                    self._flush()
                    if stop():
                        report.complete = False
                        return
        except _Torn as torn:
            report.torn_bytes = torn.nbytes
        self._flush()

    def _take(self, rec: ExportRecord, where: str) -> None:
        p = rec.partition
        src = self.sources.get(p)
        if src is None:
            src = self.sources[p] = SourceReport(p)
            self.report.sources.append(src)
        before = self.last_in_file.get(p)
        if before is not None and rec.seq <= before:
            raise CopyInError(f"{where} record {self.report.records}: partition {p} seq {rec.seq} "
                              f"follows seq {before}; a copy-out export holds each partition's "
                              f"records in increasing order")
        self.last_in_file[p] = rec.seq
        if src.first_seq is None:
            src.first_seq = rec.seq
        src.last_seq = rec.seq
        if p not in self.next_seq:
            stored = self.broker.checkpoint(self.queue, checkpoint_name(self.report.export or "", p))
            self.next_seq[p] = stored or 0
        if rec.seq < self.next_seq[p]:
            src.skipped += 1
            self.report.skipped += 1
            self._advance(rec.end)
            return
        if self.pending and self.pending[-1].partition != p:
            self._flush()
        self.pending.append(rec)

    def _flush(self) -> None:
        if not self.pending:
            return
        items, self.pending = self.pending, []
        p, last = items[0].partition, items[-1].seq
        results = self.broker.publish_many(
            self.queue, [(r.payload, r.key, r.headers) for r in items],
            checkpoint=(checkpoint_name(self.report.export or "", p), last + 1))
        src = self.sources[p]
        if results:
            src.published += len(results)
            self.report.published += len(results)
        else:                     # another copy-in of this export committed it meanwhile
            src.skipped += len(items)
            self.report.skipped += len(items)
        self.next_seq[p] = last + 1
        self._advance(items[-1].end, force=True)

    def _advance(self, end: int, force: bool = False) -> None:
        """Tell ``progress`` the bytes done up to ``end`` (at most once a MiB, or at a batch)."""
        if self.progress is not None and self.total and end > self.done_bytes and (
                force or end - self.done_bytes >= PROGRESS_BYTES):
            self.progress(end - self.done_bytes, self.total)
            self.done_bytes = end

