"""Errors that cross a socket: the sender puts ``exc.to_frame()`` in its frame (the class name,
the message and the constructor's fields), the receiver ``error_from_frame(frame)``, which gives
back the same class with the same fields and message: a client of ``partq serve`` catches
``CorruptRecord`` with its queue, partition and seq as a user of the library does.

Frames carry the fields next to their own keys (``op``, ``req``, ``flow``), which no error field
uses. A name the receiver does not know (a newer peer) or fields that do not fit the class give
a plain ``PartqError`` with the message: reading an error frame never raises.
"""
from __future__ import annotations

from collections.abc import Callable

from partq import errors
from partq.errors import (
    CorruptRecord,
    FlowFenced,
    LockHeld,
    PartqError,
    QueueFull,
    ScalingStepFailed,
)
from partq.message import Message

__all__ = ["error_frame", "error_from_frame"]

# every class partq.errors exports, by the name its frames carry
_CLASSES: dict[str, type[PartqError]] = {
    name: cls for name in errors.__all__
    if isinstance(cls := getattr(errors, name), type) and issubclass(cls, PartqError)}


def _field(frame: dict, name: str, kind: type):
    """``frame[name]``, which must be a ``kind``; raises ``TypeError`` or ``KeyError``."""
    value = frame[name]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise TypeError(f"field {name!r} is not a {kind.__name__}")
    return value


def _fenced(message: str, frame: dict) -> FlowFenced:
    """A ``FlowFenced`` whose ``messages`` name the fenced ones (queue, partition, seq: their
    payloads stay with the sender); raises ``TypeError`` or ``ValueError`` on a bad entry."""
    fenced = []
    for queue, partition, seq in _field(frame, "messages", list):
        if not (isinstance(queue, str) and type(partition) is int and type(seq) is int):
            raise TypeError(f"fenced message {[queue, partition, seq]!r:.80} is not "
                            f"[queue, partition, seq]")
        fenced.append(Message(queue, partition, seq, None, b"", None, 0, False))
    return FlowFenced(message, fenced)


# how the classes whose constructor takes fields are built again: (message, frame) -> error
_BUILDERS: dict[type[PartqError], Callable[[str, dict], PartqError]] = {
    CorruptRecord: lambda message, frame: CorruptRecord(
        _field(frame, "queue", str), _field(frame, "partition", int), _field(frame, "seq", int),
        _field(frame, "reason", str)),
    FlowFenced: _fenced,
    ScalingStepFailed: lambda message, frame: ScalingStepFailed(_field(frame, "step", int),
                                                                message),
    LockHeld: lambda message, frame: LockHeld(_field(frame, "holder", str)),
    QueueFull: lambda message, frame: QueueFull(
        _field(frame, "queue", str), _field(frame, "limit", str), _field(frame, "limit_value", int),
        _field(frame, "now", int)),
}


def error_frame(exc: PartqError, **frame) -> dict:
    """The frame that carries ``exc``: ``{"op": "error", **exc.to_frame(), **frame}`` (the
    caller's keys, such as ``req`` or ``flow``, come last and win)."""
    return {"op": "error", **exc.to_frame(), **frame}


def error_from_frame(frame) -> PartqError:
    """The error an error frame (or ``to_frame()``'s dict) stands for: its class, fields and
    message as the sender had them. A class name this side does not know, or fields that do
    not fit it, give a ``PartqError`` with the name and the message; anything but a map gives
    a ``PartqError`` saying so. Never raises."""
    if not isinstance(frame, dict):
        return PartqError(f"malformed error from the other side: {frame!r:.200}")
    name, message = frame.get("error"), frame.get("message")
    if not isinstance(message, str):
        message = "the other side refused, without saying why"
    cls = _CLASSES.get(name) if isinstance(name, str) else None
    if cls is None:
        return PartqError(f"{name:.60}: {message}" if isinstance(name, str) else message)
    try:
        build = _BUILDERS.get(cls)
        exc = cls(message) if build is None else build(message, frame)
    except Exception:  # fields missing or of the wrong type: keep what the error says
        return PartqError(f"{name}: {message}")
    exc.args = (message,)          # exactly the sender's words, whatever the constructor made
    return exc
