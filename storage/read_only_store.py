"""A store opened without writing to its directory: ``ReadOnlyStore.open(path, reason=...)``.

For a user who may read the directory but not write it (an auditor, a monitoring account), or
on request. It reads exactly what ``Store`` reads (``store.read()`` gives the same ``Reader``
calls) and refuses every write with ``OpenedReadOnly``; it runs no thread.

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
rarely, fail inside LMDB instead (an error, at worst the reading process ends).

Thread-safety: as ``Store``: one process, any thread; never across ``fork()``.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import lmdb

from partq.storage.environment import Opening
from partq.storage.errors import NotAPartqStore, OpenedReadOnly, PartqError, TornRead
from partq.storage.lmdb_errors import Step, translated
from partq.storage.store import Store
from partq.storage.txn import Reader

READ_RETRIES = 8          # attempts of one read before TornRead
RETRY_PAUSE = 0.002       # seconds before the first retry; doubles with each
# what a read on a page a writer reused may raise instead of answering
_GARBAGE_READ = (PartqError, ValueError, TypeError, KeyError, IndexError)


class ReadOnlyStore(Store):
    """A ``Store`` opened with LMDB's ``readonly=True, lock=False``: it writes nothing, not
    even ``lock.mdb``, and checks each read (``SnapshotReader``). Every write raises
    ``OpenedReadOnly``; ``reason`` (why it was opened so) is quoted by its errors."""

    def __init__(self, path: str, reason: str) -> None:
        self.reason = reason
        # a read-only store never writes, so a writer's settings mean nothing here: its map
        # size is the one the store's writers set
        super().__init__(path, "sync", map_size=0, max_map_size=0)

    @classmethod
    def open(cls, path: str | os.PathLike, *, reason: str = "opened read-only",
             **settings: Any) -> Store:
        """The store in directory ``path`` for reading only. When this process has it open
        already (a ``Broker`` of its own), that store is shared instead: LMDB allows one
        environment per directory per process, and that one reads with a reader lock. The
        settings of ``Store.open`` (durability, map sizes, create, file_mode) are a writer's:
        they have no effect here, and a missing store is never created."""
        real = os.path.realpath(os.fspath(path))
        shared = Store.shared(real)
        if shared is not None:
            return shared
        if not os.path.isdir(real):
            raise NotAPartqStore(f"{real} does not exist or is not a directory")
        if not os.path.exists(os.path.join(real, "data.mdb")):
            raise NotAPartqStore(f"{real} holds no partq store")
        return cls(real, reason)

    def _open_environment(self, opening: Opening,
                          map_size: int) -> tuple[lmdb.Environment, dict[str, Any], bool]:
        env, dbs = opening.open_lock_free()
        return env, dbs, True

    def check_writable(self) -> None:
        raise OpenedReadOnly(f"{self.path} is open read-only ({self.reason}); writes are "
                             f"refused: run as a user who may write it")

    def unchanged_since(self, txnid: int) -> bool:
        """Whether a snapshot of commit ``txnid`` is still intact: no writer may reuse its
        pages before commit ``txnid + 2`` exists (pages freed by ``txnid + 1`` are reused from
        ``txnid + 3`` on, and that one starts once ``txnid + 2`` is committed)."""
        return self.env.info()["last_txnid"] <= txnid + 1

    def snapshot_kept(self, txnid: int) -> bool:
        return self.unchanged_since(txnid)

    @contextmanager
    def read(self) -> Iterator[Any]:   # a SnapshotReader, used as a Reader
        """A checked read-only snapshot (see the module's docstring)."""
        reader = SnapshotReader(self)
        try:
            yield reader
        finally:
            reader.close()

    def usage(self) -> dict:
        # reader slots live in lock.mdb, which this store does not open: unknown here
        return {**super().usage(), "readers": None, "max_readers": None}


class SnapshotReader:
    """The ``Reader`` of one ``ReadOnlyStore.read()`` block: every call is checked once it
    returned, and made again on a fresh snapshot when a writer may have torn it (see the
    module's docstring). Its answers are copies (bytes, lists, dicts), never views of the map,
    so an answer that passed its check stays good."""

    def __init__(self, store: ReadOnlyStore) -> None:
        self._store = store
        self._calls: list[tuple[str, tuple, dict, Any]] = []   # answered so far, in order
        self._snapshot = ExitStack()
        self._begin()

    def _begin(self) -> None:
        txn = self._snapshot.enter_context(self._store.read_transaction())
        self._txnid = txn.id()
        self._reader = Reader(self._store, txn)

    def close(self) -> None:
        self._snapshot.close()

    @property
    def path(self) -> str:
        return self._store.path

    def __getattr__(self, name: str) -> Callable:
        if name.startswith("_") or not callable(getattr(Reader, name, None)):
            raise AttributeError(name)
        return lambda *args, **kwargs: self._call(name, args, kwargs)

    def _ask(self, name: str, args: tuple, kwargs: dict) -> Any:
        with translated(self._store.path, Step.READ):
            return getattr(self._reader, name)(*args, **kwargs)

    def _call(self, name: str, args: tuple, kwargs: dict) -> Any:
        pause = RETRY_PAUSE
        for _ in range(READ_RETRIES):
            try:
                answer, failure = self._ask(name, args, kwargs), None
            except _GARBAGE_READ as exc:
                answer, failure = None, exc       # garbage read from a reused page, or real
            if self._store.unchanged_since(self._txnid):
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
                again = self._ask(name, args, kwargs)
            except _GARBAGE_READ:
                again = _DIFFERENT
            if again != answer:
                raise self._torn()

    def _torn(self) -> TornRead:
        return TornRead(f"{self._store.path} changed under this read more often than it could "
                        f"retry (reading without LMDB's reader lock: {self._store.reason}); "
                        f"run the command again, or as a user who may write {self._store.path}")


_DIFFERENT = object()
