"""The typed storage interface: ``Reader`` (a read snapshot) and ``Writer`` (one group commit).

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

Every mutation goes through a ``Writer`` method, which also records the logical change for the
replication change log (S27) when a standby slot exists. That is the single choke point.
"""
from __future__ import annotations

import struct
import time
from collections.abc import Iterable

import msgpack

from partq.storage import crashpoints
from partq.storage.encoding import (
    AckState,
    chunk_length,
    chunks,
    decode_meta,
    encode_meta,
    log_key,
    pack_u64,
    partition_key,
    unpack_chunk,
    unpack_u64,
)
from partq.storage.errors import Diverged, StorageFull

DB_NAMES = ("meta", "queues", "heads", "acks", "log", "state", "changes", "staging")
_U32_MAX = 0xFFFFFFFF
_QID = struct.Struct(">I")
_QUEUE_META = b"q/"
# queue meta: messages dropped unacked with their partition (a scale-down, a change to exclusive):
# published = acked + backlog + removed, so the acked count follows from stored state
QUEUE_REMOVED = b"removed"


def queue_meta_key(qid: int, name: bytes) -> bytes:
    """``q/`` || queue id (u32) || name: the meta key of a value kept for one queue."""
    return _QUEUE_META + _QID.pack(qid) + name


class Reader:
    """Read-only view of a consistent snapshot. Valid only inside ``Store.read()``."""

    __slots__ = ("_txn", "_dbs", "path")

    def __init__(self, store, txn) -> None:
        self._txn = txn
        self._dbs = store.dbs
        self.path = store.path

    # queues ------------------------------------------------------------------
    def queue(self, name: str) -> dict | None:
        raw = self.queue_raw(name)
        return None if raw is None else decode_meta(raw, f"config of queue {name!r}")

    def queue_raw(self, name: str) -> bytes | None:
        """The stored config bytes (compare them to notice a change without decoding)."""
        return self._txn.get(name.encode(), db=self._dbs["queues"])

    def queues(self) -> dict[str, dict]:
        return {k.decode(): decode_meta(v, f"config of queue {k.decode()!r}")
                for k, v in self._txn.cursor(db=self._dbs["queues"])}

    def state(self, qid: int) -> bytes | None:
        return self._txn.get(pack_u64(qid), db=self._dbs["state"])

    def meta(self, key: bytes) -> bytes | None:
        return self._txn.get(key, db=self._dbs["meta"])

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
        prefix = _QID.pack(qid)
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
        stored: acked ones of a chunk not yet wholly acked included). A damaged chunk yields
        ``b""`` for each of its sequences, which ``decode_record`` reports as corrupt.

        ``cache``: a caller's ``[key, first, records]`` list (``[None, 0, None]`` to start) that
        keeps the last chunk decoded, so that reading a chunk in several calls decodes it once.
        Chunks never change once written, and their keys are never reused."""
        out: list[tuple[int, bytes]] = []
        if limit <= 0:
            return out
        cur = self._txn.cursor(db=self._dbs["log"])
        if not cur.set_range(log_key(qid, partition, start)):
            return out
        prefix = partition_key(qid, partition)
        while True:
            k = cur.key()
            if k[:8] != prefix:
                break
            if cache is not None and cache[0] == k:
                first, recs = cache[1], cache[2]
            else:
                last = int.from_bytes(k[8:], "big")
                try:
                    first, recs = unpack_chunk(cur.value(), last)
                except ValueError:
                    first = (out[-1][0] + 1 if out
                             else self._after_previous_chunk(qid, partition, start, k))
                    recs = [b""] * (last - first + 1)
                else:
                    if cache is not None:
                        cache[:] = (k, first, recs)
            lo = start - first if start > first else 0
            hi = min(len(recs), lo + limit - len(out))
            out += zip(range(first + lo, first + hi), recs[lo:hi], strict=True)
            if len(out) >= limit or not cur.next():
                break
        return out

    def _after_previous_chunk(self, qid: int, partition: int, start: int, key: bytes) -> int:
        """Where a damaged chunk at ``key`` begins, as far as anyone needs to know: after the
        chunk before it, or, for the first chunk left, at the ack floor (what lies below it is
        acked, and the chunks that held it are gone), and never before ``start``."""
        cur = self._txn.cursor(db=self._dbs["log"])
        if cur.set_key(key) and cur.prev() and cur.key()[:8] == partition_key(qid, partition):
            return max(start, int.from_bytes(cur.key()[8:], "big") + 1)
        return max(start, self.ack_state(qid, partition).floor)

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
        prefix = _QID.pack(qid)
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


class Writer(Reader):
    """The view one group commit gives each queued operation. Reads see earlier writes of the
    same commit. Operations must validate before they write: an exception from an operation
    aborts the whole commit, which is then retried one operation at a time."""

    __slots__ = ("changes", "appended", "_replicating", "_store")

    def __init__(self, store, txn, replicating: bool) -> None:
        super().__init__(store, txn)
        self._store = store
        self._replicating = replicating
        self.changes: list[tuple] = []
        self.appended = 0

    def _change(self, *change) -> None:
        if self._replicating:
            self.changes.append(change)

    def finish(self, changes_db) -> int:
        """End of the commit: when a standby slot exists, count appended messages in
        ``msgs_total`` (the basis of lag in messages; only differences of it are used) and write
        this commit's changes as one change-log entry under the next LSN. Returns that LSN, or 0
        when nothing went to the change log. Without a standby this writes nothing: every page
        a commit dirties costs fsync time."""
        if not self.changes:
            return 0
        meta = self._dbs["meta"]
        if self.appended:
            raw = self._txn.get(b"msgs_total", db=meta)
            total = (0 if raw is None else unpack_u64(raw)) + self.appended
            self._txn.put(b"msgs_total", pack_u64(total), db=meta)
        raw = self._txn.get(b"msgs_total", db=meta)
        total = 0 if raw is None else unpack_u64(raw)
        raw = self._txn.get(b"lsn", db=meta)
        lsn = (0 if raw is None else unpack_u64(raw)) + 1
        self._txn.put(pack_u64(lsn), encode_change(lsn, time.time_ns(), total, self.changes),
                      db=changes_db)
        self._txn.put(b"lsn", pack_u64(lsn), db=meta)
        return lsn

    # queues ------------------------------------------------------------------
    def allocate_qid(self) -> int:
        meta = self._dbs["meta"]
        raw = self._txn.get(b"next_qid", db=meta)
        qid = 1 if raw is None else unpack_u64(raw)
        if qid > _U32_MAX:
            raise OverflowError("queue ids exhausted")
        self.put_meta(b"next_qid", pack_u64(qid + 1))
        return qid

    def put_queue(self, name: str, config: dict) -> None:
        self._txn.put(name.encode(), encode_meta(config), db=self._dbs["queues"])
        self._change("put_queue", name, config)

    def delete_queue(self, name: str, qid: int) -> None:
        """Delete queue ``name`` (id ``qid``) and everything stored under its id: every log,
        head and ack state (partitions of any number, the parent log included), its state blob
        and its queue meta values."""
        for db in ("log", "acks", "heads"):
            self._delete_prefix(self._dbs[db], _QID.pack(qid))
        self._delete_prefix(self._dbs["meta"], queue_meta_key(qid, b""))
        self._txn.delete(pack_u64(qid), db=self._dbs["state"])
        self._txn.delete(name.encode(), db=self._dbs["queues"])
        self._change("delete_queue", name, qid)

    def _delete_prefix(self, db, prefix: bytes) -> int:
        cur = self._txn.cursor(db=db)
        n = 0
        if cur.set_range(prefix):
            while cur.key().startswith(prefix):
                if not cur.delete():
                    break
                n += 1
        return n

    def put_queue_meta(self, qid: int, name: bytes, value: bytes | None) -> None:
        """Set (or, with None, delete) a value kept for one queue (see ``Reader.queue_meta``)."""
        key = queue_meta_key(qid, name)
        if value is None:
            self._txn.delete(key, db=self._dbs["meta"])
        else:
            self._txn.put(key, value, db=self._dbs["meta"])
        self._change("queue_meta", qid, name, value)

    def put_state(self, qid: int, blob: bytes) -> None:
        self._txn.put(pack_u64(qid), blob, db=self._dbs["state"])
        self._change("put_state", qid, blob)

    def load_snapshot(self, src_txn, src_dbs: dict, keep_meta: dict[bytes, bytes | None]) -> None:
        """Make this store a copy of a snapshot (a DR-standby bootstrapping), in this one
        transaction: every database is emptied and refilled from ``src_txn``; then the local meta
        keys in ``keep_meta`` are set (or deleted where the value is None). A crash before the
        commit leaves the store as it was."""
        for name, db in self._dbs.items():
            self._txn.drop(db, delete=False)
            src = src_dbs.get(name)
            if src is not None and name not in ("changes", "staging"):
                self._txn.cursor(db=db).putmulti(src_txn.cursor(db=src).iternext(), append=True)
        meta = self._dbs["meta"]
        for key, value in keep_meta.items():
            if value is None:
                self._txn.delete(key, db=meta)
            else:
                self._txn.put(key, value, db=meta)

    def stage(self, prefix: bytes, start: int, rows: list[bytes]) -> None:
        """Stage rows under ``prefix`` with indexes start, start+1, ... (not replicated: staged
        rows become messages, and replicated, only when published)."""
        cur = self._txn.cursor(db=self._dbs["staging"])
        cur.putmulti([(prefix + pack_u64(start + i), row) for i, row in enumerate(rows)])

    def drop_staged(self, prefix: bytes) -> int:
        """Delete every row staged under ``prefix``; return how many."""
        cur = self._txn.cursor(db=self._dbs["staging"])
        n = 0
        if cur.set_range(prefix):
            while cur.key() and cur.key().startswith(prefix):
                cur.delete()
                n += 1
        return n

    def put_meta(self, key: bytes, value: bytes) -> None:
        self._txn.put(key, value, db=self._dbs["meta"])
        self._change("meta", key, value)

    def put_local_meta(self, key: bytes, value: bytes) -> None:
        """A meta key that is not replicated (replication bookkeeping itself)."""
        self._txn.put(key, value, db=self._dbs["meta"])

    def delete_local_meta(self, key: bytes) -> None:
        self._txn.delete(key, db=self._dbs["meta"])

    # partitions --------------------------------------------------------------
    def append(self, qid: int, partition: int, records: list[bytes]) -> int:
        """Append records to one partition's log; return the first sequence assigned (the head,
        unchanged, for no records: an empty chunk would take the previous chunk's key)."""
        if not records:
            return self.head(qid, partition)
        if not self._store.appends_allowed(self._txn):
            raise StorageFull(f"{self.path} is at max_map_size={self._store.max_map_size} bytes with "
                              f"its reserve for acks reached; ack and drain messages, or open the "
                              f"broker with a larger max_map_size")
        heads = self._dbs["heads"]
        hkey = partition_key(qid, partition)
        raw = self._txn.get(hkey, db=heads)
        first = 0 if raw is None else unpack_u64(raw)
        n = len(records)
        log, put = self._dbs["log"], self._txn.put
        for last, value in chunks(first, records):
            put(log_key(qid, partition, last), value, db=log)
        put(hkey, pack_u64(first + n), db=heads)
        self.appended += n
        self._change("append", qid, partition, first, records)
        return first

    def ack(self, qid: int, partition: int, seqs: Iterable[int]) -> AckState | None:
        """Record acks durably and truncate the acked prefix from the log (S26). Acks for a
        partition that does not exist (dropped by a scale-down after the messages were
        delivered) change nothing and return None: they must not bring back its state."""
        if not self.has_partition(qid, partition):
            return None
        state = self.ack_state(qid, partition)
        old_floor = state.floor
        seqs = list(seqs)
        new_floor = state.add(seqs)
        if new_floor > old_floor:
            self.truncate(qid, partition, new_floor)
        self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
        self._change("ack", qid, partition, seqs)
        return state

    def ack_through(self, qid: int, partition: int, seq: int) -> None:
        """Ack every sequence of the partition up to ``seq`` and move its delivered mark past
        it (a consumer that read the range itself). Like ``ack``, nothing happens to a
        partition that no longer exists."""
        if not self.has_partition(qid, partition):
            return
        state = self.ack_state(qid, partition)
        old_floor = state.floor
        if state.add_through(seq) > old_floor:
            self.truncate(qid, partition, state.floor)
        state.delivered_mark = max(state.delivered_mark, seq)
        self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
        self._change("ack_through", qid, partition, seq)

    def truncate(self, qid: int, partition: int, below: int) -> int:
        """Delete every chunk of the partition whose records all have seq < below (a chunk
        holding ``below - 1`` and later ones stays); return how many chunks went."""
        cur = self._txn.cursor(db=self._dbs["log"])
        end = log_key(qid, partition, below)
        n = 0
        if cur.set_range(log_key(qid, partition, 0)):
            key, delete = cur.key, cur.delete
            while True:
                k = key()
                if not k or k >= end:
                    break
                delete()
                n += 1
                if n == 1 and crashpoints.ENABLED:
                    crashpoints.hit("during_truncation")
        return n

    def set_delivered_mark(self, qid: int, partition: int, mark: int) -> None:
        if not self.has_partition(qid, partition):
            return      # dropped meanwhile (see ack)
        state = self.ack_state(qid, partition)
        if mark > state.delivered_mark:
            state.delivered_mark = mark
            self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
            self._change("delivered_mark", qid, partition, mark)

    def init_partition(self, qid: int, partition: int) -> None:
        """Start a (re)created partition: its ack floor begins at its head, so sequences of an
        earlier incarnation are never reused or redelivered."""
        head = self.head(qid, partition)
        state = AckState(floor=head, above=set(), delivered_mark=head - 1)
        self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
        self._change("init_partition", qid, partition)

    def drop_partition(self, qid: int, partition: int) -> int:
        """Delete a partition's messages and ack state; keep its head so seqs are never reused.
        Returns how many records went."""
        n = self.stored_count(qid, partition)
        if self.has_partition(qid, partition):
            # count the backlog it drops (not a change of its own: a standby applying this
            # drop counts the same)
            removed = self.ack_state(qid, partition).backlog(self.head(qid, partition))
            raw = self.queue_meta(qid, QUEUE_REMOVED)
            self._txn.put(queue_meta_key(qid, QUEUE_REMOVED),
                          pack_u64(removed + (0 if raw is None else unpack_u64(raw))),
                          db=self._dbs["meta"])
        self.truncate(qid, partition, (1 << 64) - 1)
        self._txn.delete(partition_key(qid, partition), db=self._dbs["acks"])
        self._change("drop_partition", qid, partition)
        return n


    # replication -------------------------------------------------------------
    def trim_changes(self, upto: int) -> int:
        """Delete change-log entries with LSN <= ``upto``; return how many went."""
        cur = self._txn.cursor(db=self._dbs["changes"])
        n = 0
        if cur.first():
            while cur.key() and unpack_u64(cur.key()) <= upto:
                cur.delete()
                n += 1
        return n

    def apply(self, change: list) -> None:
        """Apply one logical change from a primary's change log (a DR-standby following it)
        with the same method that recorded it there. Raises ``Diverged`` when an append does not
        land where it did on the primary, ValueError for an unknown change."""
        kind = change[0]
        if kind == "append":
            _, qid, partition, first, records = change
            got = self.append(qid, partition, records)
            if got != first:
                raise Diverged(f"standby diverged: partition {qid}/{partition} appends at {got}, "
                               f"primary at {first}")
            return
        method = _APPLIED.get(kind)
        if method is None:
            raise ValueError(f"unknown change {kind!r}")
        getattr(self, method)(*change[1:])


# change kind -> the Writer method that recorded it (and applies it again on a standby)
_APPLIED = {"ack": "ack", "ack_through": "ack_through", "put_queue": "put_queue",
            "delete_queue": "delete_queue",
            "put_state": "put_state", "delivered_mark": "set_delivered_mark",
            "init_partition": "init_partition", "drop_partition": "drop_partition",
            "meta": "put_meta", "queue_meta": "put_queue_meta"}


def encode_change(lsn: int, time_ns: int, msgs_total: int, changes: list[tuple]) -> bytes:
    """One change-log entry: every logical change of one commit, applied together on a standby."""
    return msgpack.packb((lsn, time_ns, msgs_total, changes), use_bin_type=True)


def decode_change(raw: bytes) -> tuple[int, int, int, list]:
    lsn, time_ns, msgs_total, changes = msgpack.unpackb(raw, raw=False, use_list=True)
    return lsn, time_ns, msgs_total, changes
