"""LMDB's failures in partq's words: the one place an lmdb exception becomes a partq error.

As py-lmdb turns LMDB's return codes into exception classes through one table, this module
turns those classes into partq's errors through one table, ``BY_CLASS``, and the operating
system's error numbers LMDB passes on (``lmdb.Error`` with that ``code``) through another,
``BY_ERRNO``. Each entry gives the partq error class, what the condition means for a store, and
what to do next; the message also quotes LMDB's own words. Code that calls LMDB wraps the call
in ``translated(path, step)`` (or passes a caught exception to ``translate``).

Two lmdb exceptions are not failures and are handled where they happen, never here:
``MapResizedError`` (another process grew the map: adopt its size and begin again) and
``MapFullError`` inside a group commit (grow the map and run the batch again). Only when
retrying gives up do they reach this table.
"""
from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import NamedTuple

import lmdb

from partq.storage.errors import (
    AccessDenied,
    CorruptStore,
    FormatVersionMismatch,
    InvalidConfig,
    NotAPartqStore,
    PartqError,
    StorageFull,
    StoreBusy,
    UsedAcrossFork,
)


class Step(Enum):
    """What partq was doing when LMDB failed: the start of the message."""
    OPEN = "cannot open"
    READ = "cannot read"
    WRITE = "cannot write to"
    SNAPSHOT = "cannot take a snapshot of"
    FLUSH = "cannot flush"


class Translation(NamedTuple):
    error: type[PartqError]
    meaning: str          # what the condition means for the store
    hint: str             # what to do next


RESTORE = "restore it from a DR-standby or backup"
VERIFY = f"run `partq verify`, and {RESTORE} if it is damaged"
NOT_WRITABLE = ("run as a user who may write it, or read it without writing "
                "(`partq --read-only`, partq.ops.read_only)")
FREE_SPACE = "free space on that disk, then retry; nothing of the failed write was kept"

BY_CLASS: dict[type[lmdb.Error], Translation] = {
    lmdb.MapFullError: Translation(
        StorageFull, "its map is full",
        "open it with a larger max_map_size, or ack and drain messages"),
    lmdb.DiskError: Translation(StorageFull, "the disk holding it is full", FREE_SPACE),
    lmdb.CorruptedError: Translation(CorruptStore, "a page of data.mdb is damaged", VERIFY),
    lmdb.PageNotFoundError: Translation(
        CorruptStore, "data.mdb refers to a page it does not hold", VERIFY),
    lmdb.PanicError: Translation(
        CorruptStore, "LMDB could not update data.mdb's meta page (a failed disk?)",
        f"check the disk, then {VERIFY}"),
    lmdb.InvalidError: Translation(
        CorruptStore, "data.mdb is not a readable LMDB file: damaged, or not partq's", RESTORE),
    lmdb.VersionMismatchError: Translation(
        FormatVersionMismatch, "it was written by an LMDB of another version",
        "open it with the partq version that wrote it, or export it with that version's "
        "`partq copy-out`"),
    lmdb.ReadersFullError: Translation(
        StoreBusy, "every LMDB reader slot is taken (too many processes and threads read it)",
        "end some readers, then retry; slots of dead processes are freed by the next open"),
    lmdb.MapResizedError: Translation(
        StoreBusy, "another process keeps growing its map", "retry"),
    lmdb.LockError: Translation(StoreBusy, "another process holds its lock", "retry"),
    lmdb.BadRslotError: Translation(
        UsedAcrossFork, "a transaction's reader slot belongs to another thread or process",
        "open the store only after forking, and end each read in the thread that began it"),
    lmdb.ReadonlyError: Translation(AccessDenied, "this user may not use its files", NOT_WRITABLE),
    lmdb.MemoryError: Translation(
        InvalidConfig, "there is not enough memory or address space to map it",
        "open it with a smaller map_size and max_map_size, or raise the process's limits"),
}

BY_ERRNO: dict[int, Translation] = {
    errno.ENOSPC: Translation(StorageFull, "the disk holding it is full", FREE_SPACE),
    errno.EDQUOT: Translation(StorageFull, "this user's disk quota is used up",
                              "free space or raise the quota, then retry"),
    errno.EFBIG: Translation(StorageFull, "data.mdb reached the largest file its file system "
                             "allows", "move the store to another file system"),
    errno.EACCES: Translation(AccessDenied, "this user may not use its files", NOT_WRITABLE),
    errno.EPERM: Translation(AccessDenied, "this user may not use its files", NOT_WRITABLE),
    errno.EROFS: Translation(AccessDenied, "it is on a read-only file system",
                             "read it without writing (`partq --read-only`, "
                             "partq.ops.read_only), or copy it to a writable file system"),
    errno.ENOENT: Translation(NotAPartqStore, "its files are missing",
                              "check the path; create a store with `partq init`"),
    errno.EIO: Translation(CorruptStore, "the disk reported an I/O error",
                           f"check the disk, then {VERIFY}"),
}

# py-lmdb refuses, before LMDB runs, to open files an environment of this process has open
ALREADY_OPEN = Translation(
    InvalidConfig, "it is already open in this process (through another path or link, or "
    "outside partq)", "open it once and share the Broker or Store")
OTHER = Translation(CorruptStore, "LMDB failed", VERIFY)


# LMDB reports a short write as EIO: on a disk this nearly full, that is a full disk
FULL_DISK_BELOW = 1 << 20
WRITE_FULL = Translation(StorageFull, "the disk holding it is full (LMDB could write only part "
                         "of a commit)", FREE_SPACE)


def disk_nearly_full(path: str) -> bool:
    """Whether the file system holding ``path`` has less than ``FULL_DISK_BELOW`` bytes left."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_DISK_BELOW


def translation_of(exc: lmdb.Error, step: Step, path: str = "") -> Translation:
    """The entry for ``exc``: by its class, else by the error number it carries."""
    for cls in type(exc).__mro__:
        if cls in BY_CLASS:
            return BY_CLASS[cls]
    code = getattr(exc, "code", 0) or 0
    if code == errno.EIO and step in (Step.WRITE, Step.FLUSH) and path \
            and disk_nearly_full(path):
        return WRITE_FULL
    if code in BY_ERRNO:
        return BY_ERRNO[code]
    if code == 0 and step is Step.OPEN:
        return ALREADY_OPEN
    return OTHER


def translate(exc: BaseException, path: str, step: Step) -> BaseException:
    """``exc`` as a partq error when it is an lmdb exception (raised while doing ``step`` to
    the store or file at ``path``); any other exception as it is."""
    if not isinstance(exc, lmdb.Error):
        return exc
    entry = translation_of(exc, step, path)
    return entry.error(f"{step.value} {path}: {entry.meaning} (LMDB: {exc}); {entry.hint}")


@contextmanager
def translated(path: str, step: Step) -> Iterator[None]:
    """Run the block; an lmdb exception it raises leaves as its partq error."""
    try:
        yield
    except lmdb.Error as exc:
        raise translate(exc, path, step) from None
