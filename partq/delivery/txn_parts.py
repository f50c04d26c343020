"""What the flows of one queue bring to a transaction (``partq.transactions``): the checks and
writes of its acks, nacks and rejects in the transaction's one write, and what changes in
memory once it committed (or failed).

A transaction's write runs every check of every part before any write of any part, so a check
that refuses (``FlowFenced``) leaves the write empty. Every ack, nack or reject of a
transaction needs its message in flight to the flow that received it, and not acked in the
store: a message acked, nacked or rejected already (by this transaction's flow or another,
an operator's kill included) refuses the whole transaction with ``FlowFenced``, so two
transactions can never both consume one delivery (exactly once).

``local_part`` is for flows this process delivers (under the dispatcher's lock, which the
commit holds until the write is durable: nothing of delivery changes between the checks and
the commit, and memory changes only after it). A flow of another process of the host has its
part made by its ``PeerQueue`` (``peers.peer_txn``).
"""
from __future__ import annotations

from collections.abc import Callable

from partq.config import redelivery_wait
from partq.delivery import owner
from partq.delivery.dead_letter import dead_op, rejected
from partq.delivery.flow_calls import delays_op
from partq.delivery.flow_state import FlowState, dead_error, fenced_error, positions
from partq.delivery.key_handoff import target_holds
from partq.errors import FlowFenced, InvalidAck
from partq.message import Message


class Entry:
    """One ack, nack or reject of a transaction; a committed nack sets ``back``, the seqs of
    its partition it gave back (``Flow.nack``'s result)."""

    __slots__ = ("verb", "msg", "delay", "back")

    def __init__(self, verb: str, msg: Message, delay: float | None = None) -> None:
        self.verb = verb            # "acked", "nacked" or "rejected"
        self.msg = msg
        self.delay = delay          # a nack's
        self.back: list[int] = []


class TxnPart:
    """What one queue's flows bring to a transaction."""

    __slots__ = ("checks", "writes", "after", "failed")

    def __init__(self) -> None:
        self.checks: list[Callable] = []        # f(w): raise to refuse the transaction
        self.writes: list[Callable] = []        # f(w): after every check of every part
        self.after: list[Callable[[], list]] = []   # once committed: memory; returns writes
        self.failed: list[Callable[[], None]] = []  # once refused or failed


def unacked_check(queue: str, qid: int, flow, sp: int, msgs: list[Message],
                  verb: str, holds: Callable | None = None) -> Callable:
    """The check in the write that ``msgs`` of storage partition ``sp`` are not acked there
    (nor dead), and, with ``holds(w)``, that ``flow`` still holds ``sp``: ``FlowFenced``
    otherwise."""
    def check(w) -> None:
        if holds is not None and not holds(w):
            raise fenced_error(queue, flow, msgs, verb)
        if not w.has_partition(qid, sp):
            return          # scaled away: its messages are gone, nothing to write
        state = w.ack_state(qid, sp)
        done = [m for m in msgs if state.is_acked(m.seq)]
        if done:
            raise consumed_error(queue, flow, done, verb)
    return check


def consumed_error(queue: str, flow, msgs: list[Message], verb: str) -> FlowFenced:
    """The error of a transaction naming messages the store has acked already."""
    where = positions(msgs)
    return FlowFenced(
        f"flow {flow.name or flow.flow_id} of queue {queue!r} {verb} {len(msgs)} message(s) in a "
        f"transaction that are acked already (by another transaction or call, killed by an "
        f"operator, or dead: partition/seq {where}): nothing of the transaction was done", msgs)


def local_part(qd, state: FlowState, entries: list[Entry], now: float, now_ns: int) -> TxnPart:
    """The part of ``entries`` of ``state``, a flow of ``qd`` (this process's delivery of one
    queue); under the dispatcher's lock. Raises ``FlowFenced`` or ``InvalidAck`` at once for
    what memory already refuses, changing nothing."""
    part = TxnPart()
    part.checks.append(owner.guard(qd))
    name, qid, fid = qd.name, qd.qid, state.flow_id
    fenced: dict[str, list[Message]] = {}
    dead: list[Message] = []
    held: list[tuple[Entry, int]] = []
    for entry in entries:
        m = entry.msg
        if m.queue != name:
            raise InvalidAck(f"message of queue {m.queue!r} {entry.verb} on a flow of {name!r}")
        slot = qd.slot_of.get(m.partition)
        ps = qd.parts[slot] if slot is not None else None
        if state.closed or ps is None or slot is None or ps.inflight.get(m.seq) != fid or (
                qd.core.owner[slot] != fid and not target_holds(qd.core, ps, slot, fid, m.seq)):
            fenced.setdefault(entry.verb, []).append(m)
        elif m.seq in ps.dead:
            dead.append(m)
        else:
            held.append((entry, slot))
    for verb, msgs in fenced.items():
        raise fenced_error(name, state, msgs, verb)
    if dead:
        raise dead_error(name, state, dead)
    acks: dict[int, list[int]] = {}
    for entry, slot in held:
        ps = qd.parts[slot]
        m = entry.msg
        part.checks.append(unacked_check(name, qid, state, ps.sp, [m], entry.verb))
        if entry.verb == "acked":
            acks.setdefault(slot, []).append(m.seq)
        elif entry.verb == "rejected":
            died = [rejected(ps.sp, m.seq, ps.ack.failed(m.seq) + 1)]
            part.writes.append(dead_op(name, qid, died, now_ns))
            part.after.append(_after_reject(qd, state, slot, died, now))
        else:
            failures = ps.ack.failed(m.seq) + 1
            delay = redelivery_wait(qd.config, failures) if entry.delay is None else entry.delay
            part.writes.append(_failures_op(qid, ps.sp, m.seq, failures))
            if delay > 0:
                part.writes.append(delays_op(qid, ps.sp, m.seq, now_ns, delay)[0])
            part.after.append(_after_nack(qd, state, entry, delay, now, now_ns))
    if acks:
        items = [(qd.parts[slot].sp, seqs) for slot, seqs in acks.items()]
        part.writes.append(lambda w: [w.ack(qid, sp, seqs) for sp, seqs in items])
        part.after.insert(0, lambda: qd.acked_in_memory(acks, now))
    return part


def _after_reject(qd, state: FlowState, slot: int, died: list, now: float) -> Callable[[], list]:
    return lambda: qd.rejected_in_memory(state, slot, died, now)


def _after_nack(qd, state: FlowState, entry: Entry, delay: float, now: float,
                now_ns: int) -> Callable[[], list]:
    def after() -> list:
        ops, entry.back = qd.nack(state, entry.msg, now, delay, now_ns)
        return ops
    return after


def _failures_op(qid: int, sp: int, seq: int, failures: int) -> Callable:
    return lambda w: w.set_failures(qid, sp, [(seq, failures)])
