"""The LMDB environment of one partq directory: open, format check, map growth, close.

One ``Store`` per directory per process (LMDB forbids two environments on one path in a process);
``Store.open`` hands out the shared instance and counts references. Every read runs in
``Store.read()``; every write goes through the group-commit writer (``Store.write``/``submit``),
which is the only code that opens write transactions (in its thread, or in the thread of a
caller that waits and finds it idle). An lmdb exception leaves it as a partq
error, translated by ``partq.storage.lmdb_errors``. ``ReadOnlyStore`` (``read_only_store``) is
the same store opened without writing anything.

Thread-safety: all public methods are safe to call from any thread of the opening process, and
from no other process: a Store used after ``fork()`` raises ``UsedAcrossFork``.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import lmdb

from partq.storage.commit_hooks import CommitHooks
from partq.storage.encoding import unpack_u64
from partq.storage.environment import RESIZE_RETRIES, Opening
from partq.storage.errors import BrokerClosed, InvalidConfig, PartqError, StorageFull, UsedAcrossFork
from partq.storage.files import DEFAULT_FILE_MODE, file_mode_of, prepare_directory
from partq.storage.gate import TxnGate
from partq.storage.lmdb_errors import Step, translated
from partq.storage.process_id import this_pid
from partq.storage.snapshot import ReadSnapshot
from partq.storage.space import Space
from partq.storage.txn import DB_NAMES, change_log_note
from partq.storage.writelock import WRITE_LOCK_POLL, LockFile, stopped_writer, write_lock
from partq.storage.writer import Writer

T = TypeVar("T")

DURABILITY_MODES = ("sync", "async")
DEFAULT_MAP_SIZE = 64 << 20          # initial map; it doubles on demand
DEFAULT_MAX_MAP_SIZE = 1 << 40       # 1 TiB of address space, far beyond any disk here
ASYNC_FLUSH_INTERVAL = 0.2           # seconds between background flushes in async mode
_registry: dict[str, Store] = {}
_registry_lock = threading.Lock()


class Store(CommitHooks):
    """One open partq directory. Use ``Store.open``; close with ``close()`` or ``with``. Its
    commit hooks come from ``CommitHooks``."""

    def __init__(self, path: str, durability: str, map_size: int, max_map_size: int,
                 file_mode: int = DEFAULT_FILE_MODE) -> None:
        self.path = path
        self.durability = durability
        self.max_map_size = max_map_size
        self.file_mode = file_mode
        self._opening = Opening(path, durability == "sync", file_mode)
        self.report = self._opening.report
        self._pid = this_pid()
        self._refs = 1
        self._gate = TxnGate()
        self._closed = False
        # An existing store whose write lock another process holds (a commit under way, or a
        # process stopped inside one) is opened with LMDB's readonly environment, whose named
        # databases open without a write transaction; the first write of this process reopens
        # it writable (``_make_writable``). Otherwise the environment is writable from the
        # start. (py-lmdb exports the database handles a read transaction opened only in a
        # readonly environment: hence the two ways.)
        self._upgrade_lock = threading.Lock()
        self._lock_file = LockFile(path)
        self.env, self.dbs, self._env_readonly = self._open_environment(self._opening, map_size)
        psize = self._psize = self.env.stat()["psize"]
        self.space = Space(path, psize, max_map_size)
        from partq.storage.group_commit import GroupCommitWriter
        self._writer = GroupCommitWriter(self)
        self._flusher = None
        self._stop_flushing = threading.Event()
        if durability == "async":
            self._flusher = threading.Thread(target=self._flush_loop, name="partq-flush", daemon=True)
            self._flusher.start()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | os.PathLike, *, durability: str = "sync", map_size: int = DEFAULT_MAP_SIZE,
             max_map_size: int = DEFAULT_MAX_MAP_SIZE, create: bool = True,
             file_mode: int | None = None) -> Store:
        """Open (and create if missing and ``create``) the store in directory ``path``.

        Opening an existing store never waits for LMDB's write lock: it reads in a read
        transaction only (a process stopped inside a commit cannot hold up an inspection); only
        creating a store writes. A new directory is made 0700 and its data files 0600 whatever
        the umask; ``file_mode`` (or ``$PARTQ_FILE_MODE``, octal) 0o640 gives the group read
        access instead. Modes of an existing store are left as they are.

        ``durability="sync"`` (default): a write returns after LMDB committed it with fsync; all of
        ACID holds across process and OS crashes. ``durability="async"``: commits are not fsynced
        (a background thread flushes every 0.2 s); a *process* crash loses nothing, but an OS crash
        or power loss may lose the writes of the last moments and, as LMDB documents for its
        ``sync=False`` mode, may damage the file: it gives up D, and C against OS crashes.
        """
        if durability not in DURABILITY_MODES:
            raise InvalidConfig(f"durability must be one of {DURABILITY_MODES}, not {durability!r}")
        if map_size <= 0 or max_map_size < map_size:
            raise InvalidConfig("need 0 < map_size <= max_map_size")
        mode = file_mode_of(file_mode)
        real = os.path.realpath(os.fspath(path))
        with _registry_lock:
            store = _registry.get(real)
            if store is not None and store._pid != this_pid() and not store._closed:
                raise UsedAcrossFork(_fork_message(real, store._pid))
            if store is not None and not store._closed:
                if store.durability != durability:
                    raise InvalidConfig(f"{real} is already open in this process with durability="
                                        f"{store.durability!r}; open it with the same setting")
                if store.max_map_size != max_map_size:
                    raise InvalidConfig(f"{real} is already open in this process with max_map_size="
                                        f"{store.max_map_size}, not {max_map_size}: one process "
                                        f"shares one environment per directory; open it with the "
                                        f"same max_map_size (or share the Broker)")
                store._refs += 1
                return store
            prepare_directory(real, create, mode)
            store = cls(real, durability, map_size, max_map_size, mode)
            _registry[real] = store
            return store

    @staticmethod
    def shared(path: str) -> Store | None:
        """The store this process has open in directory ``path`` (a real path), with one more
        reference (close it as usual), or None."""
        with _registry_lock:
            store = _registry.get(path)
            if store is None or store._closed or store._pid != this_pid():
                return None
            store._refs += 1
            return store

    def _open_environment(self, opening: Opening,
                          map_size: int) -> tuple[lmdb.Environment, dict[str, Any], bool]:
        """The environment, its databases, and whether the environment is LMDB's readonly one
        (``Opening.open_store``; ``ReadOnlyStore`` opens its own way)."""
        return opening.open_store(map_size)

    def _make_writable(self) -> None:
        """Reopen a store opened read-only for writing, before this process's first write.
        While the writer that holds LMDB's write lock is stopped it waits (this write would
        anyway) without holding up this process's readers; then it reopens the environment
        writable, its databases taking that lock (py-lmdb offers no other way). A thread that
        holds a read itself (an ack computed in a read) waits parked: its transaction ends with
        the readonly environment, which it must not use again."""
        with self._gate.parked(), self._upgrade_lock:
            while self._env_readonly and \
                    (lock := write_lock(self.path, self._lock_file)) is not None and lock[2]:
                time.sleep(WRITE_LOCK_POLL)
            self._reopen_writable()

    def _reopen_writable(self) -> None:
        with self._gate.exclusive(over_parked=True):
            if not self._env_readonly or self._closed:
                return
            map_size = self.env.info()["map_size"]
            self.env.close()
            try:
                env = self._opening.open_env(map_size, readonly=False)
                try:
                    dbs = self._opening.open_dbs(env)
                    self._opening.stamp_current(env, dbs)
                except BaseException:
                    env.close()
                    raise
            except BaseException:
                self.env = self._opening.open_env(map_size, readonly=True)      # as it was
                self.dbs = self._opening.open_dbs(self.env)
                raise
            self.env, self.dbs, self._env_readonly = env, dbs, False

    def cover_file(self) -> None:
        """After a commit (the committing thread): keep data.mdb covering the pages LMDB counts
        and its reserve for acks allocated on disk (``partq.storage.space``)."""
        self.space.after_commit(self._info()["last_pgno"])

    def _info(self) -> Any:
        """``env.info()`` that never meets the environment ``_make_writable`` closed."""
        self._gate.enter()
        try:
            return self.env.info()
        finally:
            self._gate.leave()

    # ------------------------------------------------------------------ reading
    def read(self) -> ReadSnapshot:
        """A consistent read-only snapshot (``with store.read() as reader``). Keep it short: the
        map cannot grow while it is open."""
        return ReadSnapshot(self, self._gate, self._begin)

    @contextmanager
    def read_transaction(self) -> Iterator[lmdb.Transaction]:
        """The raw read transaction under ``read()``'s ``Reader``, on the newest commit (a map
        another process grew is adopted). It holds the gate shared: a map resize, or closing,
        waits for it to end. An lmdb exception in it leaves as its partq error."""
        self.check_usable()
        self._gate.enter()
        try:
            with translated(self.path, Step.READ):
                txn = self._begin(write=False)
                try:
                    yield txn
                finally:
                    txn.abort()
        finally:
            self._gate.leave()

    def snapshot_kept(self, txnid: int) -> bool:
        """Whether the pages of commit ``txnid`` are still as it left them, for a read
        transaction of this store that began on that commit or before it and has not ended:
        its slot in lock.mdb keeps them (``ReadOnlyStore``, which has none, checks)."""
        return True

    @contextmanager
    def write_transaction(self) -> Iterator[lmdb.Transaction]:
        """A raw write transaction for the group-commit writer, which commits it; aborted if the
        block raises. Holds the gate shared (a map resize waits for it to end)."""
        self._gate.enter()
        try:
            txn = self._begin(write=True)
            try:
                yield txn
            except BaseException:
                txn.abort()
                raise
        finally:
            self._gate.leave()

    def _begin(self, write: bool) -> lmdb.Transaction:
        """Begin a transaction; adopt a map size grown by another process if LMDB asks (again,
        if it grew again meanwhile). Caller holds the gate shared."""
        for _ in range(RESIZE_RETRIES):
            try:
                return self.env.begin(write=write)
            except lmdb.MapResizedError:
                self._gate.leave()
                try:
                    with self._gate.exclusive():
                        self.env.set_mapsize(0)
                finally:
                    self._gate.enter()
        return self.env.begin(write=write)

    # ------------------------------------------------------------------ writing
    def submit(self, op: Callable[[Writer], T], wait: bool = False):
        """Queue ``op`` for the next group commit; returns a ``Pending`` whose ``result()``
        waits for the commit. ``wait``: the caller waits for it at once, so it may commit in
        the calling thread when the writer is idle (``GroupCommitWriter.write_now``). A store
        opened read-only is made writable first."""
        self._ready_to_write()
        return self._writer.write_now(op) if wait else self._writer.submit(op)

    def claim_commit(self) -> bool:
        """``GroupCommitWriter.claim``: True when the calling thread may commit next itself
        (``commit_claimed``), what others submit meanwhile queueing behind it."""
        self._ready_to_write()
        return self._writer.claim()

    def _ready_to_write(self) -> None:
        """Before a write is queued or claimed: the store is open and not a standby's, and a
        store opened read-only is made writable."""
        self.check_usable()
        self.check_writable()
        if self._env_readonly:
            self._make_writable()

    def commit_claimed(self, op: Callable[[Writer], T]):
        """Commit ``op`` in the calling thread, which claimed the commit (``claim_commit``)."""
        return self._writer.commit_claimed(op)

    def write(self, op: Callable[[Writer], T]) -> T:
        """Run ``op`` in a write transaction shared with concurrent writers; return after commit."""
        return self.submit(op, wait=True).result()

    def append_refusal(self, txn) -> str | None:
        """Why appends must stop now, or None: they stop while a reserve for acks cannot be kept,
        of the map at ``max_map_size`` or of the disk (``partq.storage.space``), so that acks,
        which must copy pages before they free any, can always run and drain a full store."""
        info = self.env.info()

        def live_pages() -> int:
            pages = 4  # meta pages, main and free trees
            for db in self.dbs.values():
                st = txn.stat(db)
                pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
            return pages

        return self.space.append_refusal(info["last_pgno"], info["map_size"],
                                         self.max_map_size, live_pages)

    def install_snapshot(self, snapshot_dir: str, keep_meta: dict[bytes, bytes | None]) -> None:
        """Replace this store's contents with the LMDB environment in ``snapshot_dir`` (a
        DR-standby bootstrapping), in one write transaction together with ``keep_meta``."""
        self.check_writable()
        with translated(snapshot_dir, Step.OPEN):
            env = lmdb.open(snapshot_dir, readonly=True, lock=False, max_dbs=len(DB_NAMES) + 2)
        try:
            with translated(snapshot_dir, Step.READ), env.begin() as src:
                names = {k.decode() for k, _ in src.cursor()}
                src_dbs = {name: env.open_db(name.encode(), txn=src, create=False)
                           for name in DB_NAMES if name in names}
                self.write(lambda w: w.load_snapshot(src, src_dbs, keep_meta))
        finally:
            env.close()

    def snapshot(self, directory: str) -> int:
        """Write a compact copy of the whole environment into ``directory`` (empty, existing),
        taken from one read transaction while writers go on; return the LSN it holds (a
        DR-standby continues from there)."""
        with self.read_transaction() as txn, translated(self.path, Step.SNAPSHOT):
            raw = txn.get(b"lsn", db=self.dbs["meta"])
            self.env.copy(directory, compact=True, txn=txn)
        return 0 if raw is None else unpack_u64(raw)

    def version(self) -> int:
        """A number that changes with every commit of any process: compare two readings to
        know, cheaply, whether anything was written between. It is the id of the commit a read
        begun now sees, not LMDB's env info, which names a commit as soon as its meta page is
        written, before new readers are pointed at it (with a synchronous meta write, for the
        whole flush): a caller that read "nothing new up to version V" would then skip commit
        V until the next one."""
        self._gate.enter()
        try:
            txn = self._begin(write=False)
            try:
                return txn.id()
            finally:
                txn.abort()
        finally:
            self._gate.leave()

    def usage(self) -> dict:
        """Sizes of the store: ``file_size`` (data.mdb on disk), ``high_water`` (bytes of the file
        ever used: LMDB reuses freed pages, the file never shrinks), ``live`` (bytes of pages the
        data needs now), ``map_size``, the reader slots in use, ``disk_full`` (appends are
        refused: the disk cannot give data.mdb its reserve for acks: ``Space.disk_full``), and
        ``writer_stopped_pid``: a process stopped (SIGSTOP, a debugger) while it holds LMDB's
        write lock, for which every writer of the store waits, or None."""
        self.check_usable()
        info, psize = self._info(), self._psize
        with self.read() as r:
            pages = 4 + sum(st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
                            for st in (r.db_stat(name) for name in DB_NAMES))
        size = os.path.getsize(os.path.join(self.path, "data.mdb"))
        return {"file_size": size,
                "high_water": (info["last_pgno"] + 1) * psize, "live": pages * psize,
                "map_size": info["map_size"], "readers": info["num_readers"],
                "max_readers": info["max_readers"],
                "disk_full": self.space.disk_full(size, pages * psize),
                "writer_stopped_pid": stopped_writer(self.path, self._lock_file)}

    def reserve(self, nbytes: int) -> None:
        """Grow the map ahead of one large write (it is address space, not disk), so the group
        commit does not run the write, hit MapFull, grow and run it all again."""
        self.check_usable()
        self.check_writable()
        psize = self._psize
        while True:
            info = self._info()
            free = info["map_size"] - (info["last_pgno"] + 1) * psize
            if free >= nbytes or info["map_size"] >= self.max_map_size:
                return
            self.grow_map()

    def grow_map(self) -> None:
        """Double the map (called by the writer after MapFull). Raises StorageFull at the limit."""
        current = self._info()["map_size"]
        if current >= self.max_map_size:
            with self.read() as r:
                note = change_log_note(r)
            raise StorageFull(f"{self.path} reached max_map_size={self.max_map_size} bytes; open the "
                              f"broker with a larger max_map_size, or ack and drain messages{note}")
        with self._gate.exclusive(), translated(self.path, Step.WRITE):
            self.env.set_mapsize(min(current * 2, self.max_map_size))

    # ------------------------------------------------------------------ lifecycle
    def in_owner_process(self) -> bool:
        """False in a forked child of the process that opened the store."""
        return self._pid == this_pid()

    def check_usable(self) -> None:
        """Raise ``UsedAcrossFork`` in a forked child and ``BrokerClosed`` once closed."""
        if self._pid != this_pid():
            raise UsedAcrossFork(_fork_message(self.path, self._pid))
        if self._closed:
            raise BrokerClosed(f"the store at {self.path} is closed; open it again")

    def check_writable(self) -> None:
        """Raise ``OpenedReadOnly`` when this store refuses writes (a ``ReadOnlyStore``)."""

    def _flush_loop(self) -> None:
        while not self._stop_flushing.wait(ASYNC_FLUSH_INTERVAL):
            self._gate.enter()
            try:
                if not self._closed and not self._env_readonly:
                    with translated(self.path, Step.FLUSH):
                        self.env.sync(True)
            except PartqError:
                pass      # the next commit, or sync(), reports a failing disk
            finally:
                self._gate.leave()

    def sync(self) -> None:
        """Flush everything to disk now (meaningful in async mode)."""
        self.check_usable()
        self._gate.enter()
        try:
            if not self._env_readonly:       # nothing written here to flush
                with translated(self.path, Step.FLUSH):
                    self.env.sync(True)
        finally:
            self._gate.leave()

    def close(self) -> None:
        if self._pid != this_pid():
            return  # a forked child must not touch the parent's environment
        with _registry_lock:
            if self._closed:
                return
            self._refs -= 1
            if self._refs > 0:
                return
            self._writer.stop()
            self._stop_flushing.set()
            self._closed = True
            if _registry.get(self.path) is self:
                del _registry[self.path]
        with self._gate.exclusive():
            self.env.close()
        self._lock_file.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _fork_message(path: str, parent: int) -> str:
    return (f"{path} was opened by process {parent}, and this process ({os.getpid()}) is a fork "
            f"of it: LMDB environments cannot be used or opened again in a forked child. Open the "
            f"store only after forking, or start children with multiprocessing's 'spawn' method")
