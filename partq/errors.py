"""Every error partq raises on purpose, by layer: the storage layer's (``partq.storage.errors``,
re-exported here under the same names) and the broker's, below. Each message says what to do.

The CLI turns any ``PartqError`` into one line and exit status 1; library users catch the
specific classes. Nothing in the package raises bare lmdb or msgpack exceptions: the storage
layer translates them in one place.
"""
from __future__ import annotations

import errno

from partq.storage.errors import (
    BrokerClosed,
    CorruptRecord,
    CorruptStore,
    Diverged,
    FormatVersionMismatch,
    InvalidConfig,
    NotAPartqStore,
    PartqError,
    StorageFull,
    UsedAcrossFork,
)

__all__ = ["PartqError", "NotAPartqStore", "FormatVersionMismatch", "CorruptStore", "CorruptRecord",
           "StorageFull", "UsedAcrossFork", "QueueNotFound", "QueueExists", "InvalidConfig",
           "InvalidMessage", "IngressDisabled", "DeliveryLocked", "FlowClosed", "BrokerClosed",
           "StandbyReadOnly", "ScalingStepFailed", "ScalingInterrupted", "Diverged",
           "ReplicationTimeout", "PartitionNotFound", "CopyOutError", "FlowFenced",
           "AuthenticationFailed", "ProtocolMismatch", "ServerUnavailable", "PeerRefused",
           "ReplicationRefused", "OpenedReadOnly", "TornRead", "CopyInError"]


class QueueNotFound(PartqError):
    """No queue of that name exists."""


class PartitionNotFound(PartqError):
    """The queue has no partition of that number, or no parent-queue log; the message lists
    the logs it has."""


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


class FlowFenced(PartqError):
    """An ack or nack named messages of a partition the flow no longer holds (S33): nothing was
    changed; the partition's current flow gets them redelivered. ``messages`` lists them."""

    def __init__(self, message: str, messages: list | None = None) -> None:
        self.messages = list(messages or [])
        super().__init__(message)


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


class CopyOutError(PartqError):
    """A copy-out cannot start or go on: the destination would lose or duplicate messages, the
    file is not a copy of that queue, or a record is corrupt. What was copied before stays
    copied; the message says how to continue."""


def describe_os_error(exc: OSError, doing: str | None = None) -> str:
    """One line for an ``OSError`` on a file: what failed, on which path, why, and what to
    check ("cannot write /x: Permission denied; check its permissions")."""
    where = f" {exc.filename}" if exc.filename else ""
    what = exc.strerror or str(exc)
    hint = {errno.ENOENT: "check the path", errno.EACCES: "check its permissions",
            errno.EPERM: "check its permissions", errno.ENOSPC: "free some disk space",
            errno.EISDIR: "pass a file, not a directory",
            errno.ENOTDIR: "a part of the path is a file, not a directory",
            errno.EROFS: "pass a writable location"}.get(exc.errno or 0, "check the path and retry")
    return f"{doing or 'cannot access'}{where}: {what}; {hint}"


class AuthenticationFailed(PartqError):
    """A peer's token did not match (or one side has a token and the other none)."""


class ProtocolMismatch(PartqError):
    """The peer is not a partq listener of that kind, or speaks another version."""


class ServerUnavailable(PartqError):
    """No partq server answers at that address (refused, timed out, or the connection was lost
    and could not be made again in time)."""


class PeerRefused(ServerUnavailable):
    """A listener refused the connection before the handshake (protected mode admits loopback
    peers only; the connection limit was reached); the message says why and what to do. A
    ``ServerUnavailable``: code that retries on that retries on this."""


class ReplicationRefused(PartqError):
    """A primary refused to serve this standby, or a standby to follow this primary: their
    histories diverged (re-snapshot the standby), or the primary has no slot left for it."""


class OpenedReadOnly(PartqError):
    """The directory was opened for reading only (``partq.ops.read_only``: a user who may not write
    it, or ``--read-only``): publishes, binds and changes are refused."""


class TornRead(PartqError):
    """A read without LMDB's reader lock (``partq.ops.read_only``) saw a writer reuse the pages it
    was reading, and retrying did not give a consistent answer. Nothing was changed; run it
    again, or read as a user who may write the directory."""


class CopyInError(PartqError):
    """``copy_in`` cannot go on: the file is not a copy-out export, or a record in it is
    damaged. What was published before stays published (a re-run skips it); the message
    names the record."""
