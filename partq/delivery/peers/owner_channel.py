"""The control channel between the process that owns a queue's delivery and the other processes
of the host that bind flows to it (rules `peer-flows`, `owner-takeover` and `liveness`): a Unix socket in the
directory, ``DIR/delivery-locks/<queue id>.sock``, readable and writable by the directory's owner only
(mode 0600 in a 0700 folder, and every peer's uid checked with SO_PEERCRED).

Only coordination crosses it; messages do not. A flow of another process reads and acks its
partitions in LMDB itself (``peers.peer_delivery``): the owner runs the rebalancer and tells it nothing
but what the persisted state says (assignments, pauses, epochs), pushes the flow's
FlowChangeUpdate events and its closing, and hears back what it holds unacked (handoffs wait
for that) and that it is alive.

Frames are ``partq.wire``'s (length, crc32c, msgpack). Client -> owner::

    {"op": "hello", "v": 1, "pid", "host"}            -> {"op": "welcome", "v": 1, "timeout"}
    {"op": "bind", "req", "name", "hint", "skip_corrupt"} -> {"op": "bound", "req", "flow"}
    {"op": "unbind", "req", "flow"}                   -> {"op": "ok", "req"}
    {"op": "view", "req"}                             -> {"op": "view", "req", "view"}
    {"op": "outstanding", "flow", "counts": [[partition, n], ...], "paused": [partition, ...],
     "held": [[partition, keys, messages, [reason, ...]], ...]}
        (``paused``: the flow's partitions it saw paused for a handoff when it counted: only
        such a count can end a handoff; ``held``: what holds messages back on its partitions,
        for the owner's status: ``held_view.peer_holds``)
    {"op": "beat"}
    owner -> client: {"op": "event", "flow", "active", "partitions"}, {"op": "closed", "flow",
    "reason"}, {"op": "error", "req", "error", "message", and the error's fields} (the error's
    ``to_frame()``; the client raises ``partq.wire.error_frames.error_from_frame`` of it)

Liveness: a connection that closes unbinds its flows at once (rule `liveness`: no distinction
between an unbind and a disconnect); one that sends nothing, not even a beat, for the queue's
``consumer_timeout`` is closed by the owner, which unbinds its flows the same way.
"""
from __future__ import annotations

import logging
import os
import queue as queue_module
import socket
import struct
import threading
import time
from collections.abc import Callable

from partq.errors import FrameError, PartqError
from partq.message import FlowChangeUpdate
from partq.wire.error_frames import error_frame
from partq.wire.frames import printable, recv_frame, send_frame

log = logging.getLogger("partq.delivery")

VERSION = 1
MAX_CONTROL_FRAME = 1 << 20
ACCEPT_POLL = 0.25
SEND_TIMEOUT = 5            # seconds a send to a peer that stopped reading may block
PAUSED_AFTER = 2 * ACCEPT_POLL   # a longer gap between liveness checks: this process was paused


def query_view(store_path: str, qid: int) -> dict | None:
    """Ask the owner of queue id ``qid`` for its live view over a short connection (None when
    no owner answers). ``queue_status`` of a process that does not run delivery uses it."""
    path = socket_path(store_path, qid)
    if not os.path.exists(path):
        return None
    try:
        address = UnixAddress(path)
    except OSError:
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect(address.address)
            send_frame(sock, {"op": "hello", "v": VERSION, "pid": os.getpid(),
                              "host": socket.gethostname()})
            send_frame(sock, {"op": "view", "req": 1})
            for _ in range(2):
                frame = recv_frame(sock, MAX_CONTROL_FRAME)
                if isinstance(frame, dict) and frame.get("op") == "view":
                    return frame.get("view")
    except (OSError, FrameError):
        return None
    finally:
        address.close()
    return None


def silent_owner_warning(store_path: str, qid: int, owner: str) -> str | None:
    """What to tell an operator when ``owner`` holds queue id ``qid``'s delivery lock but its
    control socket did not answer (``query_view`` gave None): flows of other processes wait for
    it. None when this process may not reach the socket (another user: not the owner's fault)."""
    path = socket_path(store_path, qid)
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return None
    if process_stopped(owner):
        return (f"the delivery owner ({owner}) is stopped (SIGSTOP, a debugger or a suspended "
                f"terminal job): consumers in other processes get nothing from it until it "
                f"continues (kill -CONT) or exits, or, once its lease is older than the queue's "
                f"consumer_timeout, one of them takes delivery over; statuses shown are those it "
                f"last stored")
    return (f"the delivery owner ({owner}) did not answer within 2 s (busy, starting or stopped): "
            f"consumers in other processes wait for it; statuses shown are those it last stored")


def process_stopped(owner: str) -> bool:
    """Whether the lock holder ``owner`` ("pid P on HOST since T") is a stopped process of this
    host (Linux's /proc; False where that cannot be told)."""
    parts = owner.split()
    if len(parts) < 4 or parts[0] != "pid" or not parts[1].isdigit() \
            or parts[3] != socket.gethostname():
        return False
    try:
        with open(f"/proc/{parts[1]}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] in (b"T", b"t")


def socket_path(store_path: str, qid: int) -> str:
    from partq.delivery.lock import LOCK_DIR
    return os.path.join(store_path, LOCK_DIR, f"{qid}.sock")


class UnixAddress:
    """A Unix socket path usable with bind and connect even when it is longer than the kernel's
    108 bytes: then it is reached through ``/proc/self/fd/N/`` of its open directory."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        if len(path.encode()) < 100:
            self.address = path
        else:
            self._fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            self.address = f"/proc/self/fd/{self._fd}/{os.path.basename(path)}"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class Connection:
    """One client process's connection, on the owner's side."""

    def __init__(self, server: ControlServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.flows: set[str] = set()
        self.client = "a process"
        self.since = time.time()
        self.last_seen = time.monotonic()
        self._outbox: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._closed = threading.Event()

    # PeerSink: called under the dispatcher's lock, so they only queue a frame
    def event(self, flow_id: str, update: FlowChangeUpdate) -> None:
        self.push({"op": "event", "flow": flow_id, "active": update.active,
                   "partitions": sorted(update.partitions)})

    def closed(self, flow_id: str, reason: str) -> None:
        self.flows.discard(flow_id)
        self.push({"op": "closed", "flow": flow_id, "reason": reason})

    def push(self, frame: dict) -> None:
        if not self._closed.is_set():
            self._outbox.put(frame)

    def heartbeat_age(self) -> float:
        return time.monotonic() - self.last_seen

    def close(self) -> None:
        """End the connection once what is queued for it is sent (a peer that stopped reading
        holds that up for at most the send timeout)."""
        if not self._closed.is_set():
            self._closed.set()
            self._outbox.put(None)

    def write_loop(self) -> None:
        try:
            while True:
                frame = self._outbox.get()
                if frame is None:
                    break
                send_frame(self.sock, frame)
        except OSError:
            self._closed.set()
        finally:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def read_loop(self) -> None:
        try:
            while True:
                frame = recv_frame(self.sock, MAX_CONTROL_FRAME)
                self.last_seen = time.monotonic()
                if not isinstance(frame, dict):
                    raise FrameError("a control frame must be a map")
                self.server.handle(self, frame)
        except (FrameError, OSError) as exc:
            if not self._closed.is_set() and not self.server.stopping:
                # a process that only asked for a status leaves every time: not news
                level = logging.INFO if self.flows else logging.DEBUG
                log.log(level, "delivery client %s of queue %r disconnected: %s", self.client,
                        self.server.queue, exc)
        except Exception:  # a bug ends this connection only, visibly
            log.exception("control connection of %s failed", self.client)
        finally:
            self.close()
            self.server.disconnected(self)
            self.sock.close()


class ControlServer:
    """Serves the flows other processes bind to one queue this process delivers."""

    def __init__(self, dispatcher, store_path: str, queue: str, qid: int,
                 beat: Callable[[], None] = lambda: None) -> None:
        self.dispatcher = dispatcher
        self._beat = beat               # renews the delivery lock's lease (``lock``)
        self.queue = queue
        self.path = socket_path(store_path, qid)
        self.stopping = False
        self._last_check = time.monotonic()
        self._connections: set[Connection] = set()
        self._lock = threading.Lock()
        self._address = UnixAddress(self.path)
        try:
            os.unlink(self.path)        # a dead owner's socket: this process holds the lock now
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(self._address.address)
            os.chmod(self.path, 0o600)
            self._inode = os.stat(self.path).st_ino
            self._sock.listen(64)
            self._sock.settimeout(ACCEPT_POLL)
        except BaseException:
            self._sock.close()
            self._address.close()
            raise
        self._thread = threading.Thread(target=self._accept_loop, name="partq-control",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self.stopping:
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                self._check_liveness()
                continue
            except OSError:
                return
            if peer_uid(sock) != os.geteuid():
                log.warning("refused a control connection to queue %r from another user",
                            self.queue)
                sock.close()
                continue
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", SEND_TIMEOUT, 0))
            conn = Connection(self, sock)
            with self._lock:
                self._connections.add(conn)
            threading.Thread(target=conn.read_loop, name="partq-control-read", daemon=True).start()
            threading.Thread(target=conn.write_loop, name="partq-control-write",
                             daemon=True).start()
            self._check_liveness()

    def _check_liveness(self) -> None:
        self._beat()
        timeout = self.dispatcher.consumer_timeout(self.queue)
        now = time.monotonic()
        paused = now - self._last_check > max(PAUSED_AFTER, timeout / 2)
        self._last_check = now
        with self._lock:
            if paused:
                # this process itself was stopped (SIGSTOP, a frozen VM): its clients' beats
                # wait unread in the sockets; silence it did not watch is no evidence
                for conn in self._connections:
                    conn.last_seen = max(conn.last_seen, now)
                return
            quiet = [c for c in self._connections if c.heartbeat_age() > timeout]
        for conn in quiet:
            log.warning("delivery client %s of queue %r sent nothing for %.1f s "
                        "(consumer_timeout %g s): unbinding its flows", conn.client, self.queue,
                        conn.heartbeat_age(), timeout)
            conn.close()

    def handle(self, conn: Connection, frame: dict) -> None:
        op = frame.get("op")
        if op == "beat":
            return
        if op == "hello":
            if frame.get("v") != VERSION:
                refused = PartqError(f"control protocol version {frame.get('v')!r} is not "
                                     f"{VERSION}: run the same partq version in every process")
                conn.push(error_frame(refused, req=None))
                conn.close()
                return
            conn.client = f"pid {printable(frame.get('pid'))} on {printable(frame.get('host'))}"
            conn.push({"op": "welcome", "v": VERSION,
                       "timeout": self.dispatcher.consumer_timeout(self.queue)})
            return
        if op == "outstanding":
            counts = {int(p): int(n) for p, n in frame.get("counts", [])}
            paused, held = frame.get("paused"), frame.get("held")
            self.dispatcher.report(self.queue, str(frame.get("flow")), counts,
                                   None if paused is None else {int(p) for p in paused},
                                   None if held is None else {int(h[0]): h[1:] for h in held})
            return
        req = frame.get("req")
        try:
            if op == "bind":
                hint = frame.get("hint")
                flow_id = self.dispatcher.bind_peer(
                    self.queue, frame.get("name"), None if hint is None else list(hint),
                    bool(frame.get("skip_corrupt")), conn, conn.client)
                conn.flows.add(flow_id)
                conn.push({"op": "bound", "req": req, "flow": flow_id})
            elif op == "unbind":
                flow_id = str(frame.get("flow"))
                conn.flows.discard(flow_id)
                self.dispatcher.unbind_peer(self.queue, flow_id)
                conn.push({"op": "ok", "req": req})
            elif op == "view":
                conn.push({"op": "view", "req": req,
                           "view": self.dispatcher.view_doc(self.queue, self.clients())})
            else:
                raise FrameError(f"unknown control operation {op!r}")
        except FrameError:
            raise                    # not an answer: the connection ends (read_loop)
        except PartqError as exc:
            conn.push(error_frame(exc, req=req))

    def clients(self) -> dict[str, dict]:
        """flow id -> {client, since, heartbeat_age} of the flows of other processes."""
        with self._lock:
            conns = list(self._connections)
        return {fid: {"client": c.client, "since": c.since, "heartbeat_age": c.heartbeat_age()}
                for c in conns for fid in list(c.flows)}

    def disconnected(self, conn: Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
        if self.stopping:
            return
        for flow_id in list(conn.flows):
            try:
                self.dispatcher.unbind_peer(self.queue, flow_id)
            except PartqError as exc:
                log.warning("unbinding flow %s after its process left: %s", flow_id, exc)

    def stop(self) -> None:
        """Stop serving: the clients see their connection close and take delivery over, or
        reconnect to whoever does."""
        self.stopping = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)     # wakes the accept loop at once
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._connections)
        for conn in conns:
            conn.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        try:
            if os.stat(self.path).st_ino == self._inode:   # not a successor's (``lock``)
                os.unlink(self.path)
        except OSError:
            pass
        self._address.close()
