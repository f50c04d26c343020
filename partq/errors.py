"""Every error partq raises on purpose. Each message says what to do next.

The CLI turns any ``PartqError`` into one line and exit status 1; library users catch the
specific classes. Nothing else in the package raises bare lmdb or msgpack exceptions: the storage
layer translates them in one place (``partq.storage.store``).
"""
from __future__ import annotations

__all__ = ["PartqError", "NotAPartqStore", "FormatVersionMismatch", "CorruptStore", "CorruptRecord", "StorageFull", "UsedAcrossFork", "QueueNotFound", "QueueExists", "InvalidConfig", "InvalidMessage", "IngressDisabled", "DeliveryLocked", "FlowClosed", "BrokerClosed", "StandbyReadOnly", "ScalingStepFailed", "ScalingInterrupted"]


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
        where = "parent queue" if partition == 0xFFFFFFFF else f"partition {partition}"  # PARENT
        super().__init__(
            f"corrupt record in queue {queue!r} {where} seq {seq}: {reason}; "
            f"run `partq verify` to list damaged records, and bind with skip_corrupt=True "
            f"to deliver past them"
        )


class StorageFull(PartqError):
    """The LMDB map reached ``max_map_size`` or the disk is full; the failed write left nothing."""


class UsedAcrossFork(PartqError):
    """A Broker or Store opened in a parent process was used in a forked child."""


class QueueNotFound(PartqError):
    """No queue of that name exists."""


class QueueExists(PartqError):
    """``create_queue`` was given the name of an existing queue."""


class InvalidConfig(PartqError, ValueError):
    """A queue or broker option is out of range or of the wrong type."""


class InvalidMessage(PartqError, TypeError):
    """A key, payload or header has the wrong type or is larger than the queue allows."""


class IngressDisabled(PartqError):
    """The queue rejects publishes (ingress disabled with reject_msg_to_sender on)."""


class DeliveryLocked(PartqError):
    """Another process (or another Broker in this process) owns delivery for the queue."""


class FlowClosed(PartqError):
    """The flow was unbound (by the caller, by close, or by a queue change)."""


class BrokerClosed(PartqError):
    """The broker was closed; open it again."""


class StandbyReadOnly(PartqError):
    """A DR-standby refuses publishes and binds until it is promoted."""


class ScalingStepFailed(PartqError):
    """A step of the scaling procedure timed out; ingress is restored, the message says what
    to do."""

    def __init__(self, step: int, message: str) -> None:
        self.step = step
        super().__init__(message)


class ScalingInterrupted(PartqError):
    """The scaling procedure was stopped (a signal); ingress is restored."""
