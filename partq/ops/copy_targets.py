"""The destinations of a copy-out (``partq.ops.copy_out``): another queue of the same store, or a
JSON Lines / msgpack file. Each makes a re-run of an interrupted copy exact:

* queue: every batch goes through ``Broker.publish_many(dest, items, checkpoint=(name, pos))``,
  which stores ``pos`` (the last source sequence the batch covers, plus one) in the same
  transaction as the messages. A re-run starts each partition at its checkpoint. The checkpoint
  name is derived from source queue, partition and destination (and the explicit --from-seq /
  --to-seq range, so copying another range is another copy).
* file: every record carries its partition and seq; each batch is flushed and fsynced. A re-run
  reads the file, keeps every complete record, cuts a torn last record (a line without its
  newline, a partial msgpack object), and starts each partition after its highest seq in the
  file. A file that is not a copy-out file of that queue is refused, never cut.

A sink answers ``resume_after(partition)`` (the last sequence an earlier run covered),
``copied_before(partition, first)``, ``write(partition, last_seq, items)`` (returns how many it
wrote), ``describe()`` (the destination, for the report) and ``close()``.
"""
from __future__ import annotations

import base64
import errno
import fcntl
import json
import os
import stat
import sys

import msgpack

from partq.config import QueueConfig
from partq.errors import CopyOutError, describe_os_error
from partq.ops.formatting import jsonable, partition_label
from partq.storage import Record
from partq.storage.encoding import PARENT

FORMATS = ("jsonl", "msgpack")
JSONL_KEYS = ("queue", "queue_id", "partition", "seq", "key", "publish_time_ns", "headers",
              "payload_b64")
MSGPACK_KEYS = ("queue", "queue_id", "partition", "seq", "key", "publish_time_ns", "headers",
                "payload")
SCAN_BLOCK = 1 << 20     # bytes read at a time when continuing a msgpack file


def checkpoint_name(source_qid: int, partition: int, range_tag: str = "") -> str:
    """The checkpoint a copy of ``partition`` of the queue with id ``source_qid`` keeps in its
    destination queue: the last source sequence copied, plus one. Queue ids are never reused,
    so a queue deleted and created again (source or destination) starts a copy afresh, and the
    destination's checkpoints go when it is deleted."""
    return f"copy-out/{source_qid}/{partition}{range_tag}"


class QueueSink:
    """Copies into another queue of the same store, idempotently per batch."""

    def __init__(self, broker, source: QueueConfig, dest: str, range_tag: str) -> None:
        self.broker, self.source, self.dest, self.range_tag = broker, source.name, dest, range_tag
        self.source_qid = source.qid
        config = broker.queue_config(dest)  # QueueNotFound if missing
        if not config.ingress_enabled:
            raise CopyOutError(f"destination queue {dest!r} has ingress disabled, so copied "
                               f"messages would be lost; enable it with `partq queue update "
                               f"{dest} --ingress on`")

    def describe(self) -> dict:
        """The destination, as the copy-out report names it: ``{"to_queue": DEST}``."""
        return {"to_queue": self.dest}

    def checkpoint_name(self, partition: int) -> str:
        """The name of this copy's checkpoint of ``partition`` in the destination queue."""
        return checkpoint_name(self.source_qid, partition, self.range_tag)

    def resume_after(self, partition: int) -> int | None:
        """The last source sequence an earlier run covered, or None."""
        position = self.broker.checkpoint(self.dest, self.checkpoint_name(partition))
        return None if position is None else position - 1

    def copied_before(self, partition: int, first: int) -> range:
        """Sequences >= ``first`` an earlier run of this copy covered: each commit holds a batch
        with its checkpoint, so every one of them that was unacked and sound then was copied
        (``proven_copied`` keeps exactly those)."""
        done = self.resume_after(partition)
        return range(first, first if done is None else done + 1)

    def write(self, partition: int, last_seq: int, items: list[tuple[int, Record]]) -> int:
        """Publish ``items`` with the checkpoint ``last_seq + 1``, in one commit; returns how
        many were published."""
        results = self.broker.publish_many(
            self.dest, [(rec.payload, rec.key, rec.headers) for _, rec in items],
            checkpoint=(self.checkpoint_name(partition), last_seq + 1))
        lost = sum(1 for res in results if res.discarded)
        if lost:
            first = items[0][0]
            raise CopyOutError(
                f"destination queue {self.dest!r} discarded {lost} copied messages (its ingress was "
                f"disabled meanwhile): partition {partition_label(partition)} seqs {first} to "
                f"{last_seq} of {self.source!r}; enable its ingress and copy them again with "
                f"{_select(partition)} --from-seq {first} --to-seq {last_seq}")
        return len(results)

    def close(self) -> None:
        """Nothing to release: the broker belongs to the caller."""


class FileSink:
    """Copies into a JSON Lines or msgpack file that a re-run continues.

    An existing regular file is read as a stream (never loaded whole) and continued when every
    record in it is a copy of this very queue (same name and queue id); anything else is refused
    unless ``overwrite``. ``path`` "-" is standard output, and a path that is not a regular file
    (``/dev/full``, a pipe) is written as a stream: neither can be continued. A symbolic link is
    refused: the file written is the one named."""

    def __init__(self, path: str, fmt: str, config: QueueConfig, overwrite: bool = False) -> None:
        self.path, self.fmt, self.queue, self.qid = path, fmt, config.name, config.qid
        self.last: dict[int, int] = {}        # partition -> highest seq in the file
        self.parent_seqs: list[int] = []      # parent-queue seqs in the file (for --move)
        self.records_found = 0
        self.cut_bytes = 0
        self.overwritten = False
        self._stream = path == "-"
        try:
            self._file = sys.stdout.buffer if self._stream else self._open(overwrite)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CopyOutError(f"{path} is a symbolic link; copy-out writes only the file it "
                                   f"is given: pass the path the link points to") from None
            raise CopyOutError(describe_os_error(exc, "cannot write")) from None

    def describe(self) -> dict:
        """The destination, as the copy-out report names it: the file (absolute, or "-"), its
        format, and what continuing it found (records already there, torn bytes cut)."""
        where = "-" if self._stream else os.path.abspath(self.path)
        return {"to_file": where, "format": self.fmt, "overwritten": self.overwritten,
                "records_already_in_file": self.records_found, "torn_bytes_cut": self.cut_bytes}

    def _open(self, overwrite: bool):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        f = os.fdopen(fd, "r+b")
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                self._stream = not stat.S_ISDIR(mode)
                return f                  # a device or a pipe: write only, nothing to continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CopyOutError(f"another copy-out is writing {self.path}; wait for it to "
                                   f"end, or pass another --to-file path") from None
            size = os.fstat(fd).st_size
            if size and overwrite:
                f.truncate(0)
                self.overwritten = True
            elif size:
                keep = self._scan(f)
                if keep < size:
                    f.truncate(keep)
                    self.cut_bytes = size - keep
                f.seek(keep)
            f.flush()
            os.fsync(fd)
            _fsync_dir(self.path)
        except BaseException:
            f.close()
            raise
        return f

    def _refuse(self, where: str, why: str) -> CopyOutError:
        return CopyOutError(f"{self.path} is not a {self.fmt} copy-out file of queue "
                            f"{self.queue!r} ({where}: {why}); pass a new --to-file path, "
                            f"--overwrite to replace it, or the file an earlier `partq copy-out "
                            f"{self.queue} --format {self.fmt}` wrote")

    def _check(self, rec, where: str) -> None:
        keys = JSONL_KEYS if self.fmt == "jsonl" else MSGPACK_KEYS
        if not isinstance(rec, dict) or set(rec) != set(keys):
            raise self._refuse(where, f"expected an object with keys {', '.join(keys)}")
        if rec["queue"] != self.queue:
            raise self._refuse(where, f"it holds messages of queue {rec['queue']!r}")
        if rec["queue_id"] != self.qid:
            raise self._refuse(where, f"it holds messages of an earlier queue named "
                                      f"{self.queue!r} (queue id {rec['queue_id']!r}; this one is "
                                      f"{self.qid}), deleted since")
        p, seq = rec["partition"], rec["seq"]
        if not (isinstance(p, int) and not isinstance(p, bool) and p >= 0
                and isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0):
            raise self._refuse(where, "partition and seq must be integers >= 0")
        if seq > self.last.get(p, -1):
            self.last[p] = seq
        if p == PARENT:
            self.parent_seqs.append(seq)
        self.records_found += 1

    def _scan(self, f) -> int:
        """Check every complete record, reading the file as a stream; return the length to keep
        (a torn tail is cut)."""
        f.seek(0)
        return self._scan_jsonl(f) if self.fmt == "jsonl" else self._scan_msgpack(f)

    def _scan_jsonl(self, f) -> int:
        keep = 0
        n = 0
        for line in f:
            if not line.endswith(b"\n"):
                self._check_torn(line, self._record_start())
                break
            n += 1
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise self._refuse(f"line {n}", f"not JSON ({exc.__class__.__name__})") from None
            self._check(rec, f"line {n}")
            keep += len(line)
        return keep

    def _scan_msgpack(self, f) -> int:
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        keep = n = 0
        while block := f.read(SCAN_BLOCK):
            unpacker.feed(block)
            try:
                for rec in unpacker:
                    n += 1
                    self._check(rec, f"record {n}")
                    keep = unpacker.tell()
            except CopyOutError:
                raise
            except Exception as exc:
                raise self._refuse(f"record {n + 1}",
                                   f"not msgpack ({exc.__class__.__name__})") from None
        f.seek(keep)
        self._check_torn(f.read(64), self._record_start())
        return keep

    def _record_start(self) -> bytes:
        """How every record of this queue begins in the file's format."""
        if self.fmt == "jsonl":
            return json.dumps({"queue": self.queue}).encode()[:-1] + b","
        return (bytes([0x80 | len(MSGPACK_KEYS)])
                + msgpack.packb({"queue": self.queue}, use_bin_type=True)[1:])

    def _check_torn(self, tail: bytes, expected_start: bytes) -> None:
        """A torn tail is cut only from a file that is evidently ours: one with complete records,
        or one whose bytes start like a record of this queue."""
        if not tail or self.records_found:
            return
        n = min(len(tail), len(expected_start))
        if tail[:n] != expected_start[:n]:
            raise self._refuse("start of file", "no complete record")

    def resume_after(self, partition: int) -> int | None:
        """The highest sequence of ``partition`` already in the file, or None."""
        return self.last.get(partition)

    def copied_before(self, partition: int, first: int) -> list[int]:
        """Sequences >= ``first`` of ``partition`` (the parent log) already in the file."""
        assert partition == PARENT
        return [s for s in self.parent_seqs if s >= first]

    def write(self, partition: int, last_seq: int, items: list[tuple[int, Record]]) -> int:
        """Append ``items`` to the file, flushed and fsynced (a stream: flushed); returns how
        many were written."""
        if not items:
            return 0
        head = {"queue": self.queue, "queue_id": self.qid, "partition": partition}
        if self.fmt == "jsonl":
            chunks = [json.dumps({**head, "seq": seq, "key": rec.key,
                                  "publish_time_ns": rec.publish_time_ns, "headers": rec.headers,
                                  "payload_b64": base64.b64encode(rec.payload).decode("ascii")},
                                 default=jsonable).encode() + b"\n" for seq, rec in items]
        else:
            chunks = [msgpack.packb({**head, "seq": seq, "key": rec.key,
                                     "publish_time_ns": rec.publish_time_ns,
                                     "headers": rec.headers, "payload": rec.payload},
                                    use_bin_type=True) for seq, rec in items]
        try:
            self._file.write(b"".join(chunks))
            self._file.flush()
            if not self._stream:
                os.fsync(self._file.fileno())
        except OSError as exc:
            if self._stream and exc.errno == errno.EPIPE:
                raise                         # the reader of stdout stopped (| head): an end
            if exc.filename is None and self.path != "-":
                exc.filename = self.path      # a write or fsync names no file: name it
            raise CopyOutError(describe_os_error(exc, "cannot write")) from None
        self.last[partition] = items[-1][0]
        return len(items)

    def close(self) -> None:
        """Close the file (never standard output)."""
        if self._file is not sys.stdout.buffer:
            try:
                self._file.close()
            except OSError:
                pass     # a failed write already said why


def _select(partition: int) -> str:
    """The copy-out option that picks ``partition`` again."""
    return "--parent" if partition == PARENT else f"--partition {partition}"


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
