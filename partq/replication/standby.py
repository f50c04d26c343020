"""The standby side of DR-standby replication: keeps the local store identical to a primary's.

The standby connects (TLS when given a context), runs the client side of ``partq.wire``'s
handshake (with a token it checks the primary's proof too, so an impostor cannot feed it a
store), and says what it holds: its id, applied LSN, timeline and that commit's checksum, and
the hash of its slot secret (``supersede``: made before its first connection, kept through
snapshots and promotion, so that once promoted it can prove it followed this primary). It
refuses to follow a primary whose history does not contain its own (``timeline``), as the
primary refuses it. Then it applies each frame of changes in one transaction that also records
the new applied LSN (``Writer.apply``, next to the methods that recorded the changes), so a
resent frame is skipped and a reconnect resumes exactly where it stopped; then it acks. An
entry larger than a frame arrives in parts and is applied once whole.
"""
from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import uuid

from partq.errors import (
    AuthenticationFailed,
    Diverged,
    FrameError,
    PartqError,
    PeerRefused,
    ProtocolMismatch,
    ReplicationRefused,
)
from partq.replication import timeline
from partq.replication.protocol import (
    HANDSHAKE_TIMEOUT,
    LINK_TIMEOUT,
    MAX_FRAME,
    ROLE,
    SECRET_BYTES,
    ReplicationOptions,
    bytes_field,
    expect,
    head_fields,
    int_field,
    kind,
    lsn_field,
)
from partq.replication.settings import FENCE_ERROR, FENCE_TARGET
from partq.replication.snapshot import install_snapshot, received, remove_leftovers
from partq.replication.status import ReplicationStatus, u64
from partq.replication.supersede import SECRET, verifier
from partq.storage.checksum import crc32c
from partq.storage.encoding import pack_u64
from partq.storage.writer import decode_change
from partq.wire.frames import parse_address, recv_frame, send_frame
from partq.wire.handshake import client_handshake

log = logging.getLogger("partq.replication")

MAX_ENTRIES = 4096            # change-log entries in one frame at most
FOLLOWED = b"followed"        # local meta: the address of the primary this standby follows
RETRY_REFUSED = 5.0           # seconds between attempts after a refusal (auth, divergence)


class StandbyFollower:
    """Runs in the standby: keeps the local store identical to the primary's."""

    def __init__(self, store, primary: str, options: ReplicationOptions = ReplicationOptions()) \
            -> None:
        self.store = store
        self.primary = primary
        self.options = options
        self._addr = parse_address(primary)
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self.connected = False
        self.head = 0
        self.head_time_ns = 0
        self.head_msgs = 0
        self.last_error: str | None = None
        self._part: tuple[int, int, list[bytes], int] | None = None   # lsn, size, chunks, got
        remove_leftovers(store.path)
        self._thread = threading.Thread(target=self._run, name="partq-standby", daemon=True)
        self._thread.start()

    def _meta(self, key: bytes) -> bytes | None:
        with self.store.read() as r:
            return r.meta(key)

    def _standby_id(self) -> str:
        raw = self._meta(b"standby_id")
        if raw is not None:
            return raw.decode()
        sid = uuid.uuid4().hex
        self.store.write(lambda w: w.put_local_meta(b"standby_id", sid.encode()))
        return sid

    def _verifier(self) -> bytes:
        """The hash of this standby's slot secret (the secret is made at the first call)."""
        secret = self._meta(SECRET)
        if secret is None:
            secret = os.urandom(SECRET_BYTES)
            self.store.write(lambda w: w.put_local_meta(SECRET, secret))
        return verifier(secret)

    def _position(self) -> tuple[timeline.History, int | None, int | None]:
        """(history, applied LSN or None, crc32c of the applied entry or None)."""
        with self.store.read() as r:
            history = timeline.read_history(r)
            applied, crc = r.meta(b"applied_lsn"), r.meta(b"applied_crc")
        return history, None if applied is None else u64(applied), None if crc is None else u64(crc)

    # ------------------------------------------------------------------ the link
    def _run(self) -> None:
        backoff = 0.05
        last_refusal = None
        while not self._stop.is_set():
            try:
                sock = socket.create_connection(self._addr, timeout=HANDSHAKE_TIMEOUT)
            except OSError as exc:
                self.last_error = f"cannot reach primary {self.primary}: {exc}"
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            self._sock = sock
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(HANDSHAKE_TIMEOUT)
                if self.options.ssl_context is not None:
                    sock = self._sock = self.options.ssl_context.wrap_socket(
                        sock, server_hostname=self._addr[0])
                history, applied, crc = self._position()
                client_handshake(sock, ROLE, self.options.token, HANDSHAKE_TIMEOUT,
                                 standby_id=self._standby_id(), applied_lsn=applied,
                                 timeline=timeline.current(history), applied_crc=crc,
                                 verifier=self._verifier())
                sock.settimeout(LINK_TIMEOUT)
                backoff = 0.05
                self._follow(sock)
            except (ReplicationRefused, AuthenticationFailed, PeerRefused,
                    ProtocolMismatch) as exc:
                self.last_error = str(exc)
                level = logging.ERROR if str(exc) != last_refusal else logging.DEBUG
                log.log(level, "standby of %s refused: %s", self.primary, exc)
                last_refusal, backoff = str(exc), RETRY_REFUSED
            except (FrameError, OSError, ssl.SSLError, PartqError) as exc:
                if not self._stop.is_set():
                    self.last_error = str(exc) or type(exc).__name__
                    log.warning("standby link to %s ended: %s; resuming", self.primary,
                                self.last_error)
            except Exception as exc:  # a bug: log it, back off, try again
                self.last_error = repr(exc)
                log.exception("standby link to %s failed", self.primary)
                backoff = 1.0
            finally:
                self.connected = False
                self._part = None
                sock.close()
            self._stop.wait(backoff)

    def _follow(self, sock: socket.socket) -> None:
        first = recv_frame(sock, MAX_FRAME)
        if kind(first) == "refused":
            raise ReplicationRefused(f"the primary refused this standby: {first.get('reason')}")
        start = expect(first, "start")
        self._check_history(timeline.from_wire(start.get("timelines")), lsn_field(start, "head"))
        self.connected = True
        while not self._stop.is_set():
            frame = recv_frame(sock, MAX_FRAME)
            what = kind(frame)
            if what == "wait":
                continue
            if what == "snapshot":
                with received(sock, frame, self.store) as (tmp, lsn, crc_at, proof):
                    install_snapshot(self.store, tmp, lsn, crc_at, proof)
                log.info("standby loaded a %d-byte snapshot at LSN %d", frame["size"], lsn)
                continue
            if what == "part":
                entry = self._take_part(frame)
                if entry is None:
                    continue               # more parts follow; the last one is acked
                entries = [entry]
            else:
                entries = self._entries(expect(frame, "changes", "heartbeat"))
            head = head_fields(frame)
            applied = self._apply(entries) if entries else self._position()[1] or 0
            self.head, self.head_time_ns, self.head_msgs = head
            send_frame(sock, {"type": "ack", "lsn": applied})

    def _check_history(self, history: timeline.History, head: int | None) -> None:
        """Refuse a primary whose history does not hold this standby's; adopt it otherwise
        (a promoted standby extends it)."""
        mine, applied, _ = self._position()
        reason = timeline.divergence(history, head or 0, timeline.current(mine), applied or 0)
        if reason is not None:
            raise ReplicationRefused(f"{reason}; re-snapshot this standby: move its directory "
                                     f"aside and start it on a new one")
        if history != mine:
            encoded = timeline.encode_history(history)
            self.store.write(lambda w: w.put_local_meta(timeline.KEY, encoded))

    @staticmethod
    def _entries(frame: dict) -> list[bytes]:
        entries = frame.get("entries")
        if not isinstance(entries, list) or len(entries) > MAX_ENTRIES \
                or not all(isinstance(e, bytes) for e in entries):
            raise FrameError("malformed changes frame")
        return entries

    def _take_part(self, frame: dict) -> bytes | None:
        """Collect one part of a large entry; return the entry once complete."""
        lsn = lsn_field(frame, "lsn") or 0
        size = int_field(frame, "size", 1, self.store.max_map_size)
        offset = int_field(frame, "offset", 0, size - 1)
        data = bytes_field(frame, "data")
        if offset == 0:
            self._part = (lsn, size, [], 0)
        part = self._part
        if part is None or part[0] != lsn or part[1] != size or part[3] != offset:
            raise FrameError("a part of a large change-log entry arrived out of order")
        got = offset + len(data)
        if got > size:
            raise FrameError(f"the parts of LSN {lsn} pass the {size} bytes announced")
        part[2].append(data)
        self._part = (lsn, size, part[2], got)
        if got < size:
            return None
        self._part = None
        return b"".join(part[2])

    def _apply(self, entries: list[bytes]) -> int:
        def op(w):
            applied = u64(w.meta(b"applied_lsn"))
            last = None
            for raw in entries:
                try:
                    lsn, time_ns, msgs_total, changes = decode_change(raw)
                except Exception:
                    raise FrameError("undecodable change-log entry") from None
                if type(lsn) is not int or lsn <= applied:
                    continue              # already applied: a resent frame
                if lsn != applied + 1:
                    raise FrameError(f"change log gap: have {applied}, got {lsn}")
                for change in changes:
                    try:
                        w.apply(change)
                    except (Diverged, ValueError, TypeError) as exc:
                        raise FrameError(str(exc)) from None
                applied, last = lsn, (time_ns, msgs_total, crc32c(raw))
            w.put_local_meta(b"applied_lsn", pack_u64(applied))
            if last is not None:
                w.put_local_meta(b"applied_time_ns", pack_u64(last[0]))
                w.put_local_meta(b"msgs_total", pack_u64(last[1]))   # the primary's count
                w.put_local_meta(b"applied_crc", pack_u64(last[2]))
            return applied
        return self.store.write(op)

    def status(self) -> ReplicationStatus:
        with self.store.read() as r:
            applied = u64(r.meta(b"applied_lsn"))
            applied_time = u64(r.meta(b"applied_time_ns"))
            msgs = u64(r.meta(b"msgs_total"))
        head = max(self.head, applied)
        lag_s = 0.0
        if head > applied and self.head_time_ns:
            lag_s = max(0.0, (self.head_time_ns - applied_time) / 1e9) if applied_time else 0.0
        return ReplicationStatus(
            role="standby", mode=None, connected=self.connected, head_lsn=head, applied_lsn=applied,
            lag_messages=max(0, self.head_msgs - msgs) if head > applied else 0,
            lag_seconds=lag_s, primary=self.primary, token=self.options.token is not None,
            tls=self.options.ssl_context is not None, last_error=self.last_error)

    def close(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=10)


def followed(store) -> str | None:
    """The address of the primary this standby follows (or followed, once promoted)."""
    with store.read() as r:
        raw = r.meta(FOLLOWED)
    return None if raw is None else raw.decode(errors="replace")


def promote_store(w) -> int:
    """Make a standby's store a primary's (in one write transaction): its LSN continues from
    what it applied, on a new timeline; the primary it followed is to be told it is superseded
    (``settings.FENCE_TARGET``). Returns that LSN."""
    applied = w.meta(b"applied_lsn")
    lsn = max(u64(w.meta(b"lsn")), u64(applied))
    w.put_local_meta(b"lsn", pack_u64(lsn))
    timeline.begin_timeline(w, lsn)
    w.delete_local_meta(b"role")
    followed = w.meta(FOLLOWED)
    if followed is not None:
        w.put_local_meta(FENCE_TARGET, followed)
        w.delete_local_meta(FENCE_ERROR)
    return lsn
