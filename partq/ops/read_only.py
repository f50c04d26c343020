"""Reading a partq directory without writing to it: for a user who may read the directory but
not write it (an auditor, a monitoring account), or on request (``partq --read-only``).

``open_store_read_only(path)`` gives a ``Store`` and ``open_read_only(path)`` a ``Broker`` that
read exactly what the usual ones read (``queue_config``, ``queues``, ``queue_status``,
``checkpoint``, ``store.read()`` for ``partq.ops.browse``, ``partq.ops.verify``, ``partq.ops.stats``) and
refuse every write with ``OpenedReadOnly``. ``read_only_reason(path)`` says whether this process
must read that way.

What it costs in consistency: LMDB keeps its readers' snapshots alive through a table of
readers in ``lock.mdb``, which a reader must be able to write. Without it (``lock=False``) a
writer in another process does not know this reader exists and may reuse the pages of the
snapshot it reads: a page freed by commit N is reused from commit N + 2 on. So every read made
here is checked afterwards: when more than one commit happened since the snapshot began, its
answer may be torn, and the read is made again on a fresh snapshot, together with the reads the
same ``store.read()`` block made before it (which must give the same answers, or the block
could mix two moments). After ``READ_RETRIES`` attempts, or when those earlier answers changed,
it raises ``TornRead`` rather than return what it cannot vouch for. What remains: LMDB itself
is not hardened against a page rewritten under a reader, so a reader racing a busy writer can,
rarely, fail inside LMDB instead (an error, at worst the reading process ends); and the
delivery owner (``DIR/delivery-locks``) and its live view are visible only to users who may
read that directory.

Thread-safety: as ``Store``: one process, any thread; never across ``fork()``.
"""
from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lmdb

from partq.broker import Broker
from partq.clock import SystemClock
from partq.config import QueueConfig
from partq.delivery import queue_holder
from partq.delivery.lock import LOCK_DIR
from partq.delivery.peers.owner_channel import query_view
from partq.delivery.saved_state import doc_to_view
from partq.errors import (
    CorruptStore,
    FormatVersionMismatch,
    NotAPartqStore,
    OpenedReadOnly,
    PartqError,
    QueueNotFound,
    TornRead,
)
from partq.publish.publisher import Publisher
from partq.replication.role import ReplicationRole
from partq.status import QueueStatus
from partq.status_report import build_queue_status, with_owner_warning
from partq.storage import Reader, Store
from partq.storage.encoding import FORMAT_STAMP, FORMAT_VERSION
from partq.storage.environment import OpenReport
from partq.storage.txn import DB_NAMES

READ_RETRIES = 8          # attempts of one read before TornRead
RETRY_PAUSE = 0.002       # seconds before the first retry; doubles with each
READ_ONLY_ENV = "PARTQ_READ_ONLY"


def read_only_reason(path: str) -> str | None:
    """Why this process must open ``path`` read-only (it may not write the directory, its
    ``data.mdb`` or its ``lock.mdb``, or ``$PARTQ_READ_ONLY`` is set), or None when it may
    write. A missing directory is not a reason: opening it says what is wrong."""
    if os.environ.get(READ_ONLY_ENV, "").strip().lower() not in ("", "0", "no", "false", "off"):
        return f"${READ_ONLY_ENV} is set"
    if not os.path.isdir(path):
        return None
    if not os.access(path, os.W_OK | os.X_OK):
        return f"this user may not write {path}"
    for name in ("data.mdb", "lock.mdb"):
        file = os.path.join(path, name)
        if os.path.exists(file) and not os.access(file, os.R_OK | os.W_OK):
            return f"this user may not write {file}"
    return None


class _SnapshotReader:
    """The ``Reader`` of one ``ReadOnlyStore.read()`` block: every call is checked once it
    returned, and made again on a fresh snapshot when a writer may have torn it (see the
    module's docstring). Its answers are copies (bytes, lists, dicts), never views of the map,
    so an answer that passed its check stays good."""

    def __init__(self, store: ReadOnlyStore) -> None:
        self._store = store
        self._calls: list[tuple[str, tuple, dict, Any]] = []   # answered so far, in order
        self._txn: lmdb.Transaction | None = None
        self._begin()

    def _begin(self) -> None:
        self._txn = self._store.begin_snapshot()
        self._txnid = self._txn.id()
        self._reader = Reader(self._store, self._txn)

    def close(self) -> None:
        if self._txn is not None:
            self._txn.abort()
            self._txn = None

    @property
    def path(self) -> str:
        return self._store.path

    def __getattr__(self, name: str):
        if name.startswith("_") or not callable(getattr(Reader, name, None)):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def _call(self, name: str, args: tuple, kwargs: dict):
        pause = RETRY_PAUSE
        for _ in range(READ_RETRIES):
            try:
                answer, failure = getattr(self._reader, name)(*args, **kwargs), None
            except (lmdb.Error, PartqError, ValueError, TypeError, KeyError, IndexError) as exc:
                answer, failure = None, exc       # garbage read from a reused page, or real
            if self._store.unchanged_since(self._txnid):
                if isinstance(failure, lmdb.Error):
                    raise CorruptStore(f"reading {self._store.path} failed: {failure}; run "
                                       f"`partq verify`, and restore from a DR-standby or "
                                       f"backup if it is damaged") from None
                if failure is not None:
                    raise failure
                self._calls.append((name, args, kwargs, answer))
                return answer
            time.sleep(pause)
            pause *= 2
            self._renew()
        raise self._torn()

    def _renew(self) -> None:
        """A fresh snapshot on which every earlier call of this block answers as before."""
        self.close()
        self._begin()
        for name, args, kwargs, answer in self._calls:
            try:
                again = getattr(self._reader, name)(*args, **kwargs)
            except (lmdb.Error, PartqError, ValueError, TypeError, KeyError, IndexError):
                again = _DIFFERENT
            if again != answer:
                raise self._torn()

    def _torn(self) -> TornRead:
        return TornRead(f"{self._store.path} changed under this read more often than it could "
                        f"retry (reading without LMDB's reader lock: {self._store.reason}); "
                        f"run the command again, or as a user who may write {self._store.path}")


_DIFFERENT = object()


class ReadOnlyStore(Store):
    """A ``Store`` opened with LMDB's ``readonly=True, lock=False``: it writes nothing, not
    even ``lock.mdb``, and checks each read (``_SnapshotReader``). Every write raises
    ``OpenedReadOnly``. Use ``open_store_read_only``."""

    def __init__(self, path: str, reason: str) -> None:    # no Store.__init__: no writer thread
        self.path = path
        self.reason = reason
        self.durability = "sync"
        self.max_map_size = 0
        self.report = OpenReport()
        self._pid = os.getpid()
        self._refs = 1
        self._closed = False
        try:
            # map_size=0: the map size the store's writers set (in its meta page)
            self.env = lmdb.open(path, readonly=True, lock=False, subdir=True, create=False,
                                 max_dbs=len(DB_NAMES) + 2, map_size=0)
        except lmdb.Error as exc:
            raise CorruptStore(f"cannot open {path} for reading: {exc}") from None
        try:
            self.dbs = self._open_dbs()
        except BaseException:
            self.env.close()
            raise

    def _open_dbs(self) -> dict[str, Any]:
        with self.env.begin() as txn:
            if txn.get(b"meta") is None:
                if any(True for _ in txn.cursor()):
                    raise NotAPartqStore(f"{self.path} holds an LMDB environment that is not a "
                                         f"partq store")
                raise NotAPartqStore(f"{self.path} holds no partq store yet; create it with "
                                     f"`partq --data {self.path} init` as a user who may write it")
        try:
            dbs = {name: self.env.open_db(name.encode(), create=False) for name in DB_NAMES}
        except lmdb.Error as exc:
            raise CorruptStore(f"cannot read {self.path}: {exc}") from None
        with self.env.begin() as txn:
            stamp = txn.get(b"format", db=dbs["meta"])
        if stamp != FORMAT_STAMP:
            raise FormatVersionMismatch(
                f"{self.path} was written in on-disk format "
                f"{(stamp or b'?').decode(errors='replace')!r}; this partq reads format "
                f"{FORMAT_VERSION}: read it with the partq version that wrote it")
        return dbs

    def begin_snapshot(self) -> lmdb.Transaction:
        """A read transaction on the newest commit, adopting a map grown by a writer."""
        self.check_usable()
        for _ in range(READ_RETRIES):
            try:
                return self.env.begin(write=False)
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)
            except lmdb.Error as exc:
                raise CorruptStore(f"cannot read {self.path}: {exc}") from None
        raise TornRead(f"{self.path}: its writers keep growing the map; run the command again")

    def unchanged_since(self, txnid: int) -> bool:
        """Whether a snapshot of commit ``txnid`` is still intact: no writer may reuse its
        pages before commit ``txnid + 2`` exists (pages freed by ``txnid + 1`` are reused from
        ``txnid + 3`` on, and that one starts once ``txnid + 2`` is committed)."""
        return self.env.info()["last_txnid"] <= txnid + 1

    @contextmanager
    def read(self) -> Iterator[Any]:   # a _SnapshotReader, used as a Reader
        """A checked read-only snapshot (see the module's docstring)."""
        reader = _SnapshotReader(self)
        try:
            yield reader
        finally:
            reader.close()

    def version(self) -> int:
        return self.env.info()["last_txnid"]

    def usage(self) -> dict:
        info, psize = self.env.info(), self.env.stat()["psize"]
        with self.read() as r:
            pages = 4 + sum(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
                            for st in (r.db_stat(name) for name in DB_NAMES))
        # reader slots live in lock.mdb, which this store does not open: unknown here
        return {"file_size": os.path.getsize(os.path.join(self.path, "data.mdb")),
                "high_water": (info["last_pgno"] + 1) * psize, "live": pages * psize,
                "map_size": info["map_size"], "readers": None, "max_readers": None}

    def _refuse(self) -> OpenedReadOnly:
        return OpenedReadOnly(f"{self.path} is open read-only ({self.reason}); writes are "
                              f"refused: run as a user who may write it")

    def submit(self, op: Callable):
        raise self._refuse()

    def reserve(self, nbytes: int) -> None:
        raise self._refuse()

    def grow_map(self) -> None:
        raise self._refuse()

    def on_commit(self, fn: Callable[[int], None]) -> None:
        """Nothing commits here."""

    def remove_commit_hook(self, fn: Callable[[int], None]) -> None:
        """Nothing commits here."""

    def sync(self) -> None:
        """Nothing to flush."""

    def close(self) -> None:
        if self._pid != os.getpid() or self._closed:
            return
        self._closed = True
        self.env.close()


def open_store_read_only(path: str | os.PathLike, reason: str = "opened read-only") -> Store:
    """The store in ``path`` for reading only. When this process has it open already (a
    ``Broker`` of its own), that store is shared instead: LMDB allows one environment per
    directory per process, and that one reads with a reader lock. ``reason`` is quoted by
    errors."""
    real = os.path.realpath(os.fspath(path))
    if not os.path.isdir(real):
        raise NotAPartqStore(f"{real} does not exist or is not a directory")
    if not os.path.exists(os.path.join(real, "data.mdb")):
        raise NotAPartqStore(f"{real} holds no partq store")
    try:
        return ReadOnlyStore(real, reason)
    except CorruptStore as exc:
        if "already open in this process" not in str(exc):
            raise
    return Store.open(real, create=False)


class ReadOnlyBroker(Broker):
    """A ``Broker`` over a store opened for reading: ``queue_config``, ``queues``,
    ``queue_status``, ``checkpoint``, ``replication_status`` and ``store`` as usual; publishes,
    binds and changes raise ``OpenedReadOnly``. It runs no threads and takes no lock."""

    def __init__(self, store: Store, reason: str) -> None:   # no Broker.__init__: no threads
        self._store = store
        self._role = ReplicationRole(store)
        self._closed = False
        self.reason = reason
        self.clock = SystemClock()
        self.publisher = Publisher(store, self.clock, random.Random())

    def _check_writable(self) -> None:
        raise OpenedReadOnly(f"{self.path} is open read-only ({self.reason}); publishes, binds "
                             f"and changes are refused: run as a user who may write it")

    def queue_status(self, queue: str) -> QueueStatus:
        """As ``Broker.queue_status``; the live view comes from the delivery owner's socket when
        this user may reach it, else from the stored state. When this user may not read
        ``DIR/delivery-locks``, a warning says the owner is unknown."""
        config = self.queue_config(queue)
        doc = query_view(self.path, config.qid)
        view = doc_to_view(doc) if doc is not None else None
        with self._store.read() as r:
            raw = r.queue(queue)
            if raw is None:
                raise QueueNotFound(f"no queue named {queue!r}")
            config = QueueConfig.from_dict(raw)
            st = build_queue_status(r, config, view, queue_holder(self.path, config.qid))
        st = with_owner_warning(st, self.path, config.qid, view is None)
        locks = os.path.join(self.path, LOCK_DIR)
        if os.path.isdir(locks) and not os.access(locks, os.R_OK | os.X_OK):
            st = dataclasses.replace(st, warnings=[*st.warnings, (
                f"delivery owner unknown: this user may not read {locks}; assignments and "
                f"statuses are those last stored")])
        return st

    def tick(self) -> None:
        """No timers run here."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._store.close()


def open_read_only(path: str | os.PathLike, reason: str = "opened read-only") -> Broker:
    """A ``ReadOnlyBroker`` on the store in ``path`` (see ``open_store_read_only``)."""
    store = open_store_read_only(path, reason)
    try:
        return ReadOnlyBroker(store, reason)
    except BaseException:
        store.close()
        raise
