"""Group commit: one writer thread turns every queued write of this process into shared commits.

Callers queue an operation (a function of a ``Writer``) and wait on its future. The thread takes
everything queued, runs it all in one write transaction, commits (with fsync in sync mode) and
resolves every future, so N concurrent publishers pay for about one fsync, not N (rule `durable-publish`).
A caller that would wait anyway and finds the writer idle, nothing queued, commits in its own
thread instead (``write_now``); what others queue meanwhile goes in the thread's next commit.

Failure handling, in order:
* ``lmdb.MapFullError``: the transaction is aborted (nothing of it is visible), the map doubles
  and the batch runs again; at ``max_map_size`` every operation fails with ``StorageFull``.
* any other exception from a batch of several operations: the batch is aborted and each
  operation runs again alone, so one bad operation fails only its own caller, with the
  exception its operation raised (an lmdb exception as its partq error, by
  ``partq.storage.lmdb_errors``).
* a directory marked superseded (``SUPERSEDED``: a DR primary a promoted standby told so) commits
  nothing a standby would copy: a batch that made such changes fails with ``Superseded``, so its
  operations run alone and only those that changed queues or messages fail. Every process of the
  directory sees the mark in its next commit.

The thread starts with the first write: a store that is only read (or refuses writes, as
``ReadOnlyStore``) runs none.

Merging: an operation with a ``merge_key`` attribute runs together with every other operation
of the batch that has the same key, through ``type(op).run_merged(writer, ops)``, which returns
one result per op (the broker merges single publishes to one queue into one append per
partition). The merged group runs at its first member's place; members keep their order.
"""
from __future__ import annotations

import logging
import threading
import time
from _thread import allocate_lock
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, cast

import lmdb
import msgpack

from partq.storage import crashpoints
from partq.storage.errors import BrokerClosed, Superseded
from partq.storage.lmdb_errors import Step, translate
from partq.storage.writer import Writer

MAX_OPS_PER_COMMIT = 8192
_callbacks_lock = threading.Lock()      # a Pending's callbacks against its resolution
log = logging.getLogger("partq.storage")


class SyncGate(Protocol):
    """Holds the callers of commits that wrote replicated changes until they may go on."""

    def hold(self, lsn: int, batch: list, results: list) -> None: ...


class Pending:
    """The result of one queued write, resolved after its commit. A bare lock is the cheapest
    wake-up CPython has (a ``concurrent.futures.Future`` costs a Condition and notify_all per
    write, which showed up as GIL contention with 32 publishing threads)."""

    __slots__ = ("op", "_done", "_value", "_error", "_callbacks")

    def __init__(self, op: Callable) -> None:
        self.op = op
        self._done = allocate_lock()
        self._done.acquire()
        self._value: object = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[], None]] | None = None

    def resolve(self, value=None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        with _callbacks_lock:
            self._done.release()
            callbacks, self._callbacks = self._callbacks, None
        for fn in callbacks or ():
            try:
                fn()
            except Exception:   # a callback's failure is its own: the commit is made
                log.exception("a callback of a commit failed")

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once the write is resolved: at once if it is, else in the thread that
        resolves it (the committing thread: ``fn`` must be quick and must not write)."""
        with _callbacks_lock:
            if not self.done():
                self._callbacks = [*(self._callbacks or ()), fn]
                return
        fn()

    def done(self) -> bool:
        """Whether the commit has happened (or failed): ``result()`` would not wait."""
        return not self._done.locked()

    def result(self):
        """Wait for the commit; return the operation's result or raise its error."""
        self._done.acquire()
        self._done.release()
        if self._error is not None:
            raise self._error
        return self._value


class GroupCommitWriter:
    def __init__(self, store) -> None:
        self._store = store
        self._pending: deque[Pending] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._listeners: list[Callable[[int], None]] = []
        self._stats_listeners: list[Callable[[float, int, int], None]] = []
        self._change_listeners: list[Callable[[int, frozenset[int]], None]] = []
        self.commits = 0          # counters for stats and benchmarks
        self.ops = 0
        self.last_lsn = 0         # LSN of the newest commit that wrote the change log
        self.sync_gate: SyncGate | None = None     # set by a sync-mode replication server: holds callers
                                  # until the standby has their commit (rule `replication`)
        # set by replication: checked in each commit that wrote the change log (see Store)
        self.change_log_guard: ChangeLogGuard | None = None
        self._thread: threading.Thread | None = None      # started by the first submit
        self._busy = False        # a commit is under way (the thread's, or a caller's: write_now)
        self._crowded = False     # the writer thread's last commit carried writes of several
                                  # callers: a caller that finds it idle is not alone

    def add_listener(self, fn: Callable[[int], None]) -> None:
        """Call ``fn(appended)`` in the committing thread after every commit (must be quick, must not
        write); ``appended`` is how many records the commit appended."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[int], None]) -> None:
        if fn in self._listeners:
            self._listeners.remove(fn)

    def add_change_listener(self, fn: Callable[[int, frozenset[int]], None]) -> None:
        """Call ``fn(version, qids)`` in the committing thread after every commit (must be
        quick, must not write): ``version`` is the store version the commit made (what
        ``Store.version()`` reads once it is visible, until the next commit of any process),
        ``qids`` the queues it appended records to."""
        self._change_listeners.append(fn)

    def remove_change_listener(self, fn: Callable[[int, frozenset[int]], None]) -> None:
        if fn in self._change_listeners:
            self._change_listeners.remove(fn)

    def add_stats_listener(self, fn: Callable[[float, int, int], None]) -> None:
        """Call ``fn(seconds, operations, appended)`` in the committing thread after every commit:
        how long its transaction and fsync took, how many operations and appended records it
        carried (the metrics' commit histograms). Must be quick."""
        self._stats_listeners.append(fn)

    def remove_stats_listener(self, fn: Callable[[float, int, int], None]) -> None:
        if fn in self._stats_listeners:
            self._stats_listeners.remove(fn)

    def submit(self, op: Callable[[Writer], object]) -> Pending:
        pending = Pending(op)
        with self._cond:
            self._queue(pending)
        return pending

    def write_now(self, op: Callable[[Writer], object]) -> Pending:
        """``submit`` for a caller that waits for the commit anyway: when the writer is idle
        (``claim``), commit ``op`` in the calling thread (a lone writer saves the
        hand-off to the writer thread and back); otherwise queue it for the next shared commit.
        Returns its handle, resolved when committed here."""
        if self.claim():
            return self.commit_claimed(op)
        return self.submit(op)

    def claim(self) -> bool:
        """Reserve the next commit for the calling thread: True when no commit is under way,
        nothing is queued, and the writer thread's last commit was not shared (else callers
        are many, and one committing alone would only split their next commit in two: 32
        publishing threads averaged 16 writes a commit). What is submitted meanwhile queues
        behind it, so a caller that
        must order its write under a lock of its own can claim under that lock and commit
        after leaving it. Every True must be followed by ``commit_claimed``."""
        with self._cond:
            if self._busy or self._pending or self._stopping or self._crowded:
                return False
            self._busy = True
            return True

    def commit_claimed(self, op: Callable[[Writer], object]) -> Pending:
        """Commit ``op`` in the calling thread, which holds the claim (``claim``); returns its
        handle, resolved. The claim ends here, whatever the commit did."""
        pending = Pending(op)
        try:
            self._commit([pending])
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()     # the thread (what was queued meanwhile), or stop()
        return pending

    def _queue(self, pending: Pending) -> None:
        """Under ``_cond``: queue ``pending`` for the writer thread (started on first use)."""
        if self._stopping:
            raise BrokerClosed(f"the store at {self._store.path} is closing; open it again")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="partq-writer", daemon=True)
            self._thread.start()
        self._pending.append(pending)
        self._cond.notify()

    def stop(self) -> None:
        """Finish what is queued, and a caller's commit under way, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
            while self._busy and thread is None:
                self._cond.wait()
        if thread is not None and threading.current_thread() is not thread:
            thread.join()

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        pending, cond = self._pending, self._cond
        while True:
            with cond:
                while self._busy or (not pending and not self._stopping):
                    cond.wait()         # (a caller's commit: one transaction at a time)
                if not pending:
                    return
                if self._crowded:
                    # Callers just woken by the last commit are writing again: let them run
                    # before taking the batch (32 publishing threads: 16 -> 28 writes a commit).
                    # Claims are refused meanwhile, and only this thread takes from pending.
                    cond.release()
                    time.sleep(0)
                    cond.acquire()
                n = min(len(pending), MAX_OPS_PER_COMMIT)
                batch = [pending.popleft() for _ in range(n)]
                self._busy = True
                self._crowded = n > 1
            try:
                self._commit(batch)
            finally:
                with cond:
                    self._busy = False

    def _commit(self, batch: list[Pending]) -> None:
        started = time.perf_counter()
        try:
            outcome = self._run_batch(batch)
        except BaseException as exc:  # every failure reaches its caller
            if len(batch) == 1:
                batch[0].resolve(error=translate(exc, self._store.path, Step.WRITE))
            else:
                for item in batch:
                    self._commit([item])
            return
        elapsed = time.perf_counter() - started
        results, lsn, replicated, appended, version, appended_to = outcome
        if crashpoints.ENABLED:
            crashpoints.hit("after_commit_before_return")
        self.commits += 1
        self.ops += len(batch)
        if lsn:
            self.last_lsn = lsn
        gate = self.sync_gate
        held: list[tuple[Pending, object]] = []
        for pending, result, wrote in zip(batch, results, replicated, strict=True):
            if wrote and gate is not None:
                held.append((pending, result))
            else:
                pending.resolve(result)
        if held and gate is not None:
            gate.hold(lsn, [p for p, _ in held], [r for _, r in held])
        for fn in self._listeners:
            fn(appended)
        if self._change_listeners:
            qids = frozenset(appended_to)
            for change in self._change_listeners:
                change(version, qids)
        for stats in self._stats_listeners:
            stats(elapsed, len(batch), appended)

    def _run_batch(self, batch) -> tuple[list, int, list[bool], int, int, set[int]]:
        """Run the batch in one transaction; return the results, the commit's LSN (0 when no
        standby slot exists, so nothing went to the change log), per operation whether it
        wrote replicated changes (only those wait for a sync-mode standby), how many
        records it appended, the store version it made and the qids it appended to."""
        store = self._store
        meta = store.dbs["meta"]
        changes_db = store.dbs["changes"]
        while True:
            try:
                with store.write_transaction() as txn:
                    replicating = txn.get(b"slots", db=meta) is not None
                    superseded = txn.get(SUPERSEDED, db=meta)
                    writer = Writer(store, txn, replicating or superseded is not None)
                    results, replicated = _run_ops(writer, batch)
                    if superseded is not None and writer.changes:
                        raise superseded_error(store.path, superseded)
                    lsn = writer.finish(changes_db)
                    guard = self.change_log_guard
                    over = bool(lsn) and guard is not None and guard.over(writer)
                    if crashpoints.ENABLED:
                        crashpoints.hit("before_commit")
                    version = txn.id()
                    txn.commit()
                store.cover_file()
                if over and guard is not None:
                    self._bound_change_log(guard)
                return results, lsn, replicated, writer.appended, version, writer.appended_to
            except lmdb.MapFullError:
                pass
            store.grow_map()  # raises StorageFull at the limit; otherwise try again, bigger

    def _bound_change_log(self, guard: ChangeLogGuard) -> None:
        """The commit just made took the change log past its bound: trim it now, in a
        transaction of its own, before this thread takes the next batch. (Not in the commit
        itself: pages LMDB allocates and frees within one transaction are never written, which
        leaves data.mdb shorter than its meta page says.) A failure leaves it to the upkeep
        thread."""
        try:
            with self._store.write_transaction() as txn:
                guard.trim(Writer(self._store, txn, False))
                txn.commit()
        except Exception:       # the batch is committed: nothing here may fail its callers
            pass


SUPERSEDED = b"superseded"   # meta: who superseded this primary (``partq.replication.supersede``)


def superseded_error(path: str, raw: bytes) -> Superseded:
    """The error of a write to a superseded directory, from its ``SUPERSEDED`` value."""
    try:
        info = msgpack.unpackb(raw)
        by, tid, when = str(info["by"]), str(info["timeline"]), float(info["at"])
        said = (f"its standby at {by} was promoted (timeline {tid}) and said so at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(when))}")
    except Exception:  # a mark this version cannot read is a mark still
        said = "a standby of it was promoted"
    return Superseded(
        f"{path} is a superseded DR primary: {said}; it refuses publishes, acks, binds and queue "
        f"changes so that only one primary takes writes. Point clients at the new primary; to use "
        f"this directory again, move it aside and start a standby of the new primary in a new "
        f"one (what it took after the promotion is in the moved directory)")


class ChangeLogGuard(Protocol):
    """A bound on the replication change log (``Store.guard_change_log``)."""

    def over(self, r: Writer) -> bool:
        """Whether the log is past its bound (read in the commit that wrote to it)."""

    def trim(self, w: Writer) -> None:
        """Bring it back within its bound (in a transaction of its own)."""


def _run_ops(writer: Writer, batch: list[Pending]) -> tuple[list, list[bool]]:
    """Run every operation of the batch, merging those that share a ``merge_key``. Returns the
    results and, per operation, whether it wrote replicated changes."""
    groups: dict[object, list[int]] = {}
    steps: list[tuple[object, int]] = []
    for i, pending in enumerate(batch):
        key = getattr(pending.op, "merge_key", None)
        if key is None:
            steps.append((None, i))
        elif key in groups:
            groups[key].append(i)
        else:
            groups[key] = [i]
            steps.append((key, i))
    results: list = [None] * len(batch)
    replicated = [False] * len(batch)
    for key, i in steps:
        before = len(writer.changes)
        members = groups[key] if key is not None else (i,)
        if len(members) == 1:
            results[i] = batch[i].op(writer)
        else:
            ops = [batch[j].op for j in members]
            run_merged = cast(Any, type(ops[0])).run_merged   # ops with a merge_key have it
            merged = run_merged(writer, ops)
            for j, result in zip(members, merged, strict=True):
                results[j] = result
        wrote = len(writer.changes) > before
        for j in members:
            replicated[j] = wrote
    return results, replicated
