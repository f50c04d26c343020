"""The typed storage interface: ``Reader`` (a read snapshot; ``Writer``, in ``writer``, is one
group commit), and the layout of the databases both use.

Broker code sees these two classes only: queues, partition logs (append / records / ack /
truncate), ack state and an opaque per-queue state blob. It never sees an lmdb flag or a page.

Databases of the environment (all keys big-endian, see ``encoding``):

=========  =============================  ===========================================
db         key                            value
=========  =============================  ===========================================
meta       b"format", b"next_qid", ...    format stamp, counters, replication slots
meta       b"q/" || qid || name           a value kept for one queue, deleted with it
queues     queue name (utf-8)             msgpack config dict (includes ``qid``)
heads      (qid, partition)               u64: next sequence to assign (never reused)
acks       (qid, partition)               ``AckState``: floor, acked-above, delivered mark
log        (qid, partition, last seq)     chunk: the crc32c-framed records of one append
state      qid                            broker-owned blob (assignments, hints, statuses)
changes    lsn                            logical change, written while a standby is attached
staging    prefix || u64 index            rows staged for a later atomic publish (Spark)
=========  =============================  ===========================================

Every mutation goes through a ``Writer`` method (``partq.storage.writer``), which also records
the logical change for the replication change log (rule `replication`) when a standby slot exists. That is the
single choke point.
"""
from __future__ import annotations

import struct

from partq.storage.encoding import (
    AckState,
    chunk_length,
    chunk_span,
    decode_meta,
    log_key,
    pack_u64,
    partition_key,
    unpack_chunk,
    unpack_u64,
)
from partq.storage.errors import CorruptStore, InvalidConfig

DB_NAMES = ("meta", "queues", "heads", "acks", "log", "state", "changes", "staging")
MAX_QID = 0xFFFFFFFF                  # queue ids are u32 in every key
QID = struct.Struct(">I")
_QUEUE_META = b"q/"
# queue meta: messages dropped unacked with their partition (a scale-down, a change to exclusive):
# published = acked + backlog + removed, so the acked count follows from stored state
QUEUE_REMOVED = b"removed"
# queue meta: a message with a TTL was published to the queue (its expired messages are swept)
QUEUE_TTL_SEEN = b"ttl"


def mark_ttl_seen(w, qid: int) -> None:
    """In a publish's transaction: the queue holds messages with a TTL from now on."""
    if w.queue_meta(qid, QUEUE_TTL_SEEN) is None:
        w.put_queue_meta(qid, QUEUE_TTL_SEEN, b"1")


def queue_meta_key(qid: int, name: bytes) -> bytes:
    """``q/`` || queue id (u32) || name: the meta key of a value kept for one queue."""
    return _QUEUE_META + QID.pack(qid) + name


CHANGE_LOG_NOTE = 1 << 20             # a full store's error names a change log this large


def change_log_note(r: Reader) -> str:
    """For a ``StorageFull`` message: how much of the store the replication change log holds,
    when that is much (a standby's slot keeps it; draining messages does not free it)."""
    st = r.db_stat("changes")
    nbytes = (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]
    if nbytes < CHANGE_LOG_NOTE:
        return ""
    return (f"; {nbytes / (1 << 20):.1f} MiB of it is the change log kept for DR-standbys "
            f"(`partq dr slots` lists them, `partq dr drop-slot ID` frees what one keeps)")


def check_queue_name(name: object) -> str:
    """``name``, when it is a str; ``InvalidConfig`` for a queue named by anything else."""
    if type(name) is not str:
        raise InvalidConfig(f"queue must be a queue name (str), not {type(name).__name__}")
    return name


class Reader:
    """Read-only view of a consistent snapshot. Valid only inside ``Store.read()``."""

    __slots__ = ("_txn", "_dbs", "path")

    def __init__(self, store, txn) -> None:
        self._txn = txn
        self._dbs = store.dbs
        self.path = store.path

    def version(self) -> int:
        """The store's version this snapshot shows (``Store.version`` as of its commit)."""
        return self._txn.id()

    # queues ------------------------------------------------------------------
    def queue(self, name: str) -> dict | None:
        raw = self.queue_raw(name)
        return None if raw is None else decode_meta(raw, f"config of queue {name!r}")

    def queue_raw(self, name: str) -> bytes | None:
        """The stored config bytes (compare them to notice a change without decoding)."""
        return self._txn.get(check_queue_name(name).encode(), db=self._dbs["queues"])

    def queues(self) -> dict[str, dict]:
        return {k.decode(): decode_meta(v, f"config of queue {k.decode()!r}")
                for k, v in self._txn.cursor(db=self._dbs["queues"])}

    def state(self, qid: int) -> bytes | None:
        return self._txn.get(pack_u64(qid), db=self._dbs["state"])

    def meta(self, key: bytes) -> bytes | None:
        return self._txn.get(key, db=self._dbs["meta"])

    def meta_prefix(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """Every meta ``(key, value)`` whose key starts with ``prefix``."""
        cur = self._txn.cursor(db=self._dbs["meta"])
        out = []
        if cur.set_range(prefix):
            for key, value in cur:
                if not key.startswith(prefix):
                    break
                out.append((bytes(key), bytes(value)))
        return out

    def queue_meta(self, qid: int, name: bytes) -> bytes | None:
        """A value kept for one queue (checkpoints, counters, a procedure in progress): it goes
        with the queue when the queue is deleted, and a queue created later under the same name
        (a new queue id) never sees it."""
        return self._txn.get(queue_meta_key(qid, name), db=self._dbs["meta"])

    def db_stat(self, name: str) -> dict:
        """LMDB's page counts of one database (for ``Store.usage``)."""
        return self._txn.stat(self._dbs[name])

    # change log --------------------------------------------------------------
    def first_change_lsn(self) -> int | None:
        """The oldest LSN still in the change log, or None when it is empty."""
        cur = self._txn.cursor(db=self._dbs["changes"])
        return unpack_u64(cur.key()) if cur.first() else None

    def change(self, lsn: int) -> bytes | None:
        """The change-log entry of ``lsn`` (``decode_change`` reads it), if still kept."""
        return self._txn.get(pack_u64(lsn), db=self._dbs["changes"])

    def changes_after(self, lsn: int, max_entries: int, max_bytes: int) -> list[bytes]:
        """Change-log entries with LSN > ``lsn``, in order, at most ``max_entries`` of them and
        stopping once their sizes pass ``max_bytes`` (at least one entry is returned)."""
        cur = self._txn.cursor(db=self._dbs["changes"])
        out: list[bytes] = []
        size = 0
        if cur.set_range(pack_u64(lsn + 1)):
            for _, value in cur:
                out.append(value)
                size += len(value)
                if len(out) >= max_entries or size > max_bytes:
                    break
        return out

    # partitions --------------------------------------------------------------
    def head(self, qid: int, partition: int) -> int:
        raw = self._txn.get(partition_key(qid, partition), db=self._dbs["heads"])
        return 0 if raw is None else unpack_u64(raw)

    def partitions(self, qid: int) -> list[int]:
        """Every partition of queue id ``qid`` that exists (the parent log, ``PARENT``, last)."""
        prefix = QID.pack(qid)
        cur = self._txn.cursor(db=self._dbs["acks"])
        out: list[int] = []
        if cur.set_range(prefix):
            for k in cur.iternext(values=False):
                if not k.startswith(prefix):
                    break
                out.append(int.from_bytes(k[4:8], "big"))
        return out

    def has_partition(self, qid: int, partition: int) -> bool:
        """Whether the partition exists (was created and not dropped since)."""
        return self._txn.get(partition_key(qid, partition), db=self._dbs["acks"]) is not None

    def ack_state(self, qid: int, partition: int) -> AckState:
        raw = self._txn.get(partition_key(qid, partition), db=self._dbs["acks"])
        return AckState.decode(raw, f"queue id {qid} partition {partition}")

    def records(self, qid: int, partition: int, start: int, limit: int,
                cache: list | None = None) -> list[tuple[int, bytes]]:
        """Up to ``limit`` (seq, raw record) pairs with seq >= start, in order (records still
        stored: acked ones of a chunk not yet wholly acked included). A sequence the partition
        must hold and does not yields ``b""``, which ``decode_record`` reports as corrupt: the
        records of a damaged chunk, and those of a chunk whose key was damaged (it sorts
        elsewhere, or names a range its value does not hold). Every sequence from the ack
        floor up to the head is stored, so those gaps are known exactly, whatever a damaged
        key says.

        ``cache``: a caller's ``[key, first, records]`` list (``[None, 0, None]`` to start) that
        keeps the last chunk decoded, so that reading a chunk in several calls decodes it once.
        Chunks never change once written, and their keys are never reused."""
        out: list[tuple[int, bytes]] = []
        if limit <= 0:
            return out
        cur = self._txn.cursor(db=self._dbs["log"])
        prefix = partition_key(qid, partition)
        expected = start        # every sequence below it is accounted for
        found = cur.set_range(log_key(qid, partition, start))
        while found:
            k = cur.key()
            if k[:8] != prefix:
                break
            if cache is not None and cache[0] == k:
                first, recs = cache[1], cache[2]
            else:
                try:
                    first, recs = unpack_chunk(cur.value(), int.from_bytes(k[8:], "big"))
                except ValueError:      # its sequences are the gap before the next sound chunk
                    found = cur.next()
                    continue
                if cache is not None:
                    cache[:] = (k, first, recs)
            if first > expected and not self._missing(qid, partition, expected, first, limit,
                                                      out):
                return out
            lo = expected - first if expected > first else 0
            hi = min(len(recs), lo + limit - len(out))
            if lo < hi:
                out += zip(range(first + lo, first + hi), recs[lo:hi], strict=True)
                expected = first + hi
            if len(out) >= limit:
                return out
            found = cur.next()
        self._missing(qid, partition, expected, None, limit, out)
        return out

    def _missing(self, qid: int, partition: int, lo: int, hi: int | None, limit: int,
                 out: list[tuple[int, bytes]]) -> bool:
        """Add ``(seq, b"")`` to ``out`` for each sequence in [lo, hi) (``hi`` None: up to the
        head) that the partition must hold (from its ack floor up to its head: a dropped
        partition holds none) but whose chunk was not found; True while ``out`` has room. A
        damaged ack state claims nothing here (``ack_state`` reports it to whoever reads it)."""
        head = self.head(qid, partition)
        hi = head if hi is None else min(hi, head)
        if lo < hi:
            raw = self._txn.get(partition_key(qid, partition), db=self._dbs["acks"])
            try:
                floor = None if raw is None else AckState.decode(raw, "").floor
            except CorruptStore:
                floor = None
            if floor is not None:
                lo = max(lo, floor)
                out += ((seq, b"") for seq in range(lo, min(hi, lo + limit - len(out))))
        return len(out) < limit

    def staged(self, prefix: bytes) -> list[bytes]:
        """Every value staged under ``prefix``, in staging order."""
        cur = self._txn.cursor(db=self._dbs["staging"])
        out: list[bytes] = []
        if cur.set_range(prefix):
            for k, v in cur:
                if not k.startswith(prefix):
                    break
                out.append(v)
        return out

    def staged_value(self, key: bytes) -> bytes | None:
        """The value staged under exactly ``key`` (a chunk), or None."""
        return self._txn.get(key, db=self._dbs["staging"])

    def staged_prefixes(self, width: int) -> dict[bytes, int]:
        """Rows staged per distinct key prefix of ``width`` bytes (to find orphaned stages)."""
        counts: dict[bytes, int] = {}
        for k in self._txn.cursor(db=self._dbs["staging"]).iternext(values=False):
            counts[k[:width]] = counts.get(k[:width], 0) + 1
        return counts

    def heads(self, qid: int) -> dict[int, int]:
        """The head of every partition queue id ``qid`` ever had, dropped ones included (a head
        outlives its partition so that sequences are never reused): the sum is how many
        messages the queue ever took."""
        prefix = QID.pack(qid)
        cur = self._txn.cursor(db=self._dbs["heads"])
        out: dict[int, int] = {}
        if cur.set_range(prefix):
            for k, v in cur:
                if not k.startswith(prefix):
                    break
                out[int.from_bytes(k[4:8], "big")] = unpack_u64(v)
        return out

    def chunk_sizes(self, qid: int, partition: int, start: int) -> list[tuple[int, int]]:
        """(last seq, stored bytes) of every chunk of the partition's log holding a seq >=
        ``start``, in order (O(chunks): callers remember where they stopped)."""
        cur = self._txn.cursor(db=self._dbs["log"])
        out: list[tuple[int, int]] = []
        if cur.set_range(log_key(qid, partition, start)):
            prefix = partition_key(qid, partition)
            for k, v in cur:
                if k[:8] != prefix:
                    break
                out.append((int.from_bytes(k[8:], "big"), len(v)))
        return out

    def chunk_spans(self, start: bytes, end: bytes, limit: int
                    ) -> tuple[tuple[bytes, tuple[int, int] | None] | None,
                               list[tuple[bytes, tuple[int, int] | None]]]:
        """For checking the log's keys (``partq.storage.log_check``): the entry before key
        ``start`` (None at the start of the log), and up to ``limit`` entries from ``start`` on
        and before ``end``, each as (key, ``chunk_span`` of its value), in the order the
        database holds them."""
        cur = self._txn.cursor(db=self._dbs["log"])
        before = None
        if not start:
            found = cur.first()
        else:
            if cur.prev() if cur.set_range(start) else cur.last():
                before = (cur.key(), chunk_span(cur.value()))
            found = cur.set_range(start)
        out: list[tuple[bytes, tuple[int, int] | None]] = []
        while found and len(out) < limit:
            k = cur.key()
            if k >= end:
                break
            out.append((k, chunk_span(cur.value())))
            found = cur.next()
        return before, out

    def first_seq(self, qid: int, partition: int) -> int | None:
        found = self.records(qid, partition, 0, 1)
        return found[0][0] if found else None

    def stored_count(self, qid: int, partition: int) -> int:
        """Records physically present (O(chunks); for verify and tests, not hot paths)."""
        cur = self._txn.cursor(db=self._dbs["log"])
        n = 0
        if cur.set_range(log_key(qid, partition, 0)):
            prefix = partition_key(qid, partition)
            for k, v in cur:
                if k[:8] != prefix:
                    break
                n += chunk_length(v)
        return n
