"""The standby side of DR-standby replication: keeps the local store identical to a primary's.

The standby applies each frame of changes in one transaction that also records the new applied
LSN (``Writer.apply``, next to the methods that recorded the changes), so a resent frame is
skipped and a reconnect resumes exactly where it stopped; then it acks.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import uuid

import crc32c

from partq.errors import Diverged, PartqError
from partq.replication.status import ReplicationStatus, u64
from partq.storage.encoding import pack_u64
from partq.storage.txn import decode_change
from partq.wire import FrameError, parse_address, recv_frame, send_frame

log = logging.getLogger("partq.replication")

HEARTBEAT = 0.5


def install_snapshot(store, snapshot_dir: str, lsn: int) -> None:
    """Load a snapshot received from the primary. It is copied into the live store in one
    transaction (readers never see a closed or half-loaded store, and a crash leaves the
    previous state), together with this standby's own meta keys."""
    with store.read() as r:
        standby_id = r.meta(b"standby_id")
    store.install_snapshot(snapshot_dir, {
        b"slots": None, b"role": b"standby", b"applied_lsn": pack_u64(lsn),
        b"standby_id": standby_id})


class StandbyFollower:
    """Runs in the standby: keeps the local store identical to the primary's."""

    def __init__(self, store, primary: str) -> None:
        self.store = store
        self.primary = primary
        self._addr = parse_address(primary)
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self.connected = False
        self.head = 0
        self.head_time_ns = 0
        self.head_msgs = 0
        self.last_error: str | None = None
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

    def _timeline(self) -> str | None:
        raw = self._meta(b"timeline")
        return None if raw is None else raw.decode()

    def _applied(self) -> int | None:
        raw = self._meta(b"applied_lsn")
        return None if raw is None else u64(raw)

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                sock = socket.create_connection(self._addr, timeout=5)
            except OSError as exc:
                self.last_error = f"cannot reach primary {self.primary}: {exc}"
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            self._sock = sock
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(HEARTBEAT * 10)
                send_frame(sock, {"type": "hello", "standby_id": self._standby_id(),
                                  "applied_lsn": self._applied(), "timeline": self._timeline()})
                self.connected = True
                backoff = 0.05
                self._follow(sock)
            except (FrameError, OSError, PartqError) as exc:
                if not self._stop.is_set():
                    self.last_error = str(exc)
                    log.warning("standby link to %s ended: %s; resuming", self.primary, exc)
            except Exception as exc:  # a bug: log it, back off, try again
                self.last_error = repr(exc)
                log.exception("standby link to %s failed", self.primary)
                backoff = 1.0
            finally:
                self.connected = False
                sock.close()
            self._stop.wait(backoff)

    def _follow(self, sock: socket.socket) -> None:
        while not self._stop.is_set():
            frame = recv_frame(sock)
            kind = frame.get("type") if isinstance(frame, dict) else None
            if kind == "snapshot":
                self._receive_snapshot(sock, frame)
                continue
            if kind not in ("changes", "heartbeat"):
                raise FrameError(f"unexpected frame {kind!r}")
            applied = self._apply(frame["entries"]) if frame["entries"] else self._applied() or 0
            self.head, self.head_time_ns, self.head_msgs = (frame["head"], frame["head_time_ns"],
                                                            frame["head_msgs"])
            send_frame(sock, {"type": "ack", "lsn": applied})

    def _receive_snapshot(self, sock: socket.socket, header: dict) -> None:
        tmp = tempfile.mkdtemp(prefix=".snapshot-", dir=self.store.path)
        try:
            path = os.path.join(tmp, "data.mdb")
            crc, size = 0, 0
            with open(path, "wb") as f:
                while True:
                    frame = recv_frame(sock)
                    if frame.get("type") == "snapshot_end":
                        break
                    if frame.get("type") != "chunk":
                        raise FrameError("expected a snapshot chunk")
                    data = frame["data"]
                    crc = crc32c.crc32c(data, crc)
                    size += len(data)
                    f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if crc != frame["crc"] or size != header["size"]:
                raise FrameError("snapshot failed its checksum")
            install_snapshot(self.store, tmp, header["lsn"])
            log.info("standby loaded a %d-byte snapshot at LSN %d", size, header["lsn"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _apply(self, entries: list[bytes]) -> int:
        def op(w):
            applied = u64(w.meta(b"applied_lsn"))
            last = None
            for raw in entries:
                lsn, time_ns, msgs_total, changes = decode_change(raw)
                if lsn <= applied:
                    continue              # already applied: a resent frame
                if lsn != applied + 1:
                    raise FrameError(f"change log gap: have {applied}, got {lsn}")
                for change in changes:
                    try:
                        w.apply(change)
                    except (Diverged, ValueError) as exc:
                        raise FrameError(str(exc)) from None
                applied, last = lsn, (time_ns, msgs_total)
            w.put_local_meta(b"applied_lsn", pack_u64(applied))
            if last is not None:
                w.put_local_meta(b"applied_time_ns", pack_u64(last[0]))
                w.put_local_meta(b"msgs_total", pack_u64(last[1]))   # the primary's count
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
            lag_seconds=lag_s, primary=self.primary)

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
