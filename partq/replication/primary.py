"""The primary side of DR-standby replication (rule `replication`).

The primary logs every commit's logical changes under a log sequence number (LSN) while a
standby slot exists (``storage.writer.Writer.finish``). Standbys connect through a ``Listener``
(role ``"replication"``: TLS when configured, the token's challenge-response, a handshake
timeout, a connection limit, and protected mode, loopback only, without a token). For a standby
that passed the handshake the primary checks that the standby's history is a prefix of its own
(``timeline``; a standby that is not is refused and told to re-snapshot), registers its slot
(``slots``) and sends either the change log after the standby's LSN or, when those changes are
gone (or the standby is new), a snapshot (``snapshot``, one at a time) followed by the log.

Modes: ``async`` (default): publish returns after the local commit; the standby follows.
``sync``: callers whose commit wrote changes are held until one standby acked that LSN (durable
on the standby; ``gate``), or fail with ``ReplicationTimeout`` after ``sync_timeout`` seconds
(the message is then stored on the primary but not known to be on a standby: an unknown
outcome, as in Kafka). A sync primary with no standby holds every such publish until the
timeout, as PostgreSQL does with ``synchronous_standby_names`` set.

Every start of a listener begins a new timeline, so a primary restored from a file backup never
hands a standby LSNs that name other commits than the ones it applied.
"""
from __future__ import annotations

import dataclasses
import logging
import socket
import ssl
import threading
import time

import msgpack

from partq.errors import FrameError, InvalidConfig, PartqError, ReplicationRefused
from partq.replication import slots, timeline
from partq.replication.protocol import (
    ACK_FRAME,
    BATCH_BYTES,
    HEARTBEAT,
    LINK_TIMEOUT,
    PART_BYTES,
    ROLE,
    ReplicationOptions,
    batches,
    expect,
    lsn_field,
    standby_hello,
)
from partq.replication.settings import check_sync_timeout
from partq.replication.snapshot import SnapshotSender, remove_leftovers
from partq.replication.status import (
    ReplicationStatus,
    StandbyLink,
    lag,
    primary_status,
    stored_messages,
    u64,
)
from partq.replication.supersede import claim_from, mark_superseded, superseded
from partq.replication.sync_gate import SyncGate
from partq.storage.checksum import crc32c
from partq.wire.frames import recv_frame, send_frame
from partq.wire.listener import Listener

log = logging.getLogger("partq.replication")

MAX_ENTRIES_PER_FRAME = 512
GATE_POLL = 0.05               # seconds between checks of held sync-mode callers' deadlines
SEEN_EVERY = 10.0              # seconds between stores of an idle standby's last-seen time


def entry_header(raw: bytes) -> tuple[int, int, int]:
    """(LSN, commit time in ns, messages appended up to it) of a change-log entry, read from its
    first bytes: an entry of hundreds of MiB is not decoded to learn its LSN."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(raw[:64])
    unpacker.read_array_header()
    return unpacker.unpack(), unpacker.unpack(), unpacker.unpack()


@dataclasses.dataclass(frozen=True)
class _Admission:
    """What the primary decided for a standby that passed the handshake."""
    history: list
    head: int
    resume_after: int | None       # its applied LSN when the change log still holds the rest
    refusal: str | None            # why it is refused (its history is not the primary's)


class _Link:
    """One connected standby, as the primary tracks it."""

    def __init__(self, standby_id: str, address: str, generation: int) -> None:
        self.standby_id = standby_id
        self.address = address
        self.generation = generation
        self.acked = -1                # -1 while bootstrapping (nothing confirmed yet)
        self.seen = 0.0
        self.connected = True
        self.ended: str | None = None  # set to end the link from outside (slot removed)


class ReplicationServer:
    """Runs in the primary: accepts standbys and ships them the change log."""

    def __init__(self, store, listen: str, mode: str, sync_timeout: float,
                 options: ReplicationOptions = ReplicationOptions()) -> None:
        if mode not in ("async", "sync"):
            raise InvalidConfig(f"replication_mode must be 'async' or 'sync', not {mode!r}")
        timeout = check_sync_timeout(sync_timeout)
        self.store = store
        self.mode = mode
        self.options = options
        self.max_slot_keep = options.slot_keep(store.max_map_size)
        self._stop = threading.Event()
        self._new_commit = threading.Condition()
        self._links: dict[str, _Link] = {}
        self._links_lock = threading.Lock()
        self._generation = 0
        self._persisted: dict[str, int] = {}       # acked LSNs last stored, and when
        self._persisted_at = 0.0
        self._head_time = (0, 0)           # (LSN, its commit time): read once per new head
        self._wake = threading.Event()     # a commit happened: check the change log's bound
        self.gate = SyncGate(timeout) if mode == "sync" else None
        remove_leftovers(store.path)
        self.timeline = store.write(self._begin_incarnation)
        self._snapshots = SnapshotSender(store, self._stop)
        store.on_commit(self._on_commit)
        self._guard = slots.BoundAtCommit(self.max_slot_keep, self._link_acks)
        store.guard_change_log(self._guard)
        if self.gate is not None:
            store.set_sync_gate(self.gate)
        try:
            self.listener = Listener(listen, ROLE, self._serve, token=options.token,
                                     ssl_context=options.ssl_context, limits=options.limits)
        except BaseException:
            self._unhook()
            raise
        self.address = self.listener.address
        self._maintainer = threading.Thread(target=self._maintain_loop, name="partq-repl-maintain",
                                            daemon=True)
        self._maintainer.start()
        log.info("serving DR-standbys on %s (%s mode, %s, %s, timeline %s)", self.address, mode,
                 "token" if options.token else "no token: protected mode",
                 "TLS" if options.ssl_context else "no TLS", self.timeline)

    def _begin_incarnation(self, w) -> str:
        tid = timeline.begin_timeline(w, u64(w.meta(b"lsn")))
        if self.gate is not None:      # commits need LSNs for the gate to hold them
            slots.log_every_commit(w)
        return tid

    def _on_commit(self, appended: int) -> None:
        with self._new_commit:
            self._new_commit.notify_all()
        self._wake.set()

    # ------------------------------------------------------------------ one standby
    def _serve(self, sock: socket.socket, hello: dict, where: str) -> None:
        """The listener's handler: runs after the handshake, in the connection's thread."""
        link = None
        try:
            sock.settimeout(LINK_TIMEOUT)
            if "supersedes" in hello:
                self._superseded_by(sock, hello, where)
                return
            try:
                info = standby_hello(hello)
            except FrameError as exc:
                raise ReplicationRefused(f"malformed standby hello: {exc}") from None
            admitted = self.store.write(lambda w: self._admit(w, info, where))
            if admitted.refusal is not None:
                raise ReplicationRefused(admitted.refusal)
            link = self._attach(info.standby_id, where)
            send_frame(sock, {"type": "start", "head": admitted.head,
                              "timelines": [list(t) for t in admitted.history]})
            if admitted.resume_after is not None:
                sent = admitted.resume_after
            else:
                sent = self._snapshots.send(sock, info.standby_id)
            self._stream(sock, link, sent)
        except ReplicationRefused as exc:
            log.warning("refused standby %s from %s: %s", hello.get("standby_id"), where, exc)
            try:
                send_frame(sock, {"type": "refused", "reason": str(exc)})
            except OSError:
                pass
        except (FrameError, OSError, ssl.SSLError, PartqError) as exc:
            if not self._stop.is_set():
                log.warning("replication link to standby %s ended: %s",
                            hello.get("standby_id"), exc or type(exc).__name__)
        finally:
            if link is not None:
                with self._links_lock:
                    if self._links.get(link.standby_id) is link:   # not a newer connection's
                        link.connected = False

    def _superseded_by(self, sock: socket.socket, hello: dict, where: str) -> None:
        """A promoted standby of this primary says so (``supersede``): mark the directory, which
        refuses writes from now on, and answer; a claim it cannot prove (that standby's slot
        secret, a history forked from this one's at a commit this primary streamed it) is
        refused and changes nothing."""
        try:
            claim = claim_from(hello)
        except FrameError as exc:
            raise ReplicationRefused(f"malformed supersede request: {exc}") from None
        who = f"standby {claim.standby_id} ({where})"
        acks = self._link_acks()
        reason = self.store.write(lambda w: mark_superseded(w, claim, who, acks))
        if reason is not None:
            raise ReplicationRefused(f"{who} cannot supersede this primary: {reason}")
        log.error("%s: %s was promoted and superseded this primary: it refuses writes now",
                  self.store.path, who)
        send_frame(sock, {"type": "superseded"})

    def _admit(self, w, info, where: str) -> _Admission:
        """In one write transaction: check the standby's history, choose resume or snapshot,
        and register its slot (so no trim can remove what it resumes from)."""
        history, head = timeline.read_history(w), u64(w.meta(b"lsn"))
        if superseded(w):
            return _Admission(history, head, None, (
                "this primary was superseded by a promoted standby: follow the new primary"))
        applied = info.applied_lsn
        reason = timeline.divergence(history, head, info.timeline, applied or 0)
        if reason is None and applied and info.applied_crc is not None:
            entry = w.change(applied)
            if entry is not None and crc32c(entry) != info.applied_crc:
                reason = (f"the standby's commit at LSN {applied} is not this primary's (the "
                          f"primary was restored from an older copy and wrote other commits)")
        if reason is not None:
            return _Admission(history, head, None, (
                f"{reason}; re-snapshot the standby: stop it, move its directory aside (it holds "
                f"the commits in question) and start it on a new one"))
        first = w.first_change_lsn()
        first = head + 1 if first is None else first
        resume = applied is not None and first - 1 <= applied <= head
        slots.register(w, info.standby_id, applied if resume else head, where,
                       self.options.max_slots, info.verifier)
        return _Admission(history, head, applied if resume else None, None)

    def _attach(self, standby_id: str, address: str) -> _Link:
        with self._links_lock:
            self._generation += 1
            link = self._links[standby_id] = _Link(standby_id, address, self._generation)
            return link

    def _stream(self, sock: socket.socket, link: _Link, sent: int) -> None:
        while not self._stop.is_set():
            if link.ended is not None:
                raise FrameError(link.ended)
            entries, head = self._read_after(sent)
            if entries and len(entries[0]) > PART_BYTES:
                sent = self._send_parts(sock, entries[0], head)
                entries = entries[:1]
            else:
                entries = batches(entries)
                send_frame(sock, {"type": "changes" if entries else "heartbeat",
                                  "entries": entries, **head})
                if entries:
                    sent = entry_header(entries[-1])[0]
            acked = lsn_field(expect(recv_frame(sock, ACK_FRAME), "ack"), "lsn") or 0
            if acked > sent or acked < link.acked:
                raise FrameError(f"the standby acked LSN {acked}, but was sent up to {sent} and "
                                 f"had acked {link.acked}: not a partq standby")
            with self._links_lock:
                if self._links.get(link.standby_id) is not link:
                    raise FrameError("superseded by a newer connection of the same standby")
                link.acked, link.seen = acked, time.time()
            if self.gate is not None:
                self.gate.acked(acked)
            if not entries:
                with self._new_commit:
                    if self.store.last_lsn <= sent and not self._stop.is_set():
                        self._new_commit.wait(HEARTBEAT)

    def _read_after(self, lsn: int) -> tuple[list[bytes], dict]:
        with self.store.read() as r:
            head = u64(r.meta(b"lsn"))
            msgs = u64(r.meta(b"msgs_total"))
            entries: list[bytes] = []
            if head > lsn:
                first = r.first_change_lsn()
                if first is None or first > lsn + 1:
                    raise FrameError(f"the change log no longer holds LSN {lsn + 1} (the slot "
                                     f"was invalidated or dropped): the standby starts again "
                                     f"from a snapshot")
                entries = r.changes_after(lsn, MAX_ENTRIES_PER_FRAME, BATCH_BYTES)
            if self._head_time[0] != head:
                raw = r.change(head) if head else None
                self._head_time = (head, entry_header(raw)[1] if raw else 0)
        return entries, {"head": head, "head_time_ns": self._head_time[1], "head_msgs": msgs}

    def _send_parts(self, sock: socket.socket, entry: bytes, head: dict) -> int:
        """An entry larger than a frame, in slices; the standby acks the last one."""
        lsn = entry_header(entry)[0]
        view = memoryview(entry)
        for offset in range(0, len(entry), PART_BYTES):
            send_frame(sock, {"type": "part", "lsn": lsn, "size": len(entry), "offset": offset,
                              "data": bytes(view[offset:offset + PART_BYTES]), **head})
        return lsn

    # ------------------------------------------------------------------ upkeep
    def _maintain_loop(self) -> None:
        """Every GATE_POLL: expire held sync-mode callers. Soon after a commit (at most every
        CHECK_AFTER_COMMIT), and every MAINTAIN_EVERY anyway: the slots' upkeep."""
        last = checked = 0.0
        while not self._stop.is_set():
            if time.monotonic() - checked < slots.CHECK_AFTER_COMMIT:
                self._stop.wait(GATE_POLL)     # too soon after the last check: no spinning
            else:
                self._wake.wait(GATE_POLL)
            if self.gate is not None:
                self.gate.expire()
            now = time.monotonic()
            due = now - last >= slots.MAINTAIN_EVERY
            if not due and not (self._wake.is_set() and now - checked >= slots.CHECK_AFTER_COMMIT):
                continue
            self._wake.clear()
            checked = now
            try:
                if due:
                    last = now
                    self._maintain()
                else:           # between full upkeeps: only the bound, which a burst may pass
                    slots.check(self.store, self.max_slot_keep, self.gate is not None)
            except PartqError as exc:       # a full disk, a closing store: try again later
                log.warning("replication slot upkeep failed: %s", exc)

    def _link_acks(self) -> dict[str, tuple[int, float]]:
        """Each connected standby's acked LSN and when it acked it."""
        with self._links_lock:
            return {sid: (link.acked, link.seen) for sid, link in self._links.items()
                    if link.acked >= 0}

    def _maintain(self) -> None:
        """Persist the standbys' positions, trim the change log, keep ``max_slot_keep``, and
        end the links of slots that are gone (invalidated here, or dropped by `partq dr`)."""
        acks = self._link_acks()
        keep_log = self.gate is not None
        positions = {sid: acked for sid, (acked, _) in acks.items()}
        if positions != self._persisted or time.monotonic() - self._persisted_at > SEEN_EVERY:
            self.store.write(lambda w: slots.record_acks(w, acks, keep_log))
            self._persisted, self._persisted_at = positions, time.monotonic()
        slots.check(self.store, self.max_slot_keep, keep_log)
        with self.store.read() as r:
            registered = slots.read_slots(r)
            unlogged = keep_log and r.meta(slots.KEY) is None
        if unlogged and not self._stop.is_set():     # another process removed the key
            self.store.write(slots.log_every_commit)
        with self._links_lock:
            for sid, link in self._links.items():
                if link.connected and sid not in registered:
                    link.ended = "its replication slot was removed (invalidated or dropped)"

    def status(self) -> ReplicationStatus:
        with self.store.read() as r:
            head = u64(r.meta(b"lsn"))
            msgs = u64(r.meta(b"msgs_total"))
            with self._links_lock:
                items = list(self._links.values())
            links = []
            for link in items:
                if link.acked < 0:         # bootstrapping: it has nothing confirmed yet
                    lag_msgs, lag_s = stored_messages(r), 0.0
                else:
                    lag_msgs, lag_s = lag(r, link.acked, head, msgs)
                links.append(StandbyLink(link.standby_id, link.connected, link.acked,
                                         head - link.acked, lag_msgs, lag_s, link.address))
            st = primary_status(r, links, self.mode)
        return dataclasses.replace(st, token=self.options.token is not None,
                                   tls=self.options.ssl_context is not None)

    def _unhook(self) -> None:
        self.store.remove_commit_hook(self._on_commit)
        self.store.remove_change_log_guard(self._guard)
        if self.gate is not None:
            self.store.set_sync_gate(None)
            self.gate.close()

    def close(self) -> None:
        """Stop serving: held sync-mode callers fail with ``ReplicationTimeout``, every link
        ends, and the port is free when this returns."""
        self._stop.set()
        with self._new_commit:
            self._new_commit.notify_all()
        self._unhook()
        self.listener.close()
        if threading.current_thread() is not self._maintainer:
            self._maintainer.join(timeout=10)
        try:
            self._maintain()
            if self.gate is not None:     # nothing needs LSNs once no sync primary serves
                slots.check(self.store, self.max_slot_keep, keep_log=False)
        except PartqError as exc:
            log.warning("replication slot upkeep at close failed: %s", exc)
