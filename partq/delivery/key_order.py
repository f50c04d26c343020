"""Per-key ordering of one partition (rule `key-ordering`, queue setting ``ordering="key"``):
every message of one key reaches consumers in publish order, redeliveries included, and what
holds one key back does not hold the others.

Under ``ordering="partition"`` a nack gives back its message and every later message of the
partition, and the partition waits out the nack's delay. Under ``"key"`` (this module) a nack
gives back its message and the later messages *of its key* in flight (counted as given back,
not as failed), and only that key waits:

* ``pending``: seqs to deliver before anything later of their key: given back by a nack, or
  passed over because their key was held when delivery reached them; per seq its key, whether
  a holder before this cursor may have delivered it uncounted (``Cursor.suspect``), and the time
  before which it may not go (a nack's delay, on the nacked message).
* ``held``: key -> how many ``pending`` entries it has: a message of a held key is passed over
  (into ``pending``) rather than delivered. Unkeyed messages have no order: nothing holds them
  but their own delay.
* ``again``: seqs given back by a nack: marked redelivered when they go out again.

A nack's delay is also kept in the cursor's ack state (``AckState.delays``, as the store keeps
it): when delivery went back to the ack floor (the partition moved to another flow), after a
restart, or for a delay a flow of another process wrote, the scan that reaches such a message
again waits out the rest of its delay, and so does its key.

Memory: ``pending`` holds at most ``PENDING_LIMIT`` seqs; past that delivery of the partition
stops moving forward (it waits as under ``"partition"``) until entries went out. Keys are kept
as the strings the records carry (at most max_key_size bytes each)."""
from __future__ import annotations

from partq.storage.encoding import record_fields

PENDING_LIMIT = 10_000


class KeyOrder:
    __slots__ = ("pending", "held", "again", "keys", "leaving", "early")

    def __init__(self) -> None:
        self.leaving = False        # the queue went back to "partition": once pending is empty
        self.pending: dict[int, list] = {}      # seq -> [key, suspect, not_before]
        self.held: dict[str, int] = {}          # key -> entries of it in ``pending``
        self.again: set[int] = set()
        self.keys: dict[int, str | None] = {}   # seq -> key of the messages in flight
        self.early: str | None = None   # the flow taking from it during a handoff (key_handoff)

    def hold(self, seq: int, key: str | None, suspect: bool, not_before: float = 0.0) -> None:
        """``seq`` goes out later, before anything later of ``key``."""
        if seq in self.pending:
            return
        self.pending[seq] = [key, suspect, not_before]
        if key is not None:
            self.held[key] = self.held.get(key, 0) + 1

    def release(self, seq: int) -> None:
        entry = self.pending.pop(seq, None)
        if entry is not None and entry[0] is not None:
            n = self.held[entry[0]] - 1
            if n:
                self.held[entry[0]] = n
            else:
                del self.held[entry[0]]

    def full(self) -> bool:
        return len(self.pending) >= PENDING_LIMIT

    def due(self, now: float) -> tuple[list[int], float | None]:
        """The pending seqs that may go now, in seq order (a key's entries stop at its first
        that must wait), and the earliest time a waiting one may go."""
        out, blocked, wake = [], set(), None
        for seq in sorted(self.pending):
            key, _, not_before = self.pending[seq]
            if key is not None and key in blocked:
                continue
            if not_before > now:
                wake = not_before if wake is None else min(wake, not_before)
                if key is not None:
                    blocked.add(key)
                continue
            out.append(seq)
        return out, wake

    def give_back(self, seq: int, inflight: dict[int, str], delay: float, now: float) -> list[int]:
        """A nack of ``seq``: it and the later messages of its key in flight come back (taken
        out of ``inflight``); ``seq`` no sooner than ``delay`` seconds from ``now``. Returns the
        seqs taken back."""
        key = self.keys.get(seq)
        back = [seq] if key is None else sorted(
            s for s in inflight if s >= seq and self.keys.get(s) == key)
        for s in back:
            del inflight[s]
            self.keys.pop(s, None)
            self.again.add(s)
            self.hold(s, key, False, now + delay if s == seq and delay > 0 else 0.0)
        return back

    def take_back(self, seqs) -> None:
        """Deliveries of ``seqs`` ended unacked (counted by the caller): each goes out again,
        marked redelivered, before anything later of its key."""
        for s in seqs:
            key = self.keys.pop(s, None)
            self.again.add(s)
            self.hold(s, key, False)

    def forget_inflight(self, seqs) -> None:
        for s in seqs:
            self.keys.pop(s, None)

    def clear(self) -> None:
        """Delivery goes back to the ack floor (a rewind): everything is read again (the nack
        delays not over are in the cursor's ack state, for when the scan meets their messages
        again)."""
        self.pending.clear()
        self.held.clear()
        self.keys.clear()
        self.early = None


def take_by_key(cursor, reader, qid: int, queue: str, flow, want: int, out: list,
                handout, hold=None) -> None:
    """``Cursor.take`` for a partition under ``ordering="key"``: first the pending messages
    that may go now (each key's in seq order), then on from ``cursor.next``, passing over (into
    ``pending``) every message whose key is held: by a pending message of its key, a nack's
    delay, or an online scaling's cut-over (``hold(seq, key)``). A corrupt record stops the
    partition as under ``"partition"``."""
    ko: KeyOrder = cursor.keyed
    p = cursor.sp
    due, wake = ko.due(handout.now)
    if wake is not None:
        handout.wake_at(wake)
    gated: set[str | None] = set()
    delays = cursor.ack.delays
    for seq in due:
        if len(out) >= want:
            return
        key, suspect, _ = ko.pending[seq]
        if delays and (until := delays.get(seq, 0)) > handout.now_ns:
            not_before = handout.now + (until - handout.now_ns) / 1e9
            ko.pending[seq][2] = not_before     # a nack's delay written by another holder
            handout.wake_at(not_before)         # (a handoff's source): its key waits
            if key is not None:
                gated.add(key)
            continue
        if (key is not None and key in gated) or (hold is not None
                                                  and hold(seq, key) is not None):
            if key is not None:     # an unkeyed message holds back no other
                gated.add(key)      # its old partition has not drained yet: later
            continue
        ko.release(seq)
        if cursor.ack.is_acked(seq):
            continue
        batch = reader.records(qid, p, seq, 1, cursor.chunk)
        fields = record_fields(batch[0][1]) if batch and batch[0][0] == seq else None
        if fields is None:
            continue                # gone or damaged: the forward scan met it, and says so
        cursor.hand(seq, fields, flow, handout, out, suspect)
    while len(out) < want and not ko.full() and cursor.error is None:
        batch = reader.records(qid, p, cursor.next, want - len(out) + 8, cursor.chunk)
        if not batch:
            break
        for seq, raw in batch:
            if len(out) >= want or ko.full():
                break
            cursor.next = seq + 1
            if cursor.ack.is_acked(seq):
                if cursor.suspect_from == seq:
                    cursor.suspect_from = seq + 1
                continue
            fields = record_fields(raw)
            if fields is None:
                if not cursor.corrupt(seq, raw, queue, flow, handout):
                    break
                continue
            key = fields[1]
            suspect = cursor.suspect_from <= seq <= cursor.suspect_upto
            if suspect:
                cursor.suspect_from = seq + 1
            if delays and (until := delays.get(seq, 0)) > handout.now_ns:
                not_before = handout.now + (until - handout.now_ns) / 1e9
                ko.hold(seq, key, suspect, not_before)      # a nack's delay from before a move
                handout.wake_at(not_before)                 # or a restart
                continue
            held = key is not None and (key in ko.held or key in gated)
            if not held and hold is not None and hold(seq, key) is not None:
                held = True
                gated.add(key)
            if held:
                ko.hold(seq, key, suspect)
                continue
            cursor.hand(seq, fields, flow, handout, out, suspect)
