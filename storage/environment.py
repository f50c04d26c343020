"""Opening one directory's LMDB environment: its files and modes, its databases, the format
stamp, and the checks that turn a damaged or foreign file into a one-line error (LMDB's own
failures through ``partq.storage.lmdb_errors``).

``Store`` calls these while it opens (and when it reopens a read-only environment for
writing), ``ReadOnlyStore`` to open one without writing anything; nothing here keeps state
beyond the ``OpenReport`` it fills.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import lmdb

from partq.storage.allocation import MAX_READERS, allocate_lock_file, creation_full, discard_unborn
from partq.storage.encoding import FORMAT_STAMP, FORMAT_VERSION, READABLE_STAMPS
from partq.storage.errors import CorruptStore, FormatVersionMismatch, NotAPartqStore, StorageFull
from partq.storage.files import chmod_own
from partq.storage.lmdb_errors import Step, translated
from partq.storage.txn import DB_NAMES
from partq.storage.writelock import stuck_writer

RESIZE_RETRIES = 100                 # adopting a map grown by another process, before giving up


class OpenReport:
    """What opening did (recovery returns a report), for ``partq`` to print."""

    def __init__(self) -> None:
        self.created = False
        self.stale_readers_cleared = 0
        self.write_lock_holder: int | None = None   # pid inside a commit when this opened

    def as_dict(self) -> dict:
        out = {"created": self.created, "stale_readers_cleared": self.stale_readers_cleared}
        if self.write_lock_holder is not None:
            out["write_lock_holder"] = self.write_lock_holder
        return out


@dataclass
class Opening:
    """One directory being opened: where, how, and what it found."""
    path: str
    sync: bool
    file_mode: int
    report: OpenReport = field(default_factory=OpenReport)

    def open_store(self, map_size: int) -> tuple[lmdb.Environment, dict[str, Any], bool]:
        """The environment of the store, its databases, and whether the environment is LMDB's
        readonly one: it is when another process is stuck inside a commit (no write lock is
        taken, so that process holds up no open); writable otherwise, and to create the store
        (or finish a creation cut short). A creation the disk has no room for leaves no
        ``data.mdb`` behind (``allocation.discard_unborn``) and raises ``StorageFull`` saying
        how much a new store needs."""
        if os.path.exists(os.path.join(self.path, "data.mdb")):
            return self._open_store(map_size)
        try:
            return self._open_store(map_size)
        except StorageFull as exc:
            discard_unborn(self.path)
            raise creation_full(self.path) from exc
        except BaseException:
            discard_unborn(self.path)
            raise

    def _open_store(self, map_size: int) -> tuple[lmdb.Environment, dict[str, Any], bool]:
        holder = None
        if os.path.exists(os.path.join(self.path, "data.mdb")):
            holder = stuck_writer(self.path)
        if holder is not None:
            self.report.write_lock_holder = holder
            env = self.open_env(map_size, readonly=True)
            try:
                dbs = self.existing_dbs(env)
            except BaseException:
                env.close()
                raise
            if dbs is not None:
                return env, dbs, True
            env.close()
        env = self.open_env(map_size, readonly=False)
        try:
            return env, self.create_dbs(env), False
        except BaseException:
            env.close()
            raise

    def open_env(self, map_size: int, readonly: bool = False) -> lmdb.Environment:
        with translated(self.path, Step.OPEN):
            for _ in range(RESIZE_RETRIES - 1):
                try:
                    return self._check_env(self._open_once(map_size, readonly))
                except lmdb.MapResizedError:
                    # another process grew the map between LMDB's open and its first
                    # transaction (py-lmdb begins one inside open): open again, which adopts
                    # the new size
                    continue
            return self._check_env(self._open_once(map_size, readonly))

    def _open_once(self, map_size: int, readonly: bool) -> lmdb.Environment:
        fresh = not os.path.exists(os.path.join(self.path, "data.mdb"))
        allocate_lock_file(self.path, self.file_mode)
        env = lmdb.open(self.path, map_size=map_size, max_dbs=len(DB_NAMES) + 2, subdir=True,
                        sync=self.sync, metasync=True, max_readers=MAX_READERS, lock=True,
                        create=not readonly, readonly=readonly, mode=self.file_mode)
        if fresh:     # LMDB applies the umask to ``mode``: set it exactly
            for name in ("data.mdb", "lock.mdb"):
                chmod_own(os.path.join(self.path, name), self.file_mode)
        return env

    def open_lock_free(self) -> tuple[lmdb.Environment, dict[str, Any]]:
        """The environment and databases of a complete store, opened with LMDB's
        ``readonly=True, lock=False``: nothing is written, not even a reader slot in
        ``lock.mdb`` (``ReadOnlyStore`` checks its reads instead). The map size is the one the
        store's writers set (in its meta page)."""
        with translated(self.path, Step.OPEN):
            env = self._check_env(lmdb.open(self.path, readonly=True, lock=False, subdir=True,
                                            create=False, max_dbs=len(DB_NAMES) + 2, map_size=0))
        try:
            dbs = self.existing_dbs(env)
        except BaseException:
            env.close()
            raise
        if dbs is None:
            env.close()
            raise NotAPartqStore(f"{self.path} holds no complete partq store yet; create it with "
                                 f"`partq --data {self.path} init` as a user who may write it")
        return env, dbs

    def open_dbs(self, env: lmdb.Environment) -> dict[str, Any]:
        """The databases of an environment a complete store opened before (no write)."""
        with translated(self.path, Step.OPEN):
            return {name: env.open_db(name.encode(), create=False) for name in DB_NAMES}

    def existing_dbs(self, env: lmdb.Environment) -> dict[str, Any] | None:
        """The databases of a complete store, in a readonly environment; None when a database or
        the format stamp is missing (a creation cut short: the caller finishes it)."""
        if not all(name.encode() in self._main_keys(env) for name in DB_NAMES):
            return None
        with translated(self.path, Step.READ):
            dbs = self.open_dbs(env)
            with begin_adopting(env) as txn:
                stamp = txn.get(b"format", db=dbs["meta"])
        if stamp is None:
            return None
        self._check_stamp(bytes(stamp))
        return dbs

    def create_dbs(self, env: lmdb.Environment) -> dict[str, Any]:
        """Create (or finish creating) the store's databases and format stamp."""
        self._main_keys(env)
        dbs: dict[str, Any] = {}
        with translated(self.path, Step.WRITE):
            with begin_adopting(env, write=True) as txn:
                for name in DB_NAMES:
                    dbs[name] = env.open_db(name.encode(), txn=txn, create=True)
                stamp = txn.get(b"format", db=dbs["meta"])
                if stamp is None:
                    txn.put(b"format", FORMAT_STAMP, db=dbs["meta"])
                    self.report.created = True
                else:
                    self._check_stamp(bytes(stamp))
                    if bytes(stamp) != FORMAT_STAMP:
                        txn.put(b"format", FORMAT_STAMP, db=dbs["meta"])    # upgraded
        return dbs

    def stamp_current(self, env: lmdb.Environment, dbs: dict[str, Any]) -> None:
        """Before the first write of this process to a store of an older format it reads:
        stamp it with the current format (what it writes from now on, the older partq that
        wrote it would misread)."""
        with translated(self.path, Step.WRITE):
            with begin_adopting(env, write=True) as txn:
                stamp = txn.get(b"format", db=dbs["meta"])
                if stamp is not None and bytes(stamp) != FORMAT_STAMP:
                    self._check_stamp(bytes(stamp))
                    txn.put(b"format", FORMAT_STAMP, db=dbs["meta"])

    def _check_env(self, env: lmdb.Environment) -> lmdb.Environment:
        info, psize = env.info(), env.stat()["psize"]
        needed = (info["last_pgno"] + 1) * psize
        size = os.path.getsize(os.path.join(self.path, "data.mdb"))
        if size < needed:
            env.close()
            raise CorruptStore(f"{self.path}/data.mdb is {size} bytes but its meta page says "
                               f"{needed} are in use: the file was truncated (an interrupted copy "
                               f"or a full disk); restore it from a DR-standby or backup")
        self.report.stale_readers_cleared += env.reader_check()
        return env

    def _main_keys(self, env: lmdb.Environment) -> list[bytes]:
        with translated(self.path, Step.READ):
            with begin_adopting(env) as txn:
                keys = [bytes(k) for k, _ in txn.cursor()]
        if keys and b"meta" not in keys:
            raise NotAPartqStore(f"{self.path} holds an LMDB environment that is not a partq store; "
                                 f"pass a new or empty directory")
        return keys

    def _check_stamp(self, stamp: bytes) -> None:
        if stamp not in READABLE_STAMPS:
            raise FormatVersionMismatch(
                f"{self.path} was written in on-disk format {stamp.decode(errors='replace')!r}; "
                f"this partq reads format {FORMAT_VERSION} (and 2): open it with the partq "
                f"version that wrote it, or export it with that version's `partq copy-out`")


def begin_adopting(env: lmdb.Environment, write: bool = False) -> lmdb.Transaction:
    """A transaction of an environment no other thread uses yet (opening): adopt a map size
    another process grew meanwhile, as ``Store._begin`` does for an open store."""
    for _ in range(RESIZE_RETRIES):
        try:
            return env.begin(write=write)
        except lmdb.MapResizedError:
            env.set_mapsize(0)
    return env.begin(write=write)
