"""No split brain: a promoted standby tells its old primary, which then refuses writes; and only
a standby that really followed that primary can (this module is the old primary's side; the
promoted store's is ``fencer``).

A standby is promoted when its primary is taken for lost; the primary may come back (a host
restarted, a network healed) and take writes again, and then two primaries diverge. So the
promoted store tells the old primary (``fencer.Fencer``), which marks its directory
(``SUPERSEDED``, a meta value of its own, not copied to standbys) and answers ``superseded``.
From the mark on, every commit of the old directory that would change queues or messages fails
with ``Superseded``, in every process of it (``partq.storage.group_commit``), and it serves no
standby.

The mark ends the primary's writes for good, so who may set it matters: anyone who passes the
replication handshake (any token holder, any local user of a primary in protected mode) can
read the primary's timeline history from a first connection and invent one timeline on top.
So the old primary accepts it only from a standby that proves three things:

* it is the standby a slot here belongs to: the standby keeps a random secret (``SECRET``,
  local meta, made before its first connection) and sends its hash (``verifier``) with every
  hello; the slot records the hash when it is made, and refuses a connection with another one
  (``slots.register``). The primary keeps only the hash, because its meta travels in every
  snapshot it sends; the promoted store proves the secret by sending it, once, on the
  authenticated connection (TLS when configured), and the slot goes with the mark when an
  operator clears it, so the secret is spent;
* its history forks from this primary's (``fork_point``): its first timeline this primary does
  not know starts, at the fork LSN, inside one this primary holds;
* this primary streamed it the fork: the change at the fork LSN is this primary's (its crc32c is
  the one the standby holds); or the fork is the LSN of the last snapshot this primary sent that
  standby, and the standby shows the proof that came after the snapshot's last chunk (so it
  read it whole: ``slots.note_snapshot``); or the slot confirmed an ack at or past the fork.

Anything else is refused and changes nothing. A standby whose slot was made by older partq and
that never reconnected since, or a promoted store that holds no secret, cannot prove it: the
refusal says so, and the operator stops the old primary by hand. `partq dr clear-superseded`
(``clear_superseded``) removes a mark an operator decides was wrong.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import time

import msgpack

from partq.errors import FrameError
from partq.replication import slots, timeline
from partq.replication.protocol import SECRET_BYTES, lsn_field, standby_hello
from partq.replication.status import u64
from partq.storage.checksum import crc32c
from partq.storage.group_commit import SUPERSEDED

SECRET = b"supersede_secret"      # local meta of a standby (and a promoted store): its secret
SNAPSHOT_PROOF = b"snapshot_proof"  # local meta of a standby: [LSN, proof] of its last snapshot


def verifier(secret: bytes) -> bytes:
    """What a slot keeps of its standby's secret: a hash, which proves nothing when read."""
    return hashlib.sha256(b"partq slot secret\0" + secret).digest()


def fork_point(mine: timeline.History, theirs: timeline.History) -> tuple[str, int] | None:
    """Where history ``theirs`` forks from ``mine``: (the last timeline of ``mine`` it follows,
    the LSN its first timeline unknown to ``mine`` starts after), or None when it does not fork
    from ``mine`` (it holds no unknown timeline, or the first follows one ``mine`` lacks)."""
    known = {tid for tid, _ in mine}
    for i, (tid, start) in enumerate(theirs):
        if tid not in known:
            return (theirs[i - 1][0], start) if i > 0 and theirs[i - 1][0] in known else None
    return None


def forked_from(mine: timeline.History, theirs: timeline.History) -> bool:
    """Whether history ``theirs`` forks from ``mine`` (a standby of this primary, promoted)."""
    return fork_point(mine, theirs) is not None


@dataclasses.dataclass(frozen=True)
class Claim:
    """What a promoted standby says to supersede its old primary."""
    standby_id: str
    history: timeline.History
    secret: bytes | None
    fork_lsn: int | None        # its last commit of the old primary, and that commit's crc32c
    fork_crc: int | None
    snapshot: tuple[int, bytes] | None = None     # LSN and proof of its last snapshot


def claim_from(hello: dict) -> Claim:
    """The claim in a hello that carries ``supersedes``, checked (``FrameError``)."""
    info = standby_hello(hello)
    secret, proof = hello.get("slot_secret"), hello.get("snapshot_proof")
    for value in (secret, proof):
        if value is not None and (not isinstance(value, bytes) or len(value) != SECRET_BYTES):
            raise FrameError("malformed slot secret or snapshot proof")
    snapshot = None
    if proof is not None:
        snapshot = (lsn_field(hello, "snapshot_lsn") or 0, proof)
    return Claim(info.standby_id, timeline.from_wire(hello.get("supersedes")), secret,
                 info.applied_lsn, info.applied_crc, snapshot)


def _read_snapshot_whole(slot: slots.Slot, claim: Claim, lsn: int) -> bool:
    """Whether the claim proves its standby read the snapshot at ``lsn`` this primary sent it."""
    if claim.snapshot is None or slot.snapshot_proof is None:
        return False
    return claim.snapshot[0] == slot.snapshot_lsn == lsn and hmac.compare_digest(
        verifier(claim.snapshot[1]), slot.snapshot_proof)


def refusal(w, claim: Claim, acks: dict[str, tuple[int, float]]) -> str | None:
    """Why this primary does not accept ``claim`` (None: it does). ``acks``: the standbys'
    acked LSNs this process knows and has not stored yet."""
    mine = timeline.read_history(w)
    fork = fork_point(mine, claim.history)
    if fork is None:
        return ("its timeline history does not fork from this primary's: it was never a standby "
                "of it, so it cannot supersede it")
    base, lsn = fork
    end = timeline.end_of(mine, base, u64(w.meta(b"lsn")))
    if end is None or lsn > end:
        return (f"it forked after LSN {lsn} of timeline {base}, which ends at LSN {end} here: "
                f"it holds commits this primary does not, so it was not promoted from this "
                f"primary's stream; if it is the new primary, stop this one by hand")
    sid = claim.standby_id
    slot = slots.read_slots(w).get(sid)
    if slot is None:
        return (f"this primary has no replication slot of standby {sid} (never made, or "
                f"dropped or invalidated since): only a standby that followed it may supersede "
                f"it; if that store is the new primary, stop this one by hand")
    if slot.verifier is None or claim.secret is None:
        return (f"standby {sid} followed this primary with partq older than this one and holds "
                f"no proof of it (no slot secret), so this primary cannot tell it from an "
                f"impostor: stop this primary by hand so that only the new one takes writes (a "
                f"standby that reconnects once with this version gets a proof for next time)")
    if not hmac.compare_digest(verifier(claim.secret), slot.verifier):
        return (f"the slot secret does not match the one standby {sid}'s slot holds: only that "
                f"standby, promoted, may supersede this primary")
    acked, seen = slot.acked, slot.seen
    if sid in acks:
        acked, seen = max(acked, acks[sid][0]), max(seen, acks[sid][1])
    entry = w.change(lsn) if lsn else None
    crc = claim.fork_crc if claim.fork_lsn == lsn else None
    if entry is not None and crc is not None:
        if crc32c(entry) != crc:
            return (f"its commit at LSN {lsn} is not this primary's (this primary was restored "
                    f"from an older copy and wrote other commits)")
    elif not (seen and lsn <= acked) and not _read_snapshot_whole(slot, claim, lsn):
        return (f"this primary cannot check that it streamed LSN {lsn}, where that store forked, "
                f"to standby {sid} (its slot confirmed LSN {acked if seen else 'none'})")
    return None


def mark_superseded(w, claim: Claim, where: str, acks: dict[str, tuple[int, float]]) \
        -> str | None:
    """In the old primary's write transaction: mark it superseded by the promoted standby at
    ``where`` if ``claim`` holds (``refusal``). Returns why not (None: marked)."""
    reason = refusal(w, claim, acks)
    if reason is None and w.meta(SUPERSEDED) is None:
        w.put_local_meta(SUPERSEDED, msgpack.packb({
            "by": where, "standby_id": claim.standby_id, "timeline": claim.history[-1][0],
            "at": time.time()}))
    return reason


def superseded(r) -> bool:
    return r.meta(SUPERSEDED) is not None


def clear_superseded(store) -> dict | None:
    """Remove the SUPERSEDED mark of ``store`` (`partq dr clear-superseded`): its directory
    takes writes again and serves standbys. The slot of the standby that superseded it goes too
    (its secret was spent, and that store, a primary now, never follows this one again).
    Returns what the mark said and the slot dropped, or None when there was no mark."""
    def op(w) -> dict | None:
        raw = w.meta(SUPERSEDED)
        if raw is None:
            return None
        try:
            info = msgpack.unpackb(raw, raw=False)
        except Exception:  # a mark this version cannot read is removed all the same
            info = {}
        info = info if isinstance(info, dict) else {}
        w.delete_local_meta(SUPERSEDED)
        sid = info.get("standby_id")
        dropped = sid if isinstance(sid, str) and slots.remove_slot(w, sid) else None
        return {"superseded_by": info.get("by"), "timeline": info.get("timeline"),
                "at": info.get("at"), "dropped_slot": dropped}
    return store.write(op)
