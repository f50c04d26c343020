"""Timelines: which history of commits an LSN belongs to, so that a standby never resumes on a
primary whose history is not its own (PostgreSQL's timeline history, Kafka's leader epochs).

A store's history is a list of ``(timeline id, start LSN)``: timeline *i* holds the LSNs after
its start up to the start of timeline *i+1* (the last one runs to the head). A new timeline
begins at every primary incarnation: the first time a store serves replication, every start of
a replication listener (so a primary restored from a file backup, which restarts at an older
LSN, never reuses the LSNs of the history its standbys followed) and every promotion. Worked
example: primary P runs timeline A from 0; a standby S follows it to LSN 150; P is restored from
a backup taken at LSN 100 and serves again: its history is ``[(A, 0), (B, 100)]``, so timeline A
ends at 100 there, and S, on A at 150, holds commits P never had: it is refused and told to
re-snapshot. A standby on A at 90 is on a prefix of P's history and resumes.

The history is replication bookkeeping (``put_local_meta``): a snapshot carries the primary's,
and a standby takes the primary's on every connection, so a promoted standby extends the
history its standbys share.
"""
from __future__ import annotations

import uuid

import msgpack

from partq.errors import FrameError

KEY = b"timelines"
LEGACY_KEY = b"timeline"      # a single timeline id, written before histories existed
MAX_HISTORY = 1000            # timelines kept (the oldest go first: a standby that old re-snapshots)

History = list[tuple[str, int]]


def read_history(r) -> History:
    raw = r.meta(KEY)
    if raw:
        return [(str(tid), int(start)) for tid, start in msgpack.unpackb(raw, raw=False)]
    legacy = r.meta(LEGACY_KEY)
    return [(legacy.decode(), 0)] if legacy else []


def encode_history(history: History) -> bytes:
    return msgpack.packb([list(item) for item in history[-MAX_HISTORY:]])


def begin_timeline(w, at_lsn: int) -> str:
    """Start a new timeline after LSN ``at_lsn`` in the store's history; return its id."""
    tid = uuid.uuid4().hex
    history = read_history(w) + [(tid, at_lsn)]
    w.put_local_meta(KEY, encode_history(history))
    w.delete_local_meta(LEGACY_KEY)
    return tid


def current(history: History) -> str | None:
    return history[-1][0] if history else None


def end_of(history: History, timeline: str, head: int) -> int | None:
    """The last LSN of ``timeline`` in ``history`` (whose newest LSN is ``head``), or None
    when the history does not hold it."""
    for i, (tid, _) in enumerate(history):
        if tid == timeline:
            return history[i + 1][1] if i + 1 < len(history) else head
    return None


def divergence(history: History, head: int, timeline: str | None, applied: int) -> str | None:
    """Why a standby at ``applied`` on ``timeline`` cannot follow a primary with ``history``
    (None: its commits are a prefix of the primary's)."""
    if timeline is None:
        return None if applied == 0 else "the standby holds commits of an unknown history"
    end = end_of(history, timeline, head)
    if end is None:
        return (f"the standby follows timeline {timeline}, which is not in this primary's history "
                f"(it followed another primary, or this one was replaced)")
    if applied > end:
        return (f"the standby applied up to LSN {applied} on timeline {timeline}, but that "
                f"timeline ends at LSN {end} on this primary (it was restored from an older copy, "
                f"or promoted from a standby that was behind): the standby holds commits the "
                f"primary never had")
    return None


def from_wire(value) -> History:
    """A history received in a frame, checked."""
    if not isinstance(value, list) or not value or len(value) > MAX_HISTORY:
        raise FrameError("malformed timeline history")
    out: History = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and 0 < len(item[0]) <= 64 and type(item[1]) is int and item[1] >= 0):
            raise FrameError("malformed timeline history")
        if out and item[1] < out[-1][1]:
            raise FrameError("timeline history out of order")
        out.append((item[0], item[1]))
    return out
