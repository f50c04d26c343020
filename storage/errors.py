"""The errors of the storage layer, and the root of every error partq raises on purpose.

``PartqError`` is defined here, in the lowest layer, so that storage stands alone and a user
still catches every partq error with one class; ``partq.errors`` re-exports all of these under
the same names. This layer is the one place lmdb exceptions are translated (``store`` and
``group_commit``); each message says what to do next.
"""
from __future__ import annotations

__all__ = ["PartqError", "NotAPartqStore", "FormatVersionMismatch", "CorruptStore", "CorruptRecord",
           "StorageFull", "UsedAcrossFork", "BrokerClosed", "InvalidConfig", "Diverged"]

PARENT = 0xFFFFFFFF     # the parent queue's log (``partq.storage.encoding.PARENT``)


class PartqError(Exception):
    """Base class of every error partq raises deliberately."""


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


class StorageFull(PartqError):
    """The LMDB map reached ``max_map_size`` or the disk is full; the failed write left nothing."""


class UsedAcrossFork(PartqError):
    """A Broker or Store opened in a parent process was used in a forked child."""


class BrokerClosed(PartqError):
    """The broker (or the store under it) was closed; open it again."""


class InvalidConfig(PartqError, ValueError):
    """An option is out of range or of the wrong type."""


class Diverged(PartqError):
    """A DR-standby's store no longer matches its primary's history: it must be bootstrapped
    again from a snapshot."""
