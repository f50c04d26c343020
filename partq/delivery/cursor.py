"""The delivery cursor of one partition: where delivery stands in its log, and the loop that
takes messages from it. Used by the runtime of the process that owns a queue's delivery and by
a process that delivers partitions the owner assigned to its flows (``peers.peer_delivery``).

Per partition a cursor keeps:
* ``next``: the next sequence to look at for delivery;
* ``ack``: a mirror of the durable ``AckState`` (floor, acked-above, delivered mark);
* ``inflight``: seq -> flow id of messages delivered and not yet acked;
* ``redeliver_upto``: messages with seq <= this are marked redelivered;
* ``high``: the highest sequence actually delivered in this run.

The durable delivered mark runs ahead of real deliveries by up to ``MARK_LEASE`` sequences
(capped at the log's head), so most receives need no commit; after a crash every unacked message
at or below the mark comes back marked redelivered (a possible false positive, never a false
negative).
"""
from __future__ import annotations

import logging

from partq.errors import CorruptRecord
from partq.message import Message
from partq.storage.encoding import corruption, record_fields

log = logging.getLogger("partq.delivery")

MARK_LEASE = 1024


class Cursor:
    __slots__ = ("sp", "next", "ack", "inflight", "redeliver_upto", "high", "error", "chunk",
                 "epoch", "stale", "remote_held", "held_by")

    def __init__(self, sp: int, ack, epoch: int = 0) -> None:
        self.sp = sp              # the storage partition (PARENT for an exclusive queue)
        self.chunk = [None, 0, None]   # the last log chunk read (Reader.records' cache)
        self.ack = ack
        self.next = ack.floor
        self.inflight: dict[int, str] = {}
        self.redeliver_upto = ack.delivered_mark
        self.high = ack.floor - 1
        self.error: CorruptRecord | None = None
        self.epoch = epoch        # the assignment epoch it delivers under (a peer's cursor)
        self.stale = False        # its ack mirror may lag: another process delivered it since
        self.remote_held = False  # a flow of another process holds it (the owner's cursor)
        self.held_by: int | None = None   # the old partition its next message waits for

    def refresh(self, ack, settled: bool = True) -> None:
        """Take the durable ack state again (the partition was delivered by another process,
        which acked and marked there): nothing acked is delivered again, and what that process
        may have delivered comes back marked redelivered. ``ack`` (read from a snapshot) is
        merged with this cursor's own state, whose acks may not have committed yet: acks only
        ever add up. ``settled``: the snapshot already holds the assignment that fences the
        other process (``QueueDelivery._fenced``), so no ack of it can commit after it; until
        then the cursor stays stale."""
        mine = self.ack
        floor = max(mine.floor, ack.floor)
        above = {s for s in mine.above if s >= floor} | {s for s in ack.above if s >= floor}
        while floor in above:
            above.discard(floor)
            floor += 1
        ack.floor, ack.above = floor, above
        ack.delivered_mark = max(mine.delivered_mark, ack.delivered_mark)
        self.ack = ack
        self.next = max(self.next, floor)
        self.redeliver_upto = max(self.redeliver_upto, ack.delivered_mark)
        if settled:
            self.stale = False

    def take(self, reader, qid: int, queue: str, flow, want: int, out: list[Message],
             skipped: dict[int, list[int]], hold=None) -> None:
        """Append to ``out`` deliverable messages of this partition for ``flow`` (a
        ``FlowState``) until ``out`` holds ``want``. A corrupt record stops delivery of the
        partition (``flow.pending_error``), unless the flow skips corrupt records: those are
        acked in memory and listed in ``skipped`` for the caller to ack durably. ``hold(seq,
        key)`` (online scaling, ``holds``) stops the partition at a message whose key's old
        partition has not drained yet."""
        self.held_by = None
        p, fid = self.sp, flow.flow_id
        if self.error is not None:
            if not flow.skip_corrupt:
                return
            self.error = None       # a flow told to skip takes over where delivery stopped
        inflight, upto = self.inflight, self.redeliver_upto
        append, new = out.append, tuple.__new__
        while len(out) < want:
            batch = reader.records(qid, p, self.next, want - len(out) + 8, self.chunk)
            if not batch:
                break
            floor, above = self.ack.floor, self.ack.above
            for seq, raw in batch:
                if len(out) >= want:
                    break
                self.next = seq + 1
                if seq < floor or seq in above:
                    continue
                fields = record_fields(raw)
                if fields is None:
                    exc = corruption(raw, queue, p, seq)
                    if flow.skip_corrupt:
                        log.error("skipping (and acking) %s", exc)
                        self.ack.add([seq])
                        floor = self.ack.floor
                        skipped.setdefault(p, []).append(seq)
                        continue
                    self.next = seq
                    self.error = exc
                    flow.pending_error = exc
                    break
                ts, key, headers, payload = fields
                if hold is not None:
                    self.held_by = hold(seq, key)
                    if self.held_by is not None:
                        self.next = seq           # delivered once the old partition drained
                        break
                append(new(Message, (queue, p, seq, key, payload, headers, ts, seq <= upto)))
                inflight[seq] = fid
            if out and out[-1].partition == p and out[-1].seq > self.high:
                self.high = out[-1].seq
            if self.error is not None or self.held_by is not None:
                break

    def mark(self, reader, qid: int) -> tuple[int, int] | None:
        """Advance the delivered mark past what was delivered: (old, new) to make durable, or
        None when the durable mark already covers it."""
        if self.high <= self.ack.delivered_mark:
            return None
        mark = min(self.high + MARK_LEASE, reader.head(qid, self.sp) - 1)
        old, self.ack.delivered_mark = self.ack.delivered_mark, mark
        return old, mark

    def rewind(self) -> None:
        """Deliver again from the ack floor: what was delivered and not acked goes out again,
        in order, marked redelivered."""
        self.redeliver_upto = max(self.redeliver_upto, self.high)
        self.next = self.ack.floor

    def outstanding(self, flow_id: str) -> int:
        return sum(1 for f in self.inflight.values() if f == flow_id)


def mark_ops(qid: int, marks: dict[int, tuple[int, int]], seen: dict[int, int]) -> list:
    """Write each delivered mark ``(old, new)``, and note in ``seen[partition]`` a stored mark
    above ``old``: another process (a peer whose assignment read was older, or the owner
    taking a partition back) delivered those messages since this one's snapshot, so this
    process's copies of them are redeliveries (``flag_redelivered``). Never a false negative."""
    def op(w, p: int, old: int, new: int) -> None:
        stored = w.ack_state(qid, p).delivered_mark if w.has_partition(qid, p) else old
        if stored > old:
            seen[p] = stored
        w.set_delivered_mark(qid, p, new)
    return [lambda w, p=p, o=old, n=new: op(w, p, o, n) for p, (old, new) in marks.items()]


def flag_redelivered(msgs: list[Message], seen: dict[int, int]) -> list[Message]:
    """``msgs`` with those at or below ``seen[partition]`` marked redelivered."""
    return [m._replace(redelivered=True)
            if not m.redelivered and m.seq <= seen.get(m.partition, -1) else m for m in msgs]
