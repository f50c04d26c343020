"""Handoffs under ``ordering="key"`` in which a flow of another process takes part (rule
`key-ordering`): the new flow (the target) takes from the partition before the handoff ends,
and only the keys its old flow (the source) still holds wait. The target is a flow of a process
that does not run the queue's delivery (``PeerCursors``; its source of any process), or a flow
of the process that does whose source is a flow of another process (``early_from_store``).

The target knows what the source holds from the store alone. When the source sees the pause it
settles the partition (``Writer.settle``: its lost deliveries counted, the delivered mark made
exact; the owner does the same for a source of its own). From then on every unacked message at or
below the stored mark is one the source holds (in flight, or passed over behind one of its keys),
and the source takes no more from the partition. So once the stored state is settled the target
reads, once, those messages and their keys (``read_draining``): the "draining" set. Its cursor
starts at the ack floor like any new holder's and passes over, into its pending messages, every
message of the draining set and every later message of a draining key (``stored_draining_hold``); the
rest goes out at once. The source's acks reach the target's cursor through the stored ack state,
read again before every take (``Cursor.refresh``): a key whose draining messages were all acked
stops draining, and its passed-over messages go out, in order.

When the handoff ends (the source acked everything, left, or ``max_handoff_time`` passed) the
partition is the target's under the next epoch; its cursor goes on as it is (``PeerFlow.sync``),
no longer holding anything back: what the source still held goes out marked redelivered (it is at
or below the mark the cursor started from), before any later message of its key, and counted
already (by the source's settle). The target's acks of messages it took early are fenced by the
source's epoch while the handoff goes on and by the next one after (``Assignment.holds``).

Until the stored state is settled (the source has not seen the pause yet, or crashed before it
could settle) the target takes nothing from the partition: it waits as under "partition". So it
does when the draining set would pass ``PENDING_LIMIT`` messages."""
from __future__ import annotations

from partq.delivery.cursor import Cursor
from partq.delivery.key_handoff import Hold, holding
from partq.delivery.key_order import PENDING_LIMIT
from partq.storage.encoding import record_fields

READ_BATCH = 256


def read_draining(reader, qid: int, sp: int):
    """``(ack state, draining)`` of partition ``sp`` in snapshot ``reader`` when its state is
    settled: ``draining`` maps every unacked seq at or below the delivered mark to its key.
    None while the mark may still run ahead of what was delivered, or when the set is too large
    to hold."""
    ack = reader.ack_state(qid, sp)
    mark = ack.delivered_mark
    if ack.counted < 0 and ack.floor <= mark:      # the floor is never acked
        return None
    draining: dict[int, str | None] = {}
    seq, chunk = ack.floor, [None, 0, None]
    while seq <= mark:
        batch = reader.records(qid, sp, seq, min(READ_BATCH, mark - seq + 1), chunk)
        if not batch:
            break
        for s, raw in batch:
            if s > mark:
                break
            if not ack.is_acked(s):
                fields = record_fields(raw)
                draining[s] = fields[1] if fields is not None else None
        if len(draining) > PENDING_LIMIT:
            return None
        seq = batch[-1][0] + 1
    return ack, draining


def stored_draining_hold(draining: dict[int, str | None], ack, gate: Hold | None) -> Hold:
    """The hold of the target's take: a message of the draining set its source has not acked
    yet waits, and so does every message of a key with such a message; then what ``gate``
    holds (an online scaling's cut-over). Drops from ``draining`` what was acked."""
    for seq in [s for s in draining if ack.is_acked(s)]:
        del draining[seq]
    return holding({k for k in draining.values() if k is not None}, gate, draining)


def early_from_store(ps: Cursor, reader, qid: int, gate: Hold | None
                     ) -> tuple[Cursor, Hold] | None:
    """The cursor the delivering process takes from for a target of its own when the source is
    a flow of another process (its cursor ``ps`` is ``remote_held``), and its hold: the first
    time a new cursor from the settled state (None until it is settled), with the draining set;
    after, ``ps`` with the source's acks taken in. None, too, when another flow delivered from
    the partition since (the stored mark passed this cursor's): it waits as under "partition"."""
    draining = ps.draining
    if draining is None:
        found = read_draining(reader, qid, ps.sp)
        if found is None:
            return None
        ps, draining = Cursor(ps.sp, found[0], keyed=True), found[1]
        ps.remote_held, ps.draining = True, draining
    else:
        stored = reader.ack_state(qid, ps.sp)
        if stored.delivered_mark > ps.ack.delivered_mark:
            return None
        ps.merge_acks(stored)
    return ps, stored_draining_hold(draining, ps.ack, gate)
