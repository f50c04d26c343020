"""The primary side of DR-standby replication (S27, seed 001's DR steps).

The primary logs every commit's logical changes under a log sequence number (LSN) while a standby
slot exists (``storage.txn.Writer.finish``). A standby connects and says who it is and what it
has applied; the primary registers its slot, then sends either the change log after that LSN or,
when those changes are gone (or the standby is new), a snapshot of the environment (taken from a
read transaction: the primary keeps running) followed by the change log.

Modes: ``async`` (default): publish returns after the local commit; the standby follows. ``sync``:
callers whose commit wrote changes are held until the standby acked that LSN (durable on the
standby), or fail with ``ReplicationTimeout`` after ``sync_timeout`` seconds (the message is then
stored on the primary but not known to be on the standby: an unknown outcome, as in Kafka).
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections import deque

import crc32c
import msgpack

from partq.errors import PartqError, ReplicationTimeout
from partq.replication.status import (
    ReplicationStatus,
    StandbyLink,
    lag,
    primary_status,
    read_slots,
    stored_messages,
    u64,
)
from partq.storage.txn import decode_change
from partq.wire import CHUNK, MAX_FRAME, FrameError, parse_address, recv_frame, send_frame

log = logging.getLogger("partq.replication")

MAX_ENTRIES_PER_FRAME = 512
HEARTBEAT = 0.5
TRIM_EVERY = 0.5          # seconds between change-log trims on the primary


class SyncGate:
    """Holds sync-mode callers until a standby acked their commit's LSN."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._held: deque = deque()     # (lsn, deadline, batch, results)
        self._acked = 0

    def hold(self, lsn: int, batch, results) -> None:
        with self._lock:
            if lsn > self._acked:
                self._held.append((lsn, time.monotonic() + self.timeout, batch, results))
                return
        for pending, result in zip(batch, results, strict=True):
            pending.resolve(result)

    def acked(self, lsn: int) -> None:
        released = []
        with self._lock:
            self._acked = max(self._acked, lsn)
            while self._held and self._held[0][0] <= self._acked:
                released.append(self._held.popleft())
        for _, _, batch, results in released:
            for pending, result in zip(batch, results, strict=True):
                pending.resolve(result)

    def expire(self) -> None:
        now = time.monotonic()
        expired = []
        with self._lock:
            while self._held and self._held[0][1] <= now:
                expired.append(self._held.popleft())
        for lsn, _, batch, _ in expired:
            err = ReplicationTimeout(
                f"no DR-standby confirmed commit {lsn} within {self.timeout} s; it is stored on the "
                f"primary and reaches the standby when it reconnects (check `partq dr status`)")
            for pending in batch:
                pending.resolve(error=err)

    def release_all(self) -> None:
        self.acked(1 << 62)


class ReplicationServer:
    """Runs in the primary: accepts standbys and ships them the change log."""

    def __init__(self, store, listen: str, mode: str, sync_timeout: float) -> None:
        if mode not in ("async", "sync"):
            raise PartqError(f"replication_mode must be 'async' or 'sync', not {mode!r}")
        self.store = store
        self.mode = mode
        self._stop = threading.Event()
        self._new_commit = threading.Condition()
        self._links: dict[str, dict] = {}   # standby id -> acked, connected, generation
        self._links_lock = threading.Lock()
        self._generation = 0
        self.gate = SyncGate(sync_timeout) if mode == "sync" else None
        with store.read() as r:
            has_timeline = r.meta(b"timeline") is not None
        if not has_timeline:
            store.write(lambda w: w.put_local_meta(b"timeline", uuid.uuid4().hex.encode()))
        store.on_commit(self._on_commit)
        if self.gate is not None:
            store.set_sync_gate(self.gate)
        host, port = parse_address(listen)
        self._sock = socket.create_server((host, port), reuse_port=False)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._sock.settimeout(0.2)
        self._threads = [threading.Thread(target=self._accept_loop, name="partq-repl-accept", daemon=True)]
        if self.gate is not None:
            self._threads.append(threading.Thread(target=self._expire_loop, name="partq-repl-expire",
                                                  daemon=True))
        for t in self._threads:
            t.start()

    def _on_commit(self, appended: int) -> None:
        with self._new_commit:
            self._new_commit.notify_all()

    def _expire_loop(self) -> None:
        gate = self.gate
        while gate is not None and not self._stop.wait(0.05):
            gate.expire()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(conn,), name="partq-repl-link", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        standby_id, gen = "?", None
        try:
            conn.settimeout(30)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = recv_frame(conn)
            if not isinstance(hello, dict) or hello.get("type") != "hello":
                raise FrameError("expected hello")
            standby_id = str(hello["standby_id"])
            applied = hello.get("applied_lsn")
            if hello.get("timeline") != self._timeline():
                applied = None        # another history (e.g. a promoted standby): start over
            gen = self._register(standby_id, applied)
            sent = self._start_point(conn, applied)
            self._stream(conn, standby_id, gen, sent)
        except (FrameError, OSError, PartqError) as exc:
            if not self._stop.is_set():
                log.warning("replication link to standby %s ended: %s", standby_id, exc)
        except Exception:  # a bug must end this link only, visibly, not the primary
            log.exception("replication link to standby %s failed", standby_id)
        finally:
            with self._links_lock:
                link = self._links.get(standby_id)
                if link is not None and link["gen"] == gen:   # not a newer connection's link
                    link["connected"] = False
            conn.close()

    def _timeline(self) -> str | None:
        with self.store.read() as r:
            raw = r.meta(b"timeline")
        return None if raw is None else raw.decode()

    def _register(self, standby_id: str, applied: int | None) -> int:
        def op(w):
            slots = read_slots(w)
            slots.setdefault(standby_id, applied or 0)
            w.put_local_meta(b"slots", msgpack.packb(slots))
        self.store.write(op)
        with self._links_lock:
            self._generation += 1
            self._links[standby_id] = {"acked": -1, "connected": True, "gen": self._generation}
            return self._generation

    def _start_point(self, conn: socket.socket, applied: int | None) -> int:
        """Send a snapshot unless the change log still holds everything after ``applied``.
        Returns the last LSN the standby has."""
        with self.store.read() as r:
            head = u64(r.meta(b"lsn"))
            first = r.first_change_lsn()
        if first is None:
            first = head + 1
        if applied is not None and first - 1 <= applied <= head:
            return applied
        return self._send_snapshot(conn)

    def _send_snapshot(self, conn: socket.socket) -> int:
        tmp = tempfile.mkdtemp(prefix="partq-snapshot-")
        try:
            snap_lsn = self.store.snapshot(tmp)
            path = os.path.join(tmp, "data.mdb")
            size = os.path.getsize(path)
            send_frame(conn, {"type": "snapshot", "size": size, "lsn": snap_lsn})
            crc = 0
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    crc = crc32c.crc32c(chunk, crc)
                    send_frame(conn, {"type": "chunk", "data": chunk})
            send_frame(conn, {"type": "snapshot_end", "crc": crc})
            log.info("sent a %d-byte snapshot at LSN %d", size, snap_lsn)
            return snap_lsn
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _stream(self, conn: socket.socket, standby_id: str, gen: int, sent: int) -> None:
        last_trim = time.monotonic()
        while not self._stop.is_set():
            entries, head, head_info = self._read_after(sent)
            frame = {"type": "changes" if entries else "heartbeat", "entries": entries,
                     "head": head, "head_time_ns": head_info[0], "head_msgs": head_info[1]}
            send_frame(conn, frame)
            ack = recv_frame(conn)
            if not isinstance(ack, dict) or ack.get("type") != "ack":
                raise FrameError("expected ack")
            acked = int(ack["lsn"])
            sent = max(sent, acked)
            with self._links_lock:
                link = self._links[standby_id]
                if link["gen"] != gen:
                    raise FrameError("superseded by a newer connection of the same standby")
                link["acked"] = acked
            if self.gate is not None:
                self.gate.acked(self._min_acked())
            if time.monotonic() - last_trim > TRIM_EVERY:
                self._trim()
                last_trim = time.monotonic()
            if not entries:
                with self._new_commit:
                    if self.store.last_lsn <= sent:
                        self._new_commit.wait(HEARTBEAT)

    def _read_after(self, lsn: int) -> tuple[list[bytes], int, tuple[int, int]]:
        with self.store.read() as r:
            head = u64(r.meta(b"lsn"))
            msgs = u64(r.meta(b"msgs_total"))
            entries = r.changes_after(lsn, MAX_ENTRIES_PER_FRAME, MAX_FRAME // 4)
            head_time = 0
            raw = r.change(head) if head else None
            if raw is not None:
                head_time = decode_change(raw)[1]
        return entries, head, (head_time, msgs)

    def _min_acked(self) -> int:
        """What every connected standby has durably (a sync-mode commit waits for it): a dead
        standby does not hold publishers hostage, and with none connected nothing is released."""
        with self._links_lock:
            return min((link["acked"] for link in self._links.values() if link["connected"]),
                       default=0)

    def _trim(self) -> None:
        """Delete change-log entries every standby has; persist the slots' positions."""
        with self._links_lock:
            acked = {sid: link["acked"] for sid, link in self._links.items() if link["acked"] >= 0}

        def op(w):
            slots = read_slots(w)
            slots.update({sid: max(slots.get(sid, 0), a) for sid, a in acked.items()})
            w.put_local_meta(b"slots", msgpack.packb(slots))
            w.trim_changes(min(slots.values(), default=0))
        self.store.write(op)

    def status(self) -> ReplicationStatus:
        with self.store.read() as r:
            head = u64(r.meta(b"lsn"))
            msgs = u64(r.meta(b"msgs_total"))
            links = []
            with self._links_lock:
                items = list(self._links.items())
            for sid, link in items:
                acked = link["acked"]
                if acked < 0:         # bootstrapping: it has nothing confirmed yet
                    lag_msgs, lag_s = stored_messages(r), 0.0
                else:
                    lag_msgs, lag_s = lag(r, acked, head, msgs)
                links.append(StandbyLink(sid, link.get("connected", False), acked, head - acked,
                                         lag_msgs, lag_s))
            return primary_status(r, links, self.mode)

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        self.store.remove_commit_hook(self._on_commit)
        if self.gate is not None:
            self.store.set_sync_gate(None)
            self.gate.release_all()
        with self._new_commit:
            self._new_commit.notify_all()
