"""Replication slots: what a primary keeps for each standby it serves, and the bound on it.

A slot (meta ``slots``: standby id -> acked LSN, created, last seen, address, verifier) keeps
the change log after its standby's acked LSN, so a standby that reconnects resumes instead of
starting over. Slots are created only for a standby that passed the handshake (``register``),
at most ``max_slots`` of them. While the ``slots`` key exists every commit writes the change log
(``Writer.finish``).

The verifier is the hash of a secret the standby keeps (``supersede``): it ties the slot to the
standby that made it, so another peer cannot take the slot over by its id, and only that
standby, once promoted, can prove it followed this primary. The primary keeps the hash, never
the secret: its meta travels in every snapshot it sends.

The bound (PostgreSQL's ``max_slot_wal_keep_size``): when the change log passes
``max_slot_keep`` bytes, the slot of the standby furthest behind is invalidated (removed, and
remembered under ``slots_invalidated`` for `partq dr slots`) and the log trimmed after the next
one; that standby starts again from a snapshot when it comes back. The commit that passes the
bound is followed at once by the trim (``BoundAtCommit``), so no lagging thread lets the log
grow past it. So an absent standby never fills the primary's disk, and `partq dr drop-slot ID` removes a
slot at once.

The size is LMDB's page count of the change-log database: after a trim it holds exactly what
the slowest slot keeps, so "bytes behind" of that slot is read in O(1).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import msgpack

from partq.errors import PartqError, ReplicationRefused
from partq.replication.status import ReplicationStatus, StandbyLink, lag, primary_status, u64

log = logging.getLogger("partq.replication")

KEY = b"slots"
INVALID_KEY = b"slots_invalidated"
MAINTAIN_EVERY = 0.5          # seconds between a primary's trims and slot checks at most
CHECK_AFTER_COMMIT = 0.05     # seconds after a commit that wrote the change log, at least
MAX_INVALID_KEPT = 32         # invalidated slots remembered for `partq dr slots`


@dataclass
class Slot:
    standby_id: str
    acked: int                 # the standby has every commit up to this LSN durably
    created: float             # wall-clock time the slot was made
    seen: float                # wall-clock time of its last ack (0: none yet)
    address: str = ""          # where its last connection came from
    verifier: bytes | None = None   # hash of the standby's secret (None: made by older partq)
    snapshot_lsn: int | None = None        # the last snapshot sent to it, and the hash of the
    snapshot_proof: bytes | None = None    # proof that came with it (``note_snapshot``)


def read_slots(r) -> dict[str, Slot]:
    raw = r.meta(KEY)
    out: dict[str, Slot] = {}
    for sid, value in (msgpack.unpackb(raw, raw=False) if raw else {}).items():
        if isinstance(value, int):          # the earlier format: the acked LSN alone
            out[sid] = Slot(sid, value, 0.0, 0.0)
        else:
            verifier, proof = value.get("verifier"), value.get("snapshot_proof")
            snapshot_lsn = value.get("snapshot_lsn")
            out[sid] = Slot(sid, int(value["acked"]), float(value.get("created", 0.0)),
                            float(value.get("seen", 0.0)), str(value.get("address", "")),
                            verifier if isinstance(verifier, bytes) else None,
                            snapshot_lsn if isinstance(snapshot_lsn, int) else None,
                            proof if isinstance(proof, bytes) else None)
    return out


def log_every_commit(w) -> None:
    """Make every commit write the change log, slots or not (a sync-mode primary: its gate holds
    callers by LSN, so a commit without one would return unconfirmed)."""
    if w.meta(KEY) is None:
        w.put_local_meta(KEY, msgpack.packb({}))


def read_invalidated(r) -> dict[str, dict]:
    raw = r.meta(INVALID_KEY)
    return msgpack.unpackb(raw, raw=False) if raw else {}


def write_slots(w, slots: dict[str, Slot], keep_log: bool = False) -> None:
    """Store the slots. With none the key goes, and with it the change log's cost on every
    commit, unless ``keep_log`` (a sync-mode primary may want LSNs: an existing key stays)."""
    if slots or (keep_log and w.meta(KEY) is not None):
        w.put_local_meta(KEY, msgpack.packb({sid: {k: v for k, v in asdict(s).items()
                                                    if k != "standby_id"}
                                             for sid, s in slots.items()}))
    elif w.meta(KEY) is not None:
        w.delete_local_meta(KEY)


def change_log_bytes(r) -> int:
    st = r.db_stat("changes")
    return (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]


def _trim_point(r, slots: dict[str, Slot]) -> int:
    """Every change-log entry at or below this LSN is needed by no slot."""
    return min((s.acked for s in slots.values()), default=u64(r.meta(b"lsn")))


def _same_digest(a: bytes, b: bytes) -> bool:
    import hmac  # (a primary serving standbys only: not loaded by every process that writes)
    return hmac.compare_digest(a, b)


def register(w, standby_id: str, position: int, address: str, max_slots: int,
             verifier: bytes | None = None) -> Slot:
    """The slot of a standby that passed the handshake, made if new (keeping the change log
    after ``position``) with the ``verifier`` of the standby's secret. Raises
    ``ReplicationRefused`` when ``max_slots`` exist already, or when the slot belongs to a
    standby with another secret (a slot made by older partq takes the first one offered)."""
    slots = read_slots(w)
    slot = slots.get(standby_id)
    if slot is None:
        if len(slots) >= max_slots:
            raise ReplicationRefused(
                f"the primary has {len(slots)} replication slots, its limit (max_slots); drop an "
                f"unused one with `partq dr drop-slot ID` (see `partq dr slots`)")
        slot = slots[standby_id] = Slot(standby_id, position, time.time(), 0.0, address, verifier)
    elif slot.verifier is None:
        slot.verifier = verifier
    elif verifier is None or not _same_digest(verifier, slot.verifier):
        raise ReplicationRefused(
            f"the replication slot of standby {standby_id} belongs to the standby that made it, "
            f"which proves a secret this connection does not: if this is that standby, restored "
            f"from an older copy of its directory or run by an older partq, drop the slot with "
            f"`partq dr drop-slot {standby_id}` on the primary (it then starts again from a "
            f"snapshot); a new standby must not reuse another's directory or id")
    slot.address = address
    invalid = read_invalidated(w)
    if invalid.pop(standby_id, None) is not None:
        w.put_local_meta(INVALID_KEY, msgpack.packb(invalid))
    write_slots(w, slots, keep_log=True)
    return slot


def note_snapshot(w, standby_id: str, lsn: int, proof: bytes) -> None:
    """Record, before it is sent, that a snapshot at ``lsn`` goes to standby ``standby_id`` with
    a proof whose hash is ``proof`` (the proof comes after the last chunk, so only a standby
    that read it all holds it: ``supersede``)."""
    slots = read_slots(w)
    slot = slots.get(standby_id)
    if slot is not None:            # dropped meanwhile: nothing to record
        slot.snapshot_lsn, slot.snapshot_proof = lsn, proof
        write_slots(w, slots, keep_log=True)


def record_acks(w, acks: dict[str, tuple[int, float]], keep_log: bool) -> None:
    """Persist the acked positions of connected standbys (never making a dropped slot again)."""
    slots = read_slots(w)
    for sid, (acked, seen) in acks.items():
        slot = slots.get(sid)
        if slot is not None:
            slot.acked, slot.seen = max(slot.acked, acked), max(slot.seen, seen)
    write_slots(w, slots, keep_log)


def maintain(w, max_keep: int, keep_log: bool) -> list[str]:
    """Trim the change log to what the slots need; invalidate the slowest slot while the log
    is larger than ``max_keep`` bytes. Returns the invalidated standby ids."""
    slots = read_slots(w)
    w.trim_changes(_trim_point(w, slots))
    gone: list[str] = []
    while slots and change_log_bytes(w) > max_keep:
        slowest = min(slots.values(), key=lambda s: s.acked)
        del slots[slowest.standby_id]
        gone.append(slowest.standby_id)
        invalid = read_invalidated(w)
        invalid[slowest.standby_id] = {
            "at": time.time(), "acked": slowest.acked,
            "reason": f"the change log it kept passed max_slot_keep={max_keep} bytes"}
        keep = sorted(invalid.items(), key=lambda kv: kv[1]["at"])[-MAX_INVALID_KEPT:]
        w.put_local_meta(INVALID_KEY, msgpack.packb(dict(keep)))
        w.trim_changes(_trim_point(w, slots))
    write_slots(w, slots, keep_log)
    return gone


class BoundAtCommit:
    """The change-log guard a writing primary installs (``Store.guard_change_log``): a commit
    that takes the log past ``max_keep`` bytes is followed at once by a transaction that
    records the positions ``acks()`` knows (a serving primary's connected standbys) and
    invalidates slots until the log fits. So the log never passes ``max_keep`` by more than
    one commit, however far the upkeep threads lag."""

    def __init__(self, max_keep: int, acks: Callable[[], dict] = dict) -> None:
        self.max_keep = max_keep
        self.acks = acks

    def over(self, r) -> bool:
        return change_log_bytes(r) > self.max_keep

    def trim(self, w) -> None:
        if not self.over(w):
            return
        record_acks(w, self.acks(), keep_log=True)
        for sid in maintain(w, self.max_keep, keep_log=True):
            log.warning("invalidated the replication slot of standby %s: the change log it "
                        "kept passed max_slot_keep=%d bytes; it starts again from a snapshot "
                        "when it comes back", sid, self.max_keep)


def needs_maintenance(r, max_keep: int, keep_log: bool) -> bool:
    """Whether ``maintain`` would change anything (read first: most checks write nothing)."""
    raw = r.meta(KEY)
    if raw is None:
        return r.first_change_lsn() is not None
    slots = read_slots(r)
    first = r.first_change_lsn()
    if not slots and not keep_log:
        return True
    return (first is not None and first <= _trim_point(r, slots)) \
        or change_log_bytes(r) > max_keep


def remove_slot(w, standby_id: str) -> bool:
    """In a write transaction: remove a standby's slot and trim what only it kept; False when
    there is none."""
    slots = read_slots(w)
    if slots.pop(standby_id, None) is None:
        return False
    # the key stays (empty) for a sync-mode primary's sake: the process that serves or
    # writes removes it when nothing needs the change log any more
    write_slots(w, slots, keep_log=True)
    w.trim_changes(_trim_point(w, slots))
    return True


def drop_slot(store, standby_id: str) -> bool:
    """Remove a standby's slot and trim what only it kept; False when there is none. A
    standby still running comes back with a new slot and starts from a snapshot."""
    return store.write(lambda w: remove_slot(w, standby_id))


def list_slots(store) -> list[dict]:
    """Every slot with its lag (changes, messages, seconds) and age, then the invalidated ones:
    what `partq dr slots` prints."""
    now = time.time()
    with store.read() as r:
        head, msgs = u64(r.meta(b"lsn")), u64(r.meta(b"msgs_total"))
        out = []
        for slot in sorted(read_slots(r).values(), key=lambda s: s.created):
            lag_msgs, lag_s = lag(r, slot.acked, head, msgs)
            out.append({"standby_id": slot.standby_id, "state": "active",
                        "acked_lsn": slot.acked, "lag_changes": max(0, head - slot.acked),
                        "lag_messages": lag_msgs, "lag_seconds": round(lag_s, 3),
                        "age_seconds": round(now - slot.created, 3) if slot.created else None,
                        "idle_seconds": round(now - slot.seen, 3) if slot.seen else None,
                        "address": slot.address or None})
        for sid, info in sorted(read_invalidated(r).items(), key=lambda kv: kv[1]["at"]):
            out.append({"standby_id": sid, "state": "invalidated", "acked_lsn": info["acked"],
                        "lag_changes": None, "lag_messages": None, "lag_seconds": None,
                        "age_seconds": round(now - info["at"], 3), "idle_seconds": None,
                        "address": None, "reason": info["reason"]})
        return out


class SlotKeeper:
    """Keeps the bound in a process that writes to a primary with slots but does not serve
    replication (a service opened without ``replication_listen``, a `partq` command): soon
    after this process's commits wrote the change log it trims and checks ``max_slot_keep``.
    A process that only reads never writes here. It ends with its store."""

    def __init__(self, store, max_keep: int) -> None:
        self.store = store
        self.max_keep = max_keep
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._seen_lsn = store.last_lsn
        store.on_commit(self._on_commit)
        self._guard = BoundAtCommit(max_keep)
        store.guard_change_log(self._guard)
        self._thread = threading.Thread(target=self._run, name="partq-slot-keeper", daemon=True)
        self._thread.start()

    def _on_commit(self, appended: int) -> None:
        if self.store.last_lsn != self._seen_lsn:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(MAINTAIN_EVERY)
            self._wake.clear()
            try:
                self.store.check_usable()
            except PartqError:
                return                      # the store was closed: so is this keeper
            lsn = self.store.last_lsn
            if lsn == self._seen_lsn:
                continue
            self._seen_lsn = lsn
            try:
                # keep_log: the key stays, even empty, for a sync-mode primary another process
                # may run (only a primary serving replication removes it)
                check(self.store, self.max_keep, keep_log=True)
            except Exception:       # a closed store or a full disk: the next commit tries again
                log.debug("slot maintenance failed", exc_info=True)
            self._stop.wait(CHECK_AFTER_COMMIT)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self.store.remove_commit_hook(self._on_commit)
        self.store.remove_change_log_guard(self._guard)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)


def check(store, max_keep: int, keep_log: bool) -> list[str]:
    """Run ``maintain`` when it would change something; log invalidated slots."""
    with store.read() as r:
        if not needs_maintenance(r, max_keep, keep_log):
            return []
    gone = store.write(lambda w: maintain(w, max_keep, keep_log))
    for sid in gone:
        log.warning("invalidated the replication slot of standby %s: the change log it kept "
                    "passed max_slot_keep=%d bytes; it starts again from a snapshot when it "
                    "comes back", sid, max_keep)
    return gone


def stored_status(store, role: str) -> ReplicationStatus:
    """Replication status as any process can read it from the store: the standbys' positions
    the serving primary last stored (every 0.5 s) against the change log. Used by `partq dr
    status` and the scaling procedure's DR wait, which run outside the primary process."""
    with store.read() as r:
        if role == "standby":
            applied = u64(r.meta(b"applied_lsn"))
            return ReplicationStatus(role=role, mode=None, connected=False, head_lsn=applied,
                                     applied_lsn=applied, lag_messages=0, lag_seconds=0.0)
        head, msgs = u64(r.meta(b"lsn")), u64(r.meta(b"msgs_total"))
        links = []
        for slot in read_slots(r).values():
            lag_msgs, lag_s = lag(r, slot.acked, head, msgs)
            links.append(StandbyLink(slot.standby_id, False, slot.acked, head - slot.acked,
                                     lag_msgs, lag_s, slot.address or None))
        return primary_status(r, links, None)
