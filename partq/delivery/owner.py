"""Which process runs a queue's delivery, as the store says: the owner check that fences a
delivery owner that lost its lock while it was stopped (rule `owner-takeover`).

The delivery lock (``lock.DeliveryLock``) is a lease: a holder stopped past the queue's
``consumer_timeout`` loses it to another process. The stopped process does not know; when it
runs again its threads go on where they were. So every process that takes a queue's delivery
claims it in the store first (``claim``: a token of its own in the queue's meta, written before
any other write of its delivery), and every write of its delivery starts with ``guard``: when
the token stored is no longer its own, the write changes nothing and raises ``FlowClosed``, and
the runtime is marked ``fenced`` (its process steps down: ``Dispatcher.step_down``). A receive
checks the token in the snapshot it reads before it hands anything out (``check``), so a
resumed owner hands out nothing its successor may have delivered since.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable

from partq.errors import FlowClosed, PartqError

OWNER = b"owner"            # queue meta: the token of the process that runs its delivery


def new_token() -> bytes:
    return f"{os.getpid()}:{uuid.uuid4().hex}".encode()


def claim(qid: int, token: bytes) -> Callable:
    """The write that makes ``token`` the queue's delivery owner."""
    return lambda w: w.put_queue_meta(qid, OWNER, token)


def claimed(qd, pending) -> None:
    """``qd``'s claim (the write ``pending``) is resolved: a claim the store refused (a
    superseded primary, a failing disk) is kept as the error every write of its delivery then
    raises; another process's claim is not this one's to step down for."""
    try:
        pending.result()
    except PartqError as exc:
        qd.claim_error = exc
    qd.claimed = True


def _refused(qd) -> PartqError:
    """Why a write of ``qd``'s delivery is refused: its own claim failed, or another process
    claimed the queue since (then ``qd`` is fenced)."""
    if qd.claim_error is not None:
        return qd.claim_error
    qd.fenced = True
    return lost(qd.name)


def holds(r, qid: int, token: bytes) -> bool:
    return r.queue_meta(qid, OWNER) == token


def lost(queue: str) -> FlowClosed:
    return FlowClosed(f"this process no longer runs the delivery of queue {queue!r}: it was "
                      f"stopped longer than the queue's consumer_timeout and another process "
                      f"took delivery over; bind again (nothing of this call was done)")


def guard(qd) -> Callable:
    """The first operation of a write of ``qd``'s delivery (``QueueDelivery``): refuses the
    write once another process claimed the queue."""
    qid, token = qd.qid, qd.owner_token

    def op(w) -> None:
        if w.queue_meta(qid, OWNER) != token:
            raise _refused(qd)
    return op


def check(qd, reader, claimed: bool) -> None:
    """Before a receive hands out messages read in ``reader``: raise ``FlowClosed`` (and mark
    ``qd`` fenced) when another process claimed the queue since this one did. ``claimed`` is
    ``qd.claimed`` as it was before ``reader``'s snapshot began: a claim committed after that
    is not in the snapshot, which then still shows the queue unclaimed (or its old owner)."""
    if claimed and not holds(reader, qd.qid, qd.owner_token):
        raise _refused(qd)
    if qd.fenced:
        raise lost(qd.name)
