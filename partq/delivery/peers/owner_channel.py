"""The control channel between the process that owns a queue's delivery and the other processes
of the host that bind flows to it (rules `peer-flows`, `owner-takeover` and `liveness`): a Unix socket in the
directory, ``DIR/delivery-locks/<queue id>.sock``, readable and writable by the directory's owner only
(mode 0600 in a 0700 folder), and each side checks with SO_PEERCRED that the process at the other
end runs as the same user before it sends anything (``check_served_by_this_user``).

Only coordination crosses it; messages do not. A flow of another process reads and acks its
partitions in LMDB itself (``peers.peer_delivery``): the owner runs the rebalancer and tells it nothing
but what the persisted state says (assignments, pauses, epochs), pushes the flow's
FlowChangeUpdate events and its closing, and hears back what it holds unacked (handoffs wait
for that) and that it is alive.

Frames are ``partq.wire``'s (length, crc32c, msgpack). Client -> owner::

    {"op": "hello", "v": 1, "pid", "host"}            -> {"op": "welcome", "v": 1, "timeout"}
    {"op": "bind", "req", "name", "hint", "skip_corrupt"} -> {"op": "bound", "req", "flow"}
    {"op": "unbind", "req", "flow", "leave"}          -> {"op": "ok", "req"}
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

Every field of every request is checked where it arrives (``control_requests``): types, lengths
and ranges as partq's own client sends them. A request that fails a check does nothing and is
answered with the typed error (``InvalidConfig``, ``ProtocolMismatch``), as any refused request
is; a bad hello, a frame that is not a map or an unknown request also ends the connection.
A connection may unbind, and report the counts of, only the flows it bound itself.

Liveness: a connection that closes unbinds its flows at once (rule `liveness`: no distinction
between an unbind and a disconnect); one that sends nothing, not even a beat, for the queue's
``consumer_timeout`` is closed by the owner, which unbinds its flows the same way.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

from partq.delivery.peers import control_requests
from partq.delivery.peers.control_connection import MAX_CONTROL_FRAME, SEND_TIMEOUT, Connection
from partq.delivery.peers.control_requests import VERSION
from partq.errors import FrameError, PartqError, UnsafeDirectory
from partq.wire.error_frames import error_frame
from partq.wire.frames import recv_frame, send_frame

log = logging.getLogger("partq.delivery")

ACCEPT_POLL = 0.25
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
            check_served_by_this_user(sock, path)
            send_frame(sock, {"op": "hello", "v": VERSION, "pid": os.getpid(),
                              "host": socket.gethostname()})
            send_frame(sock, {"op": "view", "req": 1})
            for _ in range(2):
                frame = recv_frame(sock, MAX_CONTROL_FRAME)
                if isinstance(frame, dict) and frame.get("op") == "view":
                    return frame.get("view")
    except (OSError, FrameError):
        return None
    except UnsafeDirectory:
        # served by another user: the directory's own owner when this process only reads it,
        # else a socket another user left (``silent_owner_warning`` tells which)
        return None
    finally:
        address.close()
    return None


def silent_owner_warning(store_path: str, qid: int, owner: str) -> str | None:
    """What to tell an operator when ``owner`` holds queue id ``qid``'s delivery lock but its
    control socket did not answer (``query_view`` gave None): flows of other processes wait for
    it. None when this process may not reach the socket (another user: not the owner's fault)."""
    path = socket_path(store_path, qid)
    stranger = foreign_socket(path, store_path)
    if stranger is not None:
        folder = os.path.dirname(path)
        return (f"the control socket {path} belongs to uid {stranger}, not to the directory's "
                f"owner: another user made it while {folder} was writable by others, and partq "
                f"does not talk to it; stop that user's process, remove {path} and the lock file "
                f"beside it, and keep {folder} writable by its owner only (chmod 700 {folder})")
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
    """The uid of the process at the other end of Unix socket ``sock`` (SO_PEERCRED: as it was
    when that process connected, or listened)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def check_served_by_this_user(sock: socket.socket, path: str) -> None:
    """Before anything is sent over ``sock``, connected to the control socket ``path``: raise
    ``UnsafeDirectory`` when the process that serves it runs as another user. Only a folder
    others could write to (a misconfiguration ``Broker.open`` refuses now) lets another user
    put a socket there, and what a process says to it (its flows, its pid) is not theirs."""
    uid = peer_uid(sock)
    if uid != os.geteuid():
        folder = os.path.dirname(path)
        raise UnsafeDirectory(
            f"the control socket {path} is served by a process of uid {uid}, not of this user "
            f"(uid {os.geteuid()}): partq talks to no other user's process. Another user made it "
            f"while {folder} was writable by others: stop that process, remove {path} and the "
            f"lock file beside it, and keep {folder} writable by its owner only "
            f"(chmod 700 {folder})")


def foreign_socket(path: str, store_path: str) -> int | None:
    """The owner of the control socket ``path`` when that is not the owner of the directory
    ``store_path`` (a socket another user left there); None otherwise or when either is gone."""
    try:
        uid = os.stat(path).st_uid
        return uid if uid != os.stat(store_path).st_uid else None
    except OSError:
        return None


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
            uid = peer_uid(sock)
            if uid != os.geteuid():     # before anything is read from it or sent to it
                log.warning("refused a control connection to queue %r from a process of uid %d: "
                            "only processes of this user (uid %d) may use it", self.queue, uid,
                            os.geteuid())
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

    def handle(self, conn: Connection, frame) -> None:
        """Serve one frame of ``conn``. Its fields are checked first (``control_requests``): a
        bad one is answered with the typed error and does nothing; a bad hello, or a frame that
        is no request partq knows, also ends the connection (its flows are unbound, as for any
        closing)."""
        try:
            op, req, fields = control_requests.parse(frame)
        except PartqError as exc:
            log.warning("queue %r: refused a control request of %s: %s", self.queue, conn.client,
                        exc)
            req = frame.get("req") if isinstance(frame, dict) else None
            conn.push(error_frame(exc, req=req if control_requests.is_request_id(req) else None))
            if control_requests.ends_connection(frame):
                conn.close()
            return
        try:
            self._serve(conn, op, req, fields)
        except PartqError as exc:
            conn.push(error_frame(exc, req=req))

    def _serve(self, conn: Connection, op: str, req: int | None, fields: tuple) -> None:
        """Carry out a checked request (``control_requests.parse``)."""
        if op == "hello":
            pid, host = fields
            conn.client = f"pid {pid} on {host}"
            conn.push({"op": "welcome", "v": VERSION,
                       "timeout": self.dispatcher.consumer_timeout(self.queue)})
        elif op == "outstanding":
            flow_id, counts, paused, held = fields
            if flow_id in conn.flows:             # only its own flows' counts
                self.dispatcher.report(self.queue, flow_id, counts, paused, held)
        elif op == "bind":
            name, hint, skip_corrupt = fields
            flow_id = self.dispatcher.bind_peer(self.queue, name, hint, skip_corrupt, conn,
                                                conn.client)
            conn.flows.add(flow_id)
            conn.push({"op": "bound", "req": req, "flow": flow_id})
        elif op == "unbind":
            flow_id, leave = fields
            if flow_id in conn.flows:             # only its own flows: another's is not its to end
                conn.flows.discard(flow_id)
                self.dispatcher.unbind_peer(self.queue, flow_id, leave)
            conn.push({"op": "ok", "req": req})
        elif op == "view":
            conn.push({"op": "view", "req": req,
                       "view": self.dispatcher.view_doc(self.queue, self.clients())})

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
            except Exception:   # a bug: the other flows of the connection must go all the same
                log.exception("unbinding flow %s of %s after its process left failed", flow_id,
                              conn.client)

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
