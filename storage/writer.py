"""``Writer``: the view one group commit gives each queued operation, and the change-log
entries it records for a DR-standby (rule `replication`). Every mutation of a store goes through one of its
methods, so every mutation is also recorded (and applied again on a standby) in one place.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

import msgpack

from partq.storage import crashpoints
from partq.storage.encoding import (
    AckState,
    chunks,
    encode_meta,
    log_key,
    pack_u64,
    partition_key,
    unpack_u64,
)
from partq.storage.errors import Diverged, StorageFull
from partq.storage.txn import MAX_QID, QID, QUEUE_REMOVED, Reader, change_log_note, queue_meta_key

# Queue meta: bytes of the queue's stored log (the chunks of every partition and of the parent
# log), for the ``max_bytes`` quota. ``append`` adds what it writes and ``truncate`` (and so
# ``drop_partition``) subtracts what it deletes, but only once the counter exists: it is
# created, from one scan of the queue's log, by ``count_bytes`` when a queue first needs it (a
# queue with ``max_bytes`` set). A queue without it pays one lookup per append and per truncation
# that deletes, never a scan, and a store written before the counter existed needs no migration.
# Measured on publish_many(100) of 256-byte messages into 4 partitions (4 appends per commit):
# an append takes ~5 us; the lookup adds ~1 us (+0.6% of a fsynced commit, +1.5% of one with
# durability="async"); keeping the counter, a lookup and a put, adds ~2 us (+1.1% fsynced, +3%
# async) and a truncation must then read every chunk it deletes. Past the 2% we allow on the
# unsynced path, so only queues that need the counter keep it.
# Not a change of its own: a DR-standby applies the same appends and truncations and counts the
# same; the creation is an ordinary ``put_queue_meta`` (replicated), so the standby has it too.
QUEUE_BYTES = b"stored_bytes"


def log_bytes(r: Reader, qid: int) -> int:
    """Bytes of the stored log of queue id ``qid``: its counter, or, for a queue that keeps
    none, the sum of its chunks' sizes (O(chunks))."""
    raw = r.queue_meta(qid, QUEUE_BYTES)
    if raw is not None:
        return unpack_u64(raw)
    return sum(size for p in r.heads(qid) for _, size in r.chunk_sizes(qid, p, 0))


class Writer(Reader):
    """The view one group commit gives each queued operation. Reads see earlier writes of the
    same commit. Operations must validate before they write: an exception from an operation
    aborts the whole commit, which is then retried one operation at a time."""

    __slots__ = ("changes", "appended", "appended_to", "_replicating", "_store")

    def __init__(self, store, txn, replicating: bool) -> None:
        super().__init__(store, txn)
        self._store = store
        self._replicating = replicating
        self.changes: list[tuple] = []
        self.appended = 0
        self.appended_to: set[int] = set()      # qids of the queues it appended to

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
        if qid > MAX_QID:
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
            self._delete_prefix(self._dbs[db], QID.pack(qid))
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

    def count_bytes(self, qid: int) -> int:
        """The bytes of queue id ``qid``'s stored log (``log_bytes``), creating its counter
        when it has none: from then on appends and truncations keep it."""
        raw = self.queue_meta(qid, QUEUE_BYTES)
        if raw is not None:
            return unpack_u64(raw)
        total = log_bytes(self, qid)
        self.put_queue_meta(qid, QUEUE_BYTES, pack_u64(total))
        return total

    def _add_bytes(self, qid: int, delta: int, raw: bytes | None) -> None:
        """Move the byte counter of ``qid`` (stored value ``raw``, None: it keeps none) by
        ``delta``."""
        if raw is not None:
            self._txn.put(queue_meta_key(qid, QUEUE_BYTES),
                          pack_u64(max(0, unpack_u64(raw) + delta)), db=self._dbs["meta"])

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

    def delete_meta(self, key: bytes) -> None:
        self._txn.delete(key, db=self._dbs["meta"])
        self._change("delete_meta", key)

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
        refusal = self._store.append_refusal(self._txn)
        if refusal is not None:
            raise StorageFull(f"{self.path} {refusal}{change_log_note(self)}")
        heads = self._dbs["heads"]
        hkey = partition_key(qid, partition)
        raw = self._txn.get(hkey, db=heads)
        first = 0 if raw is None else unpack_u64(raw)
        n = len(records)
        log, put = self._dbs["log"], self._txn.put
        size = 0
        for last, value in chunks(first, records):
            put(log_key(qid, partition, last), value, db=log)
            size += len(value)
        put(hkey, pack_u64(first + n), db=heads)
        counted = self._txn.get(queue_meta_key(qid, QUEUE_BYTES), db=self._dbs["meta"])
        if counted is not None:
            self._add_bytes(qid, size, counted)
        self.appended += n
        self.appended_to.add(qid)
        self._change("append", qid, partition, first, records)
        return first

    def ack(self, qid: int, partition: int, seqs: Iterable[int]) -> AckState | None:
        """Record acks durably and truncate the acked prefix from the log (rule `truncation`). Acks for a
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
        n = freed = 0
        counted: bytes | None = None
        if cur.set_range(log_key(qid, partition, 0)):
            key, delete = cur.key, cur.delete
            while True:
                k = key()
                if not k or k >= end:
                    break
                if n == 0:      # something goes: does the queue count its bytes?
                    counted = self._txn.get(queue_meta_key(qid, QUEUE_BYTES), db=self._dbs["meta"])
                if counted is not None:
                    freed += len(cur.value())
                delete()
                n += 1
                if n == 1 and crashpoints.ENABLED:
                    crashpoints.hit("during_truncation")
        if counted is not None:
            self._add_bytes(qid, -freed, counted)
        return n

    def set_delivered_mark(self, qid: int, partition: int, mark: int) -> None:
        if not self.has_partition(qid, partition):
            return      # dropped meanwhile (see ack)
        state = self.ack_state(qid, partition)
        if mark > state.delivered_mark:
            state.delivered_mark = mark
            self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
            self._change("delivered_mark", qid, partition, mark)

    def set_failures(self, qid: int, partition: int, counts: list[tuple[int, int]]) -> None:
        """Record how many times messages came back unacked, ``(seq, count)`` pairs; a count
        never goes down (a stored higher one stays) and an acked seq keeps none."""
        if not counts or not self.has_partition(qid, partition):
            return
        state = self.ack_state(qid, partition)
        failures = state.failures
        changed = False
        for seq, n in counts:
            if n > failures.get(seq, 0) and not state.is_acked(seq):
                failures[seq] = n
                changed = True
        if changed:
            self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
            self._change("failures", qid, partition, [list(c) for c in counts])

    def set_delays(self, qid: int, partition: int, delays: list[tuple[int, int]]) -> None:
        """Record nack delays, ``(seq, not_before_ns)`` pairs (``AckState.delay``): a message is
        not delivered again before then, by any process, after a restart too."""
        if not delays or not self.has_partition(qid, partition):
            return
        state = self.ack_state(qid, partition)
        if state.delay(delays):
            self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
            self._change("delays", qid, partition, [list(d) for d in delays])

    def hand_out(self, qid: int, partition: int, mark: int, counts: list[tuple[int, int]]) -> int:
        """What must be durable before messages of a partition are handed out: the delivered
        mark raised to ``mark`` (never lowered), the delivery counts ``counts`` (as
        ``set_failures``), and the partition no longer settled (``AckState.counted``: these
        deliveries are not counted yet). Returns the mark stored before (another process may
        have raised it since this one read it)."""
        if not self.has_partition(qid, partition):
            return mark         # dropped meanwhile (see ack)
        state = self.ack_state(qid, partition)
        before = state.delivered_mark
        changed = state.counted >= 0 or mark > before
        state.counted = -1
        state.delivered_mark = max(mark, before)
        for seq, n in counts:
            if n > state.failures.get(seq, 0) and not state.is_acked(seq):
                state.failures[seq] = n
                changed = True
        if changed:
            self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
            self._change("hand_out", qid, partition, mark, [list(c) for c in counts])
        return before

    def settle(self, qid: int, partition: int, expected: int, mark: int, counted: int,
               counts: list[tuple[int, int]]) -> bool:
        """A holder lets a partition go gracefully: its lost deliveries are counted (``counts``,
        as ``set_failures``) and its delivered mark becomes exact (``mark``, what was really
        handed out, below the lease it stored), every delivery up to ``counted`` being counted,
        so the next holder counts and marks nothing that was not delivered. Only while the
        stored mark is still ``expected``, the one this holder stored last (nobody delivered
        the partition since); False otherwise, changing nothing."""
        if not self.has_partition(qid, partition):
            return False
        state = self.ack_state(qid, partition)
        if state.delivered_mark != expected or mark > expected:
            return False
        for seq, n in counts:
            if n > state.failures.get(seq, 0) and not state.is_acked(seq):
                state.failures[seq] = n
        state.delivered_mark = mark
        state.counted = min(counted, mark)
        self._txn.put(partition_key(qid, partition), state.encode(), db=self._dbs["acks"])
        self._change("settle", qid, partition, expected, mark, counted, [list(c) for c in counts])
        return True

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
            "put_state": "put_state", "delivered_mark": "set_delivered_mark", "failures": "set_failures",
            "delays": "set_delays", "hand_out": "hand_out", "settle": "settle",
            "init_partition": "init_partition", "drop_partition": "drop_partition",
            "meta": "put_meta", "delete_meta": "delete_meta", "queue_meta": "put_queue_meta"}


def encode_change(lsn: int, time_ns: int, msgs_total: int, changes: list[tuple]) -> bytes:
    """One change-log entry: every logical change of one commit, applied together on a standby."""
    return msgpack.packb((lsn, time_ns, msgs_total, changes), use_bin_type=True)


def decode_change(raw: bytes) -> tuple[int, int, int, list]:
    lsn, time_ns, msgs_total, changes = msgpack.unpackb(raw, raw=False, use_list=True)
    return lsn, time_ns, msgs_total, changes
