"""The errors of the storage layer, and the root of every error partq raises on purpose.

``PartqError`` is defined here, in the lowest layer, so that storage stands alone and a user
still catches every partq error with one class; ``partq.errors`` re-exports all of these under
the same names. This layer is where lmdb exceptions become these errors, all through the one
table in ``partq.storage.lmdb_errors``; each message says what to do next.
"""
from __future__ import annotations

__all__ = ["PartqError", "NotAPartqStore", "FormatVersionMismatch", "CorruptStore", "CorruptRecord",
           "StorageFull", "UsedAcrossFork", "BrokerClosed", "InvalidConfig", "Diverged",
           "UnsafeDirectory", "AccessDenied", "StoreBusy", "OpenedReadOnly", "TornRead",
           "Superseded"]

PARENT = 0xFFFFFFFF     # the parent queue's log (``partq.storage.encoding.PARENT``)


class PartqError(Exception):
    """Base class of every error partq raises deliberately."""

    def to_frame(self) -> dict:
        """The error as it crosses a socket: ``{"error": class name, "message": its text}`` and
        the fields its constructor takes (the classes that have some add them). The other side
        rebuilds it with ``partq.wire.error_frames.error_from_frame``."""
        return {"error": type(self).__name__, "message": str(self)}


class NotAPartqStore(PartqError):
    """The directory exists but holds something other than a partq store."""


class FormatVersionMismatch(PartqError):
    """The store was written by a partq with an incompatible on-disk format."""


class CorruptStore(PartqError):
    """The LMDB environment itself cannot be read (damaged file, wrong file)."""


class CorruptRecord(PartqError):
    """A stored record failed its crc32c check or could not be decoded."""

    def __init__(self, queue: str, partition: int, seq: int, reason: str):
        self.queue, self.partition, self.seq, self.reason = queue, partition, seq, reason
        where = "parent queue" if partition == PARENT else f"partition {partition}"
        super().__init__(
            f"corrupt record in queue {queue!r} {where} seq {seq}: {reason}; "
            f"run `partq verify` to list damaged records, and bind with skip_corrupt=True "
            f"to deliver past them"
        )

    def to_frame(self) -> dict:
        return {**super().to_frame(), "queue": self.queue, "partition": self.partition,
                "seq": self.seq, "reason": self.reason}


class StorageFull(PartqError):
    """The LMDB map reached ``max_map_size`` or the disk is full; the failed write left nothing."""


class UsedAcrossFork(PartqError):
    """A Broker or Store opened in a parent process was used in a forked child."""


class BrokerClosed(PartqError):
    """The broker (or the store under it) was closed; open it again."""


class UnsafeDirectory(PartqError):
    """The store directory could be changed by another user (owned by someone else, writable by
    group or others) or holds a link where partq keeps its files; nothing was opened."""


class InvalidConfig(PartqError, ValueError):
    """An option is out of range or of the wrong type."""


class Diverged(PartqError):
    """A DR-standby's store no longer matches its primary's history: it must be bootstrapped
    again from a snapshot."""


class Superseded(PartqError):
    """This directory was a DR primary, and a standby of it has been promoted since (it told
    this primary so): it refuses every write a standby would copy (publishes, acks, binds, queue
    changes), so the two never both take writes. Its clients belong on the new primary."""


class AccessDenied(PartqError):
    """This user may not read or write the store's files, or they are on a read-only file
    system; nothing was changed. Reading without writing is ``partq.storage.read_only_store``."""


class StoreBusy(PartqError):
    """The store could not be used just now (every LMDB reader slot taken, its map growing
    under this open again and again, its lock held): nothing was changed; retry."""


class OpenedReadOnly(PartqError):
    """The directory was opened for reading only (``partq.storage.read_only_store``: a user who
    may not write it, or ``--read-only``): publishes, binds and changes are refused."""


class TornRead(PartqError):
    """A read without LMDB's reader lock (``partq.storage.read_only_store``) saw a writer reuse
    the pages it was reading, and retrying did not give a consistent answer. Nothing was
    changed; run it again, or read as a user who may write the directory."""
