"""Every error partq raises on purpose, by layer: the storage layer's (``partq.storage.errors``,
re-exported here under the same names) and the broker's, below. Each message says what to do.

The CLI turns any ``PartqError`` into one line and exit status 1; library users catch the
specific classes. Nothing in the package raises bare lmdb or msgpack exceptions: the storage
layer translates lmdb's through one table (``partq.storage.lmdb_errors``).

Every error crosses a socket as ``to_frame()`` (its class name, message and constructor fields);
``partq.wire.error_frames.error_from_frame`` rebuilds it on the other side, so a client of
``partq serve`` catches the same classes as a user of the library.
"""
from __future__ import annotations

import errno

from partq.storage.errors import (
    AccessDenied,
    BrokerClosed,
    CorruptRecord,
    CorruptStore,
    Diverged,
    FormatVersionMismatch,
    InvalidConfig,
    NotAPartqStore,
    OpenedReadOnly,
    PartqError,
    StorageFull,
    StoreBusy,
    Superseded,
    TornRead,
    UnsafeDirectory,
    UsedAcrossFork,
)

__all__ = ["PartqError", "NotAPartqStore", "FormatVersionMismatch", "CorruptStore", "CorruptRecord",
           "StorageFull", "UsedAcrossFork", "QueueNotFound", "QueueExists", "InvalidConfig",
           "InvalidMessage", "IngressDisabled", "DeliveryLocked", "FlowClosed", "BrokerClosed",
           "StandbyReadOnly", "ScalingStepFailed", "ScalingInterrupted", "Diverged",
           "ReplicationTimeout", "PartitionNotFound", "CopyOutError", "FlowFenced",
           "AuthenticationFailed", "ProtocolMismatch", "ServerUnavailable", "PeerRefused",
           "ReplicationRefused", "OpenedReadOnly", "TornRead", "CopyInError", "InvalidAck",
           "LockHeld", "OwnerLost", "FrameError", "ConnectionEnded",
           "HandshakeFailed", "JobFinished", "JobAborted",
           "StagedRowsMismatch", "UnsafeDirectory", "AccessDenied", "StoreBusy", "QueueFull",
           "Superseded"]


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


class QueueFull(PartqError):
    """A publish (a whole ``publish_many``) would take the queue past a quota, ``max_depth``
    (messages published and not acked) or ``max_bytes`` (bytes of its stored log), and the queue
    rejects rather than discards (``reject_msg_to_sender``): nothing of it was stored (rule
    `quota`). ``limit`` names the quota ("max_depth" or "max_bytes"), ``limit_value`` is its
    setting and ``now`` the queue's depth, or stored bytes, when the publish was refused."""

    def __init__(self, queue: str, limit: str, limit_value: int, now: int) -> None:
        self.queue, self.limit, self.limit_value, self.now = queue, limit, limit_value, now
        if limit == "max_depth":
            what = f"{now} messages published and not acked"
            hint = "ack messages"
        else:
            what = f"{now} bytes stored"
            hint = "ack messages (acked ones leave the log)"
        option = "--" + limit.replace("_", "-")
        super().__init__(f"queue {queue!r} is full: {limit}={limit_value} reached ({what}); "
                         f"{hint}, or raise the quota with `partq queue update {queue} "
                         f"{option} N`")

    def to_frame(self) -> dict:
        return {**super().to_frame(), "queue": self.queue, "limit": self.limit,
                "limit_value": self.limit_value, "now": self.now}


class DeliveryLocked(PartqError):
    """Another process (or another Broker in this process) owns delivery for the queue."""


class OwnerLost(DeliveryLocked):
    """The connection to the process that owns a queue's delivery closed under a request: it
    died or closed, and a new owner (maybe this process) takes over shortly; the request may be
    retried."""


class LockHeld(PartqError):
    """A lock file (a queue's delivery, a standby's directory) is held by another process;
    ``holder`` says which ("pid P on HOST since T")."""

    def __init__(self, holder: str) -> None:
        self.holder = holder
        super().__init__(f"held by {holder}")

    def to_frame(self) -> dict:
        return {**super().to_frame(), "holder": self.holder}


class FlowClosed(PartqError):
    """The flow was unbound (by the caller, by close, or by a queue change)."""


class InvalidAck(PartqError, ValueError):
    """An ack or nack names a message this queue never delivered, or something that is not a
    message a flow received (``partq.Message``)."""


class FlowFenced(PartqError):
    """An ack or nack named messages of a partition the flow no longer holds (rule `fencing`): nothing was
    changed; the partition's current flow gets them redelivered. ``messages`` lists them."""

    def __init__(self, message: str, messages: list | None = None) -> None:
        self.messages = list(messages or [])
        super().__init__(message)

    def to_frame(self) -> dict:
        return {**super().to_frame(),
                "messages": [[m.queue, m.partition, m.seq] for m in self.messages]}


class StandbyReadOnly(PartqError):
    """A DR-standby refuses publishes and binds until it is promoted."""


class ScalingStepFailed(PartqError):
    """A step of the scaling procedure timed out; ingress is restored, the message says what
    to do."""

    def __init__(self, step: int, message: str) -> None:
        self.step = step
        super().__init__(message)

    def to_frame(self) -> dict:
        return {**super().to_frame(), "step": self.step}


class ScalingInterrupted(PartqError):
    """The scaling procedure was stopped (a signal); ingress is restored."""


class ReplicationTimeout(PartqError):
    """Sync mode: the standby did not confirm a commit in time. The commit is on the primary."""


class CopyOutError(PartqError):
    """A copy-out cannot start or go on: the destination would lose or duplicate messages, the
    file is not a copy of that queue, or a record is corrupt. What was copied before stays
    copied; the message says how to continue."""


def queue_not_found(name: str, known, hint: str | None = None) -> QueueNotFound:
    """``QueueNotFound`` for ``name``, suggesting the closest of the ``known`` queue names
    (a mistyped name) and else ``hint``: how to make it."""
    import difflib
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    if close:
        return QueueNotFound(f"no queue named {name!r}; did you mean {close[0]!r}?")
    return QueueNotFound(f"no queue named {name!r}; " + (
        hint or f"create it with create_queue (or `partq queue create {name}`)"))


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


class FrameError(PartqError):
    """A frame failed its checks (checksum, length, msgpack) or is not a request the reader
    knows; the connection that carried it ends."""


class ConnectionEnded(FrameError):
    """The peer closed the connection between two frames: an end, not damage."""


class HandshakeFailed(PartqError):
    """A listener refused a peer during the handshake; the peer was told why and its connection
    ends."""


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


class CopyInError(PartqError):
    """``copy_in`` cannot go on: the file is not a copy-out export, or a record in it is
    damaged. What was published before stays published (a re-run skips it); the message
    names the record."""


class JobFinished(PartqError):
    """Staging was refused: the job was already committed or aborted (a late or zombie attempt)."""


class JobAborted(PartqError):
    """``commit_job`` was called for a job that was aborted: its staged rows are gone."""


class StagedRowsMismatch(PartqError):
    """An attempt's staged rows differ from the count its task reported: nothing was published."""
