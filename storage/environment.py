"""Opening one directory's LMDB environment: its files and modes, its databases, the format
stamp, and the checks that turn a damaged or foreign file into a one-line error.

``Store`` calls these while it opens (and when it reopens a read-only environment for
writing); nothing here keeps state beyond the ``OpenReport`` it fills.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import lmdb

from partq.storage.encoding import FORMAT_STAMP, FORMAT_VERSION
from partq.storage.errors import CorruptStore, FormatVersionMismatch, InvalidConfig, NotAPartqStore
from partq.storage.files import chmod_own
from partq.storage.txn import DB_NAMES

RESIZE_RETRIES = 100                 # adopting a map grown by another process, before giving up


class OpenReport:
    """What opening did, for ``partq`` to print (STYLE point 6)."""

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

    def open_env(self, map_size: int, readonly: bool = False) -> lmdb.Environment:
        for attempt in range(RESIZE_RETRIES):
            try:
                fresh = not os.path.exists(os.path.join(self.path, "data.mdb"))
                env = lmdb.open(self.path, map_size=map_size, max_dbs=len(DB_NAMES) + 2,
                                subdir=True, sync=self.sync, metasync=True,
                                max_readers=1024, lock=True, create=not readonly,
                                readonly=readonly, mode=self.file_mode)
                if fresh:     # LMDB applies the umask to ``mode``: set it exactly
                    for name in ("data.mdb", "lock.mdb"):
                        chmod_own(os.path.join(self.path, name), self.file_mode)
                break
            except lmdb.MapResizedError:
                # another process grew the map between LMDB's open and its first transaction
                # (py-lmdb begins one inside open): open again, which adopts the new size
                if attempt == RESIZE_RETRIES - 1:
                    raise CorruptStore(f"cannot open {self.path}: another process keeps growing "
                                       f"its map; retry") from None
            except lmdb.Error as exc:
                self._refuse_open(exc)
        return self._check_env(env)

    def open_dbs(self, env: lmdb.Environment) -> dict[str, Any]:
        """The databases of an environment a complete store opened before (no write)."""
        return {name: env.open_db(name.encode(), create=False) for name in DB_NAMES}

    def existing_dbs(self, env: lmdb.Environment) -> dict[str, Any] | None:
        """The databases of a complete store, in a readonly environment; None when a database or
        the format stamp is missing (a creation cut short: the caller finishes it)."""
        if not all(name.encode() in self._main_keys(env) for name in DB_NAMES):
            return None
        try:
            dbs = self.open_dbs(env)
            with begin_adopting(env) as txn:
                stamp = txn.get(b"format", db=dbs["meta"])
        except lmdb.Error as exc:
            raise CorruptStore(f"cannot read {self.path}: {exc}") from None
        if stamp is None:
            return None
        self._check_stamp(bytes(stamp))
        return dbs

    def create_dbs(self, env: lmdb.Environment) -> dict[str, Any]:
        """Create (or finish creating) the store's databases and format stamp."""
        self._main_keys(env)
        dbs: dict[str, Any] = {}
        try:
            with begin_adopting(env, write=True) as txn:
                for name in DB_NAMES:
                    dbs[name] = env.open_db(name.encode(), txn=txn, create=True)
                stamp = txn.get(b"format", db=dbs["meta"])
                if stamp is None:
                    txn.put(b"format", FORMAT_STAMP, db=dbs["meta"])
                    self.report.created = True
                else:
                    self._check_stamp(bytes(stamp))
        except lmdb.Error as exc:
            raise CorruptStore(f"cannot read {self.path}: {exc}") from None
        return dbs

    def _refuse_open(self, exc: lmdb.Error):
        if "already open in this process" in str(exc):
            raise InvalidConfig(f"{self.path} is already open in this process through another "
                                f"path or link; open it once and share the Broker") from None
        if not isinstance(exc, lmdb.InvalidError):
            raise CorruptStore(f"cannot open {self.path}: {exc}") from None
        raise CorruptStore(f"{self.path}/data.mdb is not a readable LMDB file (damaged or not "
                           f"partq's); restore it from a DR-standby or backup") from None

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
        try:
            with begin_adopting(env) as txn:
                keys = [bytes(k) for k, _ in txn.cursor()]
        except lmdb.Error as exc:
            raise CorruptStore(f"cannot read {self.path}: {exc}") from None
        if keys and b"meta" not in keys:
            raise NotAPartqStore(f"{self.path} holds an LMDB environment that is not a partq store; "
                                 f"pass a new or empty directory")
        return keys

    def _check_stamp(self, stamp: bytes) -> None:
        if stamp != FORMAT_STAMP:
            raise FormatVersionMismatch(
                f"{self.path} was written in on-disk format {stamp.decode(errors='replace')!r}; "
                f"this partq reads format {FORMAT_VERSION}: open it with the partq version "
                f"that wrote it, or export it with that version's `partq copy-out`")


def begin_adopting(env: lmdb.Environment, write: bool = False) -> lmdb.Transaction:
    """A transaction of an environment no other thread uses yet (opening): adopt a map size
    another process grew meanwhile, as ``Store._begin`` does for an open store."""
    for _ in range(RESIZE_RETRIES):
        try:
            return env.begin(write=write)
        except lmdb.MapResizedError:
            env.set_mapsize(0)
    return env.begin(write=write)
