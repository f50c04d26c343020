"""The delivery cursor of one partition: where delivery stands in its log, and the loop that
takes messages from it. Used by the runtime of the process that owns a queue's delivery and by
a process that delivers partitions the owner assigned to its flows (``peers.peer_delivery``).

Per partition a cursor keeps:
* ``next``: the next sequence to look at for delivery;
* ``ack``: a mirror of the durable ``AckState`` (floor, acked-above, delivered mark, delivery
  counts);
* ``inflight``: seq -> flow id of messages delivered and not yet acked;
* ``redeliver_upto``: messages with seq <= this are marked redelivered;
* ``high``: the highest sequence actually delivered in this run;
* ``suspect``: seqs an earlier holder may have delivered without counting it (it crashed, or
  held the partition in another process): each counts one lost delivery when handed out again;
* ``wait_until``: a nack with a delay holds the partition until then (rule `retry-delay`); a
  delay that outlived the process that nacked (``AckState.delays``) holds it too once the loop
  reaches its message;
* ``dead``: the seqs it decided are dead (the last ``RECENT_DEAD``), from the moment it decided,
  before the kill commits: an ack of one is refused (``dead_letter``).

The durable delivered mark runs ahead of real deliveries by up to ``MARK_LEASE`` sequences
(capped at the log's head), so most receives need no commit; after a crash every unacked message
at or below the mark comes back marked redelivered, its delivery count one higher (a possible
false positive, never a false negative). A holder that lets a partition go gracefully makes the
mark exact first (``settle_counts``), so the next holder counts and marks only real deliveries.

Delivery counts (``Message.delivery_count``, rule `delivery-count`): a message's count is one more
than the times it came back unacked (``AckState.failures``). A count that grows is written in
the same commit as the delivered mark, before the message is handed out.
"""
from __future__ import annotations

import logging

from partq.delivery.dead_letter import RECENT_DEAD
from partq.delivery.handout import Handout
from partq.delivery.key_order import KeyOrder, take_by_key
from partq.errors import CorruptRecord
from partq.message import Message
from partq.storage.encoding import corruption, record_fields

log = logging.getLogger("partq.delivery")

MARK_LEASE = 1024


class Cursor:
    __slots__ = ("sp", "next", "ack", "inflight", "redeliver_upto", "high", "error", "chunk",
                 "epoch", "stale", "remote_held", "held_by", "suspect_from", "suspect_upto",
                 "settled", "wait_until", "keyed", "dead", "draining")

    def __init__(self, sp: int, ack, epoch: int = 0, keyed: bool = False) -> None:
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
        self.wait_until = 0.0     # a nack's delay holds the partition until then (clock.now())
        self.keyed: KeyOrder | None = KeyOrder() if keyed else None   # ordering="key"
        self.dead: dict[int, None] = {}     # seqs it killed, oldest first
        # a handoff's target takes from it before the handoff ended, knowing from the store
        # what the old flow holds (seq -> key, ``peers.peer_handoff``)
        self.draining: dict[int, str | None] | None = None
        self._suspect(ack)

    def note_dead(self, seqs) -> None:
        """Seqs this cursor decided are dead (their kill may not have committed yet)."""
        dead = self.dead
        for seq in seqs:
            dead[seq] = None
        while len(dead) > RECENT_DEAD:
            del dead[next(iter(dead))]

    def forget_dead(self, seqs) -> None:
        """The kill of ``seqs`` did not commit: they are not dead."""
        for seq in seqs:
            self.dead.pop(seq, None)

    def set_ordering(self, keyed: bool) -> None:
        """The queue's ``ordering`` is (now) "key" or "partition". To "key": from the next
        receive. To "partition": once the messages held back under "key" went out (their keys'
        order needs them first), from the receive after."""
        if keyed:
            if self.keyed is None:
                self.keyed = KeyOrder()
            self.keyed.leaving = False
        elif self.keyed is not None:
            if self.keyed.pending:
                self.keyed.leaving = True
            else:
                self.keyed = None

    def _suspect(self, ack) -> None:
        """Take the durable state's word for what an earlier holder delivered uncounted."""
        self.suspect_from = max(ack.counted + 1, ack.floor)
        self.suspect_upto = ack.delivered_mark
        self.settled = ack.counted >= 0   # handing out again must say it is no longer settled

    def refresh(self, ack, settled: bool = True) -> None:
        """Take the durable ack state again (the partition was delivered by another process,
        which acked and marked there): nothing acked is delivered again, and what that process
        may have delivered comes back marked redelivered. ``ack`` (read from a snapshot) is
        merged with this cursor's own state, whose acks may not have committed yet: acks only
        ever add up. ``settled``: the snapshot already holds the assignment that fences the
        other process (``QueueDelivery._fenced``), so no ack of it can commit after it; until
        then the cursor stays stale. A cursor a handoff's target took from early
        (``draining``) only takes the acks in: the stored mark is its own; once the partition
        is this process's (no longer ``remote_held``) it is a cursor like any other."""
        if self.draining is not None:
            self.merge_acks(ack)
            if settled:
                self.stale = False
                if not self.remote_held:
                    self.draining = None
            return
        mine = self.ack
        floor = max(mine.floor, ack.floor)
        above = {s for s in mine.above if s >= floor} | {s for s in ack.above if s >= floor}
        while floor in above:
            above.discard(floor)
            floor += 1
        ack.floor, ack.above = floor, above
        for seq, n in mine.failures.items():
            if n > ack.failures.get(seq, 0) and seq >= floor and seq not in above:
                ack.failures[seq] = n
        if mine.delays:         # a nack's delay whose write may not have committed yet
            ack.delay(list(mine.delays.items()))
        other_delivered = ack.delivered_mark > mine.delivered_mark or ack.counted >= 0
        ack.delivered_mark = max(mine.delivered_mark, ack.delivered_mark)
        self.ack = ack
        self.next = max(self.next, floor)
        self.redeliver_upto = max(self.redeliver_upto, ack.delivered_mark)
        if other_delivered:
            self._suspect(ack)
        if settled:
            self.stale = False

    def merge_acks(self, ack) -> None:
        """Take in the acks, delivery counts and nack delays of the durable state ``ack``
        another holder wrote (a handoff's source, while its target takes from the partition
        already: ``peers.peer_handoff``); nothing else changes (the stored mark is the
        target's own)."""
        mine = self.ack
        if ack.floor > mine.floor:
            mine.add_through(ack.floor - 1)
        mine.add([s for s in ack.above if s >= mine.floor])
        for seq, n in ack.failures.items():
            if n > mine.failures.get(seq, 0) and not mine.is_acked(seq):
                mine.failures[seq] = n
        if ack.delays:
            mine.delay(list(ack.delays.items()))

    def take(self, reader, qid: int, queue: str, flow, want: int, out: list[Message],
             handout: Handout, hold=None) -> None:
        """Append to ``out`` deliverable messages of this partition for ``flow`` (a
        ``FlowState``) until ``out`` holds ``want``, noting in ``handout`` what must be durable
        first: delivery counts that grew, and messages that are dead instead of delivered
        (expired, or past ``max_redelivery``: rules `expiry`, `redelivery-limit`). A corrupt
        record stops delivery of the partition (``flow.pending_error``), unless the flow skips
        corrupt records: those are acked in memory and listed in ``handout.skipped`` to be
        acked durably. ``hold(seq, key)`` (online scaling, ``holds``) stops the partition at a
        message whose key's old partition has not drained yet."""
        self.held_by = None
        p, fid = self.sp, flow.flow_id
        if self.error is not None:
            if not flow.skip_corrupt:
                return
            self.error = None       # a flow told to skip takes over where delivery stopped
        if self.keyed is not None:
            if not (self.keyed.leaving and not self.keyed.pending):
                take_by_key(self, reader, qid, queue, flow, want, out, handout, hold)
                return
            self.keyed = None       # back to partition order: nothing is held any more
        if self.wait_until:
            if self.wait_until > handout.now:
                handout.wake_at(self.wait_until)
                return
            self.wait_until = 0.0
        inflight, upto = self.inflight, self.redeliver_upto
        append, new = out.append, tuple.__new__
        ack = self.ack
        now_ns, max_ttl_ns, limit = handout.now_ns, handout.max_ttl_ns, handout.max_deliveries
        while len(out) < want:
            batch = reader.records(qid, p, self.next, want - len(out) + 8, self.chunk)
            if not batch:
                break
            floor, above, delays = ack.floor, ack.above, ack.delays
            for seq, raw in batch:
                if len(out) >= want:
                    break
                self.next = seq + 1
                if seq < floor or seq in above:
                    if self.suspect_from == seq:
                        self.suspect_from = seq + 1    # passed: nothing left to count there
                    continue
                if delays and delays.get(seq, 0) > now_ns:
                    self.next = seq           # a nack's delay from before a restart or a move
                    self.wait_until = handout.now + (delays[seq] - now_ns) / 1e9
                    handout.wake_at(self.wait_until)
                    break
                fields = record_fields(raw)
                if fields is None:
                    exc = corruption(raw, queue, p, seq)
                    if flow.skip_corrupt:
                        log.error("skipping (and acking) %s", exc)
                        ack.add([seq])
                        floor = ack.floor
                        handout.skipped.setdefault(p, []).append(seq)
                        continue
                    self.next = seq
                    self.error = exc
                    flow.pending_error = exc
                    break
                ts, key = fields[0], fields[1]
                if hold is not None:
                    self.held_by = hold(seq, key)
                    if self.held_by is not None:
                        self.next = seq           # delivered once the old partition drained
                        break
                failed = ack.failures.get(seq, 0) if ack.failures else 0
                if self.suspect_from <= seq <= self.suspect_upto:
                    failed += 1               # an earlier holder's delivery, lost uncounted
                    self.suspect_from = seq + 1
                    ack.failures[seq] = failed
                    handout.count(p, seq, failed)
                if (len(fields) == 5 and fields[4] <= now_ns) \
                        or (max_ttl_ns and ts + max_ttl_ns <= now_ns):
                    handout.dead_letter(p, seq, fields, "expired", failed)
                    continue
                if limit and failed >= limit:
                    handout.dead_letter(p, seq, fields, "max_redelivery", failed)
                    continue
                if self.settled:
                    self.settled = False
                    handout.unsettle(p)
                append(new(Message, (queue, p, seq, key, fields[3], fields[2], ts, seq <= upto,
                                     failed + 1)))
                inflight[seq] = fid
            if out and out[-1].partition == p and out[-1].seq > self.high:
                self.high = out[-1].seq
            if self.error is not None or self.held_by is not None or self.wait_until:
                break

    def hand(self, seq: int, fields: list, flow, handout: Handout, out: list[Message],
             suspect: bool) -> None:
        """Hand out one message (``take_by_key``; the partition order loop of ``take`` does
        the same inline): counts, expiry, the redelivery limit, then into ``out`` and in
        flight."""
        ack, p = self.ack, self.sp
        failed = ack.failures.get(seq, 0) if ack.failures else 0
        if suspect:
            failed += 1               # an earlier holder's delivery, lost uncounted
            ack.failures[seq] = failed
            handout.count(p, seq, failed)
        ts = fields[0]
        if (len(fields) == 5 and fields[4] <= handout.now_ns) \
                or (handout.max_ttl_ns and ts + handout.max_ttl_ns <= handout.now_ns):
            handout.dead_letter(p, seq, fields, "expired", failed)
            return
        if handout.max_deliveries and failed >= handout.max_deliveries:
            handout.dead_letter(p, seq, fields, "max_redelivery", failed)
            return
        if self.settled:
            self.settled = False
            handout.unsettle(p)
        keyed = self.keyed
        again = seq <= self.redeliver_upto
        if keyed is not None:
            if seq in keyed.again:
                keyed.again.discard(seq)
                again = True
            keyed.keys[seq] = fields[1]
        out.append(Message(flow.queue, p, seq, fields[1], fields[3], fields[2], ts, again,
                           failed + 1))
        self.inflight[seq] = flow.flow_id
        if seq > self.high:
            self.high = seq

    def corrupt(self, seq: int, raw: bytes, queue: str, flow, handout: Handout) -> bool:
        """A record that fails its checksum: True when the flow skips it (acked in memory and
        in ``handout.skipped``), else delivery of the partition stops there (False)."""
        exc = corruption(raw, queue, self.sp, seq)
        if flow.skip_corrupt:
            log.error("skipping (and acking) %s", exc)
            self.ack.add([seq])
            handout.skipped.setdefault(self.sp, []).append(seq)
            return True
        self.next = seq
        self.error = exc
        flow.pending_error = exc
        return False

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
        in order, marked redelivered (under "key", after what is left of a nack's delay: the
        ack state keeps it)."""
        self.redeliver_upto = max(self.redeliver_upto, self.high)
        self.next = self.ack.floor
        if self.keyed is not None:
            self.keyed.clear()

    def take_acks(self, ack, early: bool = False) -> list[str]:
        """Acks were written outside delivery (``outside``): take the durable ack state
        ``ack`` in; messages in flight that are acked now leave ``inflight``. Returns the flow
        ids of those messages, one per message. ``early``: a handoff's target takes from it
        before the handoff ended (``peers.peer_handoff``): only the acks are taken in."""
        if early:
            self.merge_acks(ack)
        else:
            self.refresh(ack, settled=not self.stale)
        self.drop_acked_waits()
        gone = [s for s in self.inflight if self.ack.is_acked(s)]
        return [self.inflight.pop(s) for s in gone]

    def drop_acked_waits(self) -> None:
        """Acks came from outside (``partq message ack|kill``): a delay of a message acked now
        ends at once; ``take`` derives the waits left again from ``ack.delays``."""
        self.wait_until = 0.0
        keyed = self.keyed
        if keyed is not None:
            for seq in [s for s in keyed.pending if self.ack.is_acked(s)]:
                keyed.release(seq)

    def put_back(self, seq: int, key: str | None, redelivered: bool) -> None:
        """A message taken for a receive whose writes failed goes out again later: under
        "partition" delivery goes back to it, under "key" it waits with its key's pending ones
        (going back would deliver again what later receives hold)."""
        if self.keyed is None:
            self.next = min(self.next, seq)
            return
        self.keyed.keys.pop(seq, None)
        if redelivered:
            self.keyed.again.add(seq)
        self.keyed.hold(seq, key, self.suspect_from <= seq <= self.suspect_upto)

    def outstanding(self, flow_id: str) -> int:
        return sum(1 for f in self.inflight.values() if f == flow_id)

    def count_lost(self, seqs) -> list[tuple[int, int]]:
        """Deliveries of ``seqs`` ended unacked (a flow gone, a handoff timed out): each counts
        one failure. Returns the ``(seq, failures)`` pairs to make durable."""
        failures = self.ack.failures
        out = []
        for seq in seqs:
            n = failures.get(seq, 0) + 1
            failures[seq] = n
            out.append((seq, n))
        return out

    def give_back(self, seq: int, flow_id: str, delay: float, now: float) -> list[int] | None:
        """A nack of ``seq`` (in flight to ``flow_id``): it and every later message of the
        partition in flight come back, in order, marked redelivered; only ``seq`` failed, so
        only its count grows (the caller makes it durable: ``count_lost``). The partition waits
        ``delay`` seconds. Returns the seqs taken back, None when ``seq`` was not in flight to
        ``flow_id``."""
        if self.inflight.get(seq) != flow_id:
            return None
        if self.keyed is not None:      # only its key comes back, only its key waits
            return self.keyed.give_back(seq, self.inflight, delay, now)
        back = sorted(s for s in self.inflight if s >= seq)
        for s in back:
            del self.inflight[s]
        self.redeliver_upto = max(self.redeliver_upto, self.high)
        self.next = min(self.next, seq)
        if delay > 0:
            self.wait_until = max(self.wait_until, now + delay)
        return back

    def settle_counts(self) -> tuple[int, int, int, list[tuple[int, int]]] | None:
        """Letting the partition go gracefully: ``(expected, mark, counted, counts)`` for
        ``Writer.settle``: the deliveries in flight count as lost (``counts``), the mark becomes
        what was really delivered, by this holder or before it (``redeliver_upto``), and
        ``counted`` says up to where every delivery is counted: below a suspect range this
        holder has not handed out again, which stays suspect for the next holder. None when
        there is nothing to settle."""
        ack = self.ack
        expected = ack.delivered_mark
        if self.settled or ack.floor > expected or \
                sum(1 for s in ack.above if s <= expected) == expected - ack.floor + 1:
            return None     # nothing at or below the mark is unacked: nothing to get wrong
        mark = max(self.high, self.redeliver_upto, ack.floor - 1)
        if mark > expected:
            return None
        counted = self.suspect_from - 1 if self.suspect_from <= self.suspect_upto else mark
        return expected, mark, counted, self.count_lost(sorted(self.inflight))


def flag_redelivered(msgs: list[Message], seen: dict[int, int]) -> list[Message]:
    """``msgs`` with those at or below ``seen[partition]`` marked redelivered."""
    return [m._replace(redelivered=True)
            if not m.redelivered and m.seq <= seen.get(m.partition, -1) else m for m in msgs]
