"""The disk space a store's files need before LMDB maps them, and undoing a creation that the
disk cut short.

LMDB keeps its table of readers in ``lock.mdb``, which it sizes with ``ftruncate`` (a sparse
file: no block of the disk is taken) and then writes through a shared memory map. On a full disk
the first write to a page of that map has nowhere to go, and the kernel ends the process with
SIGBUS: no error, no message, and a sparse ``lock.mdb`` left behind that does the same to the
next process. So every open that uses LMDB's lock allocates ``lock.mdb`` for real first
(``posix_fallocate``), and a disk without room for it is a ``StorageFull`` that says how much is
needed. ``data.mdb`` needs no such care: LMDB writes it with ``pwrite``, which fails with an
error on a full disk, and ``partq.storage.space`` keeps its reserve for acks allocated.

A creation that fails for want of space leaves a ``data.mdb`` without a single commit (its two
meta pages, or part of them), which later opens would take for a store or for a damaged file:
``discard_unborn`` removes it, while no process has the environment open.
"""
from __future__ import annotations

import errno
import fcntl
import os
import struct

from partq.storage.errors import StorageFull
from partq.storage.files import chmod_own

MAX_READERS = 1024              # LMDB reader slots (threads and processes reading at once)
# LMDB's lock file: a 192-byte header that holds the first reader slot, then 64 bytes a slot
LOCK_FILE_SIZE = 192 + (MAX_READERS - 1) * 64
NEW_DATA_FILE = 64 << 10        # data.mdb of a new store: its meta pages and first commit
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_MAGIC = 0xBEEFC0DE             # an LMDB meta page: magic at offset 16, transaction id at 160
_META_TXNID = struct.Struct("<I140xQ")


def free_bytes(path: str) -> int | None:
    """Bytes this user may still write to the file system holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def new_store_bytes() -> int:
    """The disk a new store takes before its first message: lock.mdb and data.mdb's first
    pages."""
    return LOCK_FILE_SIZE + NEW_DATA_FILE


def allocate_lock_file(path: str, mode: int) -> None:
    """Create ``lock.mdb`` if it is missing and allocate it whole on disk, so that LMDB's
    writes through its map always land; ``StorageFull`` when the disk has no room (a
    ``lock.mdb`` this call created is removed again). Any other failure is left to LMDB's own
    open, which reports it in its words.

    It allocates only while no process has the store open (it holds the lock an open
    environment holds, exclusively, meanwhile): where the file system cannot allocate, the C
    library writes a zero byte into each block instead, which must not race a reader slot
    being written. A store open elsewhere has its lock.mdb allocated already by whoever
    created it. Call it only while this process has no environment of the store open: closing
    the file drops this process's locks on it."""
    lock = os.path.join(path, "lock.mdb")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
        created = True
    except FileExistsError:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return
        created = False
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise _lock_full(path) from None
        return
    try:
        if created:
            chmod_own(lock, mode)
        st = os.fstat(fd)
        size = max(LOCK_FILE_SIZE, st.st_size)
        if st.st_blocks * 512 >= size or not _alone(fd):
            return
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                return          # a file system that cannot allocate: as before
            if created:
                os.unlink(lock)
            raise _lock_full(path) from None
    finally:
        os.close(fd)            # releases the lock ``_alone`` took


def _alone(fd: int) -> bool:
    """Take the lock every open LMDB environment holds on lock.mdb (its first byte),
    exclusively, without waiting: True when no process has the store open (and none can open
    it until ``fd`` is closed)."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        return False
    return True


def _lock_full(path: str) -> StorageFull:
    free = free_bytes(path)
    return StorageFull(
        f"cannot open {path}: the disk holding it is full: lock.mdb needs {LOCK_FILE_SIZE} "
        f"bytes allocated" + ("" if free is None else f" and {free} are free")
        + "; free space on that disk, then retry (nothing was written)")


def creation_full(path: str) -> StorageFull:
    """The error of a creation the disk had no room for, saying how much a new store needs."""
    free = free_bytes(path)
    return StorageFull(
        f"cannot create a partq store in {path}: the disk holding it is full: a new store "
        f"needs about {new_store_bytes() >> 10} KiB (lock.mdb {LOCK_FILE_SIZE} bytes, data.mdb "
        f"{NEW_DATA_FILE >> 10} KiB)" + ("" if free is None else f" and {free} bytes are free")
        + ", and 8 MiB more before it takes messages; free space on that disk, then retry "
        "(no data.mdb was left behind: the directory is as good as new)")


def discard_unborn(path: str) -> bool:
    """Remove ``data.mdb`` when it holds no commit (a creation cut short: both meta pages of
    transaction 0, or less than both) and no process has the environment open; True if it
    was removed. A process opening the store takes the lock of ``_alone`` before it reads
    ``data.mdb``: holding it exclusively keeps every other process out while the file goes.
    Only while this process has no environment of the store open (see
    ``allocate_lock_file``)."""
    data = os.path.join(path, "data.mdb")
    try:
        fd = os.open(os.path.join(path, "lock.mdb"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not _alone(fd) or not _unborn(data):
            return False
        os.unlink(data)
        return True
    finally:
        os.close(fd)            # releases the lock


def _unborn(data: str) -> bool:
    """Whether ``data.mdb`` is LMDB's and holds no commit: empty, or meta pages of
    transaction 0 only (all of them LMDB managed to write)."""
    try:
        with open(data, "rb") as f:
            raw = f.read(2 * 65536 + 1)
    except OSError:
        return False
    if not raw:
        return True
    if len(raw) > 2 * 65536 or len(raw) < _META_TXNID.size + 16:
        return False
    psize = int.from_bytes(raw[40:44], "little")    # the free list's record keeps it
    for at in (0, psize) if psize and len(raw) >= psize + 16 + _META_TXNID.size else (0,):
        magic, txnid = _META_TXNID.unpack_from(raw, at + 16)
        if magic != _MAGIC or txnid != 0:
            return False
    return True
