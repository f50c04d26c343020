"""Every error partq raises on purpose, by layer: the storage layer's (``partq.storage.errors``,
re-exported here under the same names) and the broker's, below. Each message says what to do.

The CLI turns any ``PartqError`` into one line and exit status 1; library users catch the
specific classes. Nothing in the package raises bare lmdb or msgpack exceptions: the storage
layer translates them in one place.
"""
from __future__ import annotations

from partq.storage.errors import (BrokerClosed, CorruptRecord, CorruptStore, Diverged,
                                  FormatVersionMismatch, InvalidConfig, NotAPartqStore, PartqError,
                                  StorageFull, UsedAcrossFork)

__all__ = ["PartqError", "NotAPartqStore", "FormatVersionMismatch", "CorruptStore", "CorruptRecord", "StorageFull", "UsedAcrossFork", "QueueNotFound", "QueueExists", "InvalidConfig", "InvalidMessage", "IngressDisabled", "DeliveryLocked", "FlowClosed", "BrokerClosed", "StandbyReadOnly", "ScalingStepFailed", "ScalingInterrupted", "Diverged", "ReplicationTimeout"]


class QueueNotFound(PartqError):
    """No queue of that name exists."""


class QueueExists(PartqError):
    """``create_queue`` was given the name of an existing queue."""


class InvalidMessage(PartqError, TypeError):
    """A key, payload or header has the wrong type or is larger than the queue allows."""


class IngressDisabled(PartqError):
    """The queue rejects publishes (ingress disabled with reject_msg_to_sender on)."""


class DeliveryLocked(PartqError):
    """Another process (or another Broker in this process) owns delivery for the queue."""


class FlowClosed(PartqError):
    """The flow was unbound (by the caller, by close, or by a queue change)."""


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


class ReplicationTimeout(PartqError):
    """Sync mode: the standby did not confirm a commit in time. The commit is on the primary."""
