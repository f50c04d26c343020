"""DR-standby replication over TCP (S27, seed 001's DR steps).

The primary logs every commit's logical changes under a log sequence number (LSN) while a standby
slot exists (``storage.txn.Writer.finish``). A standby connects and says who it is and what it
has applied; the primary registers its slot, then sends either the change log after that LSN or,
when those changes are gone (or the standby is new), a snapshot of the environment (LMDB's
``copy``, taken from a read transaction: the primary keeps running) followed by the change log.
The standby applies each frame of changes in one transaction that also records the new applied
LSN, so a resent frame is skipped and a reconnect resumes exactly where it stopped; then it acks.

Frames: ``u32 length | u32 crc32c(body) | msgpack body``. A bad checksum, an oversized length or
a truncated frame ends the connection with a logged reason; the standby reconnects and resumes.
It never applies a frame it could not verify.

Modes: ``async`` (default): publish returns after the local commit; the standby follows. ``sync``:
callers whose commit wrote changes are held until the standby acked that LSN (durable on the
standby), or fail with ``ReplicationTimeout`` after ``sync_timeout`` seconds (the message is then
stored on the primary but not known to be on the standby: an unknown outcome, as in Kafka).
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass

import crc32c
import msgpack

from partq.errors import PartqError
from partq.storage.encoding import pack_u64, unpack_u64
from partq.storage.txn import decode_change

log = logging.getLogger("partq.replication")

_HEADER = struct.Struct(">II")
MAX_FRAME = 256 << 20
CHUNK = 1 << 20
MAX_ENTRIES_PER_FRAME = 512
HEARTBEAT = 0.5
TRIM_EVERY = 0.5          # seconds between change-log trims on the primary


class ReplicationTimeout(PartqError):
    """Sync mode: the standby did not confirm a commit in time. The commit is on the primary."""


class FrameError(Exception):
    """A frame failed its checks; the connection ends and the standby resumes."""


# ---------------------------------------------------------------------- frames
def send_frame(sock: socket.socket, obj) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    sock.sendall(_HEADER.pack(len(body), crc32c.crc32c(body)) + body)


def recv_frame(sock: socket.socket):
    length, crc = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    body = _recv_exact(sock, length)
    if crc32c.crc32c(body) != crc:
        raise FrameError("frame crc32c mismatch")
    try:
        return msgpack.unpackb(body, raw=False)
    except Exception as exc:
        raise FrameError(f"undecodable frame ({type(exc).__name__})") from None


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, CHUNK))
        if not chunk:
            raise FrameError(f"connection closed mid-frame ({got} of {n} bytes)")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise PartqError(f"address {address!r} must be HOST:PORT, e.g. 127.0.0.1:7010")
    return host or "127.0.0.1", int(port)


# ---------------------------------------------------------------------- status
@dataclass(frozen=True)
class StandbyLink:
    standby_id: str
    connected: bool
    acked_lsn: int                      # -1 while bootstrapping (snapshot not yet confirmed)
    lag_changes: int
    lag_messages: int
    lag_seconds: float


@dataclass(frozen=True)
class ReplicationStatus:
    role: str                           # "primary" | "standby"
    mode: str | None                    # primary: "async" | "sync"
    connected: bool                     # standby: linked to its primary; primary: any standby
    head_lsn: int                       # primary's newest LSN (as last heard, on a standby)
    applied_lsn: int                    # standby: applied; primary: lowest acked by standbys
    lag_messages: int
    lag_seconds: float
    standbys: list[StandbyLink] = dataclasses.field(default_factory=list)
    primary: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------- primary
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
        for pending, result in zip(batch, results):
            pending._resolve(result)

    def acked(self, lsn: int) -> None:
        released = []
        with self._lock:
            self._acked = max(self._acked, lsn)
            while self._held and self._held[0][0] <= self._acked:
                released.append(self._held.popleft())
        for _, _, batch, results in released:
            for pending, result in zip(batch, results):
                pending._resolve(result)

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
                pending._resolve(error=err)

    def release_all(self) -> None:
        self.acked(1 << 62)


class ReplicationServer:
    """Runs in the primary: accepts standbys and ships them the change log."""

    def __init__(self, broker, listen: str, mode: str, sync_timeout: float) -> None:
        if mode not in ("async", "sync"):
            raise PartqError(f"replication_mode must be 'async' or 'sync', not {mode!r}")
        self.broker = broker
        self.mode = mode
        self._stop = threading.Event()
        self._new_commit = threading.Condition()
        self._links: dict[str, dict] = {}   # standby id -> acked, connected, generation
        self._links_lock = threading.Lock()
        self._generation = 0
        self._times: deque = deque(maxlen=100_000)   # (lsn, commit time ns, msgs_total)
        self.gate = SyncGate(sync_timeout) if mode == "sync" else None
        store = broker._store
        with store.read() as r:
            has_timeline = r.meta(b"timeline") is not None
        if not has_timeline:
            store.write(lambda w: w.put_local_meta(b"timeline", uuid.uuid4().hex.encode()))
        store._writer.add_listener(self._on_commit)
        if self.gate is not None:
            store._writer.sync_gate = self.gate
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

    def _on_commit(self) -> None:
        with self._new_commit:
            self._new_commit.notify_all()

    def _expire_loop(self) -> None:
        while not self._stop.wait(0.05):
            self.gate.expire()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
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
        with self.broker._store.read() as r:
            raw = r.meta(b"timeline")
        return None if raw is None else raw.decode()

    def _register(self, standby_id: str, applied: int | None) -> int:
        def op(w):
            raw = w.meta(b"slots")
            slots = msgpack.unpackb(raw, raw=False) if raw else {}
            slots.setdefault(standby_id, applied or 0)
            w.put_local_meta(b"slots", msgpack.packb(slots))
        self.broker._store.write(op)
        with self._links_lock:
            self._generation += 1
            self._links[standby_id] = {"acked": -1, "connected": True, "gen": self._generation}
            return self._generation

    def _start_point(self, conn: socket.socket, applied: int | None) -> int:
        """Send a snapshot unless the change log still holds everything after ``applied``.
        Returns the last LSN the standby has."""
        store = self.broker._store
        with store.read() as r:
            head = _u64(r.meta(b"lsn"))
            cur = r._txn.cursor(db=r._dbs["changes"])
            first = unpack_u64(cur.key()) if cur.first() else head + 1
        if applied is not None and first - 1 <= applied <= head:
            return applied
        return self._send_snapshot(conn)

    def _send_snapshot(self, conn: socket.socket) -> int:
        store = self.broker._store
        tmp = tempfile.mkdtemp(prefix="partq-snapshot-")
        try:
            store._gate.enter()
            try:
                with store.env.begin() as txn:
                    snap_lsn = _u64(txn.get(b"lsn", db=store.dbs["meta"]))
                    store.env.copy(tmp, compact=True, txn=txn)
            finally:
                store._gate.leave()
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
        store = self.broker._store
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
                    if store._writer.last_lsn <= sent:
                        self._new_commit.wait(HEARTBEAT)

    def _read_after(self, lsn: int) -> tuple[list[bytes], int, tuple[int, int]]:
        store = self.broker._store
        entries: list[bytes] = []
        with store.read() as r:
            head = _u64(r.meta(b"lsn"))
            msgs = _u64(r.meta(b"msgs_total"))
            cur = r._txn.cursor(db=r._dbs["changes"])
            size = 0
            if cur.set_range(pack_u64(lsn + 1)):
                for _, v in cur:
                    entries.append(v)
                    size += len(v)
                    if len(entries) >= MAX_ENTRIES_PER_FRAME or size > MAX_FRAME // 4:
                        break
            head_time = 0
            if head and cur.set_key(pack_u64(head)):
                head_time = decode_change(cur.value())[1]
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
            raw = w.meta(b"slots")
            slots = msgpack.unpackb(raw, raw=False) if raw else {}
            slots.update({sid: max(slots.get(sid, 0), a) for sid, a in acked.items()})
            w.put_local_meta(b"slots", msgpack.packb(slots))
            low = min(slots.values(), default=0)
            cur = w._txn.cursor(db=w._dbs["changes"])
            if cur.first():
                while cur.key() and unpack_u64(cur.key()) <= low:
                    cur.delete()
        self.broker._store.write(op)

    def status(self) -> ReplicationStatus:
        store = self.broker._store
        with store.read() as r:
            head = _u64(r.meta(b"lsn"))
            msgs = _u64(r.meta(b"msgs_total"))
            links = []
            with self._links_lock:
                items = list(self._links.items())
            for sid, link in items:
                acked = link["acked"]
                if acked < 0:         # bootstrapping: it has nothing confirmed yet
                    lag_msgs, lag_s = _stored_messages(r), 0.0
                else:
                    lag_msgs, lag_s = _lag(r, acked, head, msgs)
                links.append(StandbyLink(sid, link.get("connected", False), acked, head - acked,
                                         lag_msgs, lag_s))
        worst = max(links, key=lambda link: link.lag_changes, default=None)
        return ReplicationStatus(
            role="primary", mode=self.mode, connected=any(link.connected for link in links),
            head_lsn=head, applied_lsn=min((link.acked_lsn for link in links), default=head),
            lag_messages=worst.lag_messages if worst else 0,
            lag_seconds=worst.lag_seconds if worst else 0.0, standbys=links)

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        if self.gate is not None:
            self.broker._store._writer.sync_gate = None
            self.gate.release_all()
        with self._new_commit:
            self._new_commit.notify_all()


def _stored_messages(r) -> int:
    """Messages stored and not acked, over every queue (what a new standby still lacks)."""
    total = 0
    for config in r.queues().values():
        for p in range(config["partitions"]):
            ack = r.ack_state(config["qid"], p)
            total += ack.backlog(r.head(config["qid"], p))
    return total


def _u64(raw: bytes | None) -> int:
    return 0 if raw is None else unpack_u64(raw)


def _lag(r, acked: int, head: int, msgs_total: int) -> tuple[int, float]:
    """Messages and seconds between the standby's acked LSN and the primary's head."""
    if acked >= head:
        return 0, 0.0
    cur = r._txn.cursor(db=r._dbs["changes"])
    if not cur.set_range(pack_u64(acked + 1)):
        return 0, 0.0
    _, first_time, first_msgs, changes = decode_change(cur.value())
    appended = sum(len(c[4]) for c in changes if c[0] == "append")
    lag_msgs = msgs_total - (first_msgs - appended)
    return lag_msgs, max(0.0, (time.time_ns() - first_time) / 1e9)


def stored_slots_status(store, role: str) -> ReplicationStatus:
    """Replication status as any process can read it from the store: the standbys' positions
    the serving primary last stored (every 0.5 s) against the change log. Used by `partq dr
    status` and the scaling procedure's DR wait, which run outside the primary process."""
    with store.read() as r:
        raw = r.meta(b"slots")
        slots = msgpack.unpackb(raw, raw=False) if raw else {}
        head = _u64(r.meta(b"lsn"))
        msgs = _u64(r.meta(b"msgs_total"))
        applied = _u64(r.meta(b"applied_lsn"))
        links = []
        for sid, acked in slots.items():
            lag_msgs, lag_s = _lag(r, acked, head, msgs)
            links.append(StandbyLink(sid, False, acked, head - acked, lag_msgs, lag_s))
    worst = max(links, key=lambda link: link.lag_changes, default=None)
    if role == "standby":
        return ReplicationStatus(role=role, mode=None, connected=False, head_lsn=applied,
                                 applied_lsn=applied, lag_messages=0, lag_seconds=0.0)
    return ReplicationStatus(
        role=role, mode=None, connected=False, head_lsn=head,
        applied_lsn=min((link.acked_lsn for link in links), default=head),
        lag_messages=worst.lag_messages if worst else 0,
        lag_seconds=worst.lag_seconds if worst else 0.0, standbys=links)


# ---------------------------------------------------------------------- standby
class StandbyFollower:
    """Runs in the standby: keeps the local store identical to the primary's."""

    def __init__(self, broker, primary: str) -> None:
        self.broker = broker
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

    def _standby_id(self) -> str:
        store = self.broker._store
        with store.read() as r:
            raw = r.meta(b"standby_id")
        if raw is not None:
            return raw.decode()
        sid = uuid.uuid4().hex
        store.write(lambda w: w.put_local_meta(b"standby_id", sid.encode()))
        return sid

    def _timeline(self) -> str | None:
        with self.broker._store.read() as r:
            raw = r.meta(b"timeline")
        return None if raw is None else raw.decode()

    def _applied(self) -> int | None:
        with self.broker._store.read() as r:
            raw = r.meta(b"applied_lsn")
        return None if raw is None else unpack_u64(raw)

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
            self.head, self.head_time_ns, self.head_msgs = frame["head"], frame["head_time_ns"], frame["head_msgs"]
            send_frame(sock, {"type": "ack", "lsn": applied})

    def _receive_snapshot(self, sock: socket.socket, header: dict) -> None:
        store_path = self.broker.path
        tmp = tempfile.mkdtemp(prefix=".snapshot-", dir=store_path)
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
            self.broker._install_snapshot(tmp, header["lsn"])
            log.info("standby loaded a %d-byte snapshot at LSN %d", size, header["lsn"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _apply(self, entries: list[bytes]) -> int:
        def op(w):
            applied = _u64(w.meta(b"applied_lsn"))
            last = None
            for raw in entries:
                lsn, time_ns, msgs_total, changes = decode_change(raw)
                if lsn <= applied:
                    continue              # already applied: a resent frame
                if lsn != applied + 1:
                    raise FrameError(f"change log gap: have {applied}, got {lsn}")
                for change in changes:
                    apply_change(w, change)
                applied, last = lsn, (time_ns, msgs_total)
            w.put_local_meta(b"applied_lsn", pack_u64(applied))
            if last is not None:
                w.put_local_meta(b"applied_time_ns", pack_u64(last[0]))
                w.put_local_meta(b"msgs_total", pack_u64(last[1]))   # the primary's count
            return applied
        return self.broker._store.write(op)

    def status(self) -> ReplicationStatus:
        store = self.broker._store
        with store.read() as r:
            applied = _u64(r.meta(b"applied_lsn"))
            applied_time = _u64(r.meta(b"applied_time_ns"))
            msgs = _u64(r.meta(b"msgs_total"))
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


def apply_change(w, change: list) -> None:
    """Apply one logical change from the primary's log with the same Writer method."""
    kind = change[0]
    if kind == "append":
        _, qid, partition, first, records = change
        got = w.append(qid, partition, records)
        if got != first:
            raise FrameError(f"standby diverged: partition {qid}/{partition} appends at {got}, "
                             f"primary at {first}")
    elif kind == "ack":
        w.ack(change[1], change[2], change[3])
    elif kind == "put_queue":
        w.put_queue(change[1], change[2])
    elif kind == "delete_queue":
        w.delete_queue(change[1], change[2])
    elif kind == "queue_meta":
        w.put_queue_meta(change[1], change[2], change[3])
    elif kind == "put_state":
        w.put_state(change[1], change[2])
    elif kind == "delivered_mark":
        w.set_delivered_mark(change[1], change[2], change[3])
    elif kind == "init_partition":
        w.init_partition(change[1], change[2])
    elif kind == "drop_partition":
        w.drop_partition(change[1], change[2])
    elif kind == "meta":
        w.put_meta(change[1], change[2])
    else:
        raise FrameError(f"unknown change {kind!r}")
