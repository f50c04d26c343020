"""The control socket's requests as the delivery owner reads them (``owner_channel``): every field
of every request checked where it arrives, before any of it reaches the dispatcher.

Only processes of the directory's user reach the socket, but any of them may send anything: a
flow name that is a map once made the owner's unbind fail and left a ghost flow holding a
partition until the owner restarted. So each field must have the type, length and range that
partq's own client sends. A request that fails a check does nothing; the owner answers it with
the typed error these functions raise, as it answers any refused request:

* ``InvalidConfig`` for a bind's name, hint or skip_corrupt, with the words ``Broker.bind``
  uses for the same mistakes;
* ``ProtocolMismatch`` for anything else: only a client that is not partq, or another version
  of it, sends such a frame.
"""
from __future__ import annotations

from typing import TypeGuard

from partq.config import MAX_PARTITIONS
from partq.errors import InvalidConfig, ProtocolMismatch

MAX_OP = 32
MAX_REQ = (1 << 63) - 1         # request ids: non-negative 64-bit ints
MAX_HOST = 255                  # a host name: DNS names are shorter
MAX_PID = (1 << 32) - 1
MAX_NAME = 256                  # a flow name, as ``Broker.bind`` bounds it
MAX_FLOW_ID = 64                # flow ids are 12 hex digits
MAX_PARTITION = (1 << 32) - 1   # storage partitions are u32; the parent queue's log is the last
MAX_LISTED = MAX_PARTITIONS + 1  # a queue's partitions, and its parent queue's log
MAX_COUNT = (1 << 63) - 1
MAX_REASONS = 8                 # what holds a partition back: a few words of a short vocabulary
MAX_REASON = 32

VERSION = 1                     # of the control protocol
OPS = ("hello", "beat", "outstanding", "bind", "unbind", "view")

AGAIN = "the client is not partq, or runs another version: run the same partq version in every " \
        "process of the directory"


def shown(value) -> str:
    """A value a client sent, short enough for an error message (a container by its type and
    size: its repr could be a megabyte)."""
    if isinstance(value, list | dict):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bad(op: str, field: str, value, wanted: str) -> ProtocolMismatch:
    return ProtocolMismatch(f"control request {op!r}: {field} must be {wanted}, not "
                            f"{shown(value)}; {AGAIN}")


def _int(value, low: int, high: int) -> TypeGuard[int]:
    return type(value) is int and low <= value <= high


def _text(value, longest: int) -> TypeGuard[str]:
    return isinstance(value, str) and 0 < len(value) <= longest and value.isprintable()


def parse(frame) -> tuple[str, int | None, tuple]:
    """(op, request id, checked fields) of a control frame: the fields as ``hello``, ``bind``,
    ``outstanding`` return them, ``(flow id, leave)`` for an unbind; the request id of a frame that
    is answered (bind, unbind, view), else None. Raises the typed error of the first bad field."""
    if not isinstance(frame, dict):
        raise ProtocolMismatch(f"a control frame must be a map, not {shown(frame)}; {AGAIN}")
    op = op_of(frame)
    if op not in OPS:
        raise ProtocolMismatch(f"unknown control request {op!r}; {AGAIN}")
    if op == "hello":
        return op, None, hello(frame)
    if op == "beat":
        return op, None, ()
    if op == "outstanding":
        return op, None, outstanding(frame)
    req = request_id(frame, op)
    if op == "bind":
        return op, req, bind(frame)
    if op == "unbind":       # "leave": true: for good, no ghost waits (rule `leave`)
        return op, req, (flow_id(frame, op), frame.get("leave") is True)
    return op, req, ()


def ends_connection(frame) -> bool:
    """Whether refusing ``frame`` ends its connection: its sender is not partq's client (a frame
    that is not a map, no request partq knows), or it cannot be served at all (a bad hello)."""
    op = frame.get("op") if isinstance(frame, dict) else None
    return not isinstance(op, str) or op not in OPS or op == "hello"


def is_request_id(value) -> TypeGuard[int]:
    """Whether ``value`` may be echoed in an answer as the request's id."""
    return _int(value, 0, MAX_REQ)


def op_of(frame: dict) -> str:
    op = frame.get("op")
    if not _text(op, MAX_OP):
        raise ProtocolMismatch(f"a control request's op must be a short string, not {shown(op)}; "
                               f"{AGAIN}")
    return op


def request_id(frame: dict, op: str) -> int:
    req = frame.get("req")
    if not is_request_id(req):
        raise _bad(op, "req", req, f"an int from 0 to {MAX_REQ}")
    return req


def hello(frame: dict) -> tuple[int, str]:
    """The (pid, host) a client says it is, for the owner's status and logs, once its protocol
    version is this one's."""
    version, pid, host = frame.get("v"), frame.get("pid"), frame.get("host")
    if type(version) is not int or version != VERSION:
        raise ProtocolMismatch(f"control protocol version {shown(version)} is not {VERSION}: run "
                               f"the same partq version in every process")
    if not _int(pid, 0, MAX_PID):
        raise _bad("hello", "pid", pid, "a process id")
    if not _text(host, MAX_HOST):
        raise _bad("hello", "host", host, f"a host name of at most {MAX_HOST} characters")
    return pid, host


def bind(frame: dict) -> tuple[str | None, list[int] | None, bool]:
    """A bind's (name, hint, skip_corrupt), checked as ``Broker.bind`` checks its arguments."""
    name, hint = frame.get("name"), frame.get("hint")
    skip_corrupt = frame.get("skip_corrupt", False)
    if name is not None and not isinstance(name, str):
        raise InvalidConfig(f"flow name must be a str, not {type(name).__name__}")
    if name is not None and not _text(name, MAX_NAME):
        raise InvalidConfig(f"flow name {shown(name)} must be 1 to {MAX_NAME} printable "
                            f"characters (no control characters: it is shown in status and logs)")
    if hint is not None:
        check_hint(hint)
    if not isinstance(skip_corrupt, bool):
        raise InvalidConfig(f"skip_corrupt must be true or false, not {shown(skip_corrupt)}")
    return name, hint, skip_corrupt


def check_hint(hint) -> None:
    """Raise ``InvalidConfig`` unless ``hint`` is a list of partition numbers a queue can have:
    the owner checks a bind's hint so, and a bind in the owner's process too, so that a hint is
    taken or refused alike wherever the flow is bound."""
    if not (isinstance(hint, list) and len(hint) <= MAX_LISTED
            and all(_int(p, 0, MAX_PARTITION) for p in hint)):
        raise InvalidConfig(f"hint must be a list of at most {MAX_LISTED} partition numbers "
                            f"(0 to {MAX_PARTITION}), not {shown(hint)}")


def flow_id(frame: dict, op: str) -> str:
    flow = frame.get("flow")
    if not _text(flow, MAX_FLOW_ID):
        raise _bad(op, "flow", flow, "a flow id")
    return flow


def _partitions(value, field: str) -> set[int]:
    if not (isinstance(value, list) and len(value) <= MAX_LISTED
            and all(_int(p, 0, MAX_PARTITION) for p in value)):
        raise _bad("outstanding", field, value, "a list of partition numbers")
    return set(value)


def outstanding(frame: dict) -> tuple[str, dict[int, int], set[int] | None,
                                      dict[int, list] | None]:
    """A flow's report: (flow id, unacked messages per partition, the partitions it saw paused
    or None, what holds messages back per partition or None): ``QueueDelivery.report``."""
    flow = flow_id(frame, "outstanding")
    counts, paused, held = frame.get("counts", []), frame.get("paused"), frame.get("held")
    if not (isinstance(counts, list) and len(counts) <= MAX_LISTED
            and all(isinstance(c, list) and len(c) == 2 and _int(c[0], 0, MAX_PARTITION)
                    and _int(c[1], 0, MAX_COUNT) for c in counts)):
        raise _bad("outstanding", "counts", counts, "a list of [partition, messages] pairs")
    if held is not None and not (isinstance(held, list) and len(held) <= MAX_LISTED
                                 and all(_held_entry(h) for h in held)):
        raise _bad("outstanding", "held", held,
                   "a list of [partition, keys, messages, [reason, ...]]")
    return (flow, {p: n for p, n in counts},
            None if paused is None else _partitions(paused, "paused"),
            None if held is None else {h[0]: h[1:] for h in held})


def _held_entry(entry) -> bool:
    """[partition, keys held, messages held, [reason, ...]] (``held_view.peer_holds``)."""
    return (isinstance(entry, list) and len(entry) == 4 and _int(entry[0], 0, MAX_PARTITION)
            and _int(entry[1], 0, MAX_COUNT) and _int(entry[2], 0, MAX_COUNT)
            and isinstance(entry[3], list) and len(entry[3]) <= MAX_REASONS
            and all(_text(r, MAX_REASON) for r in entry[3]))
