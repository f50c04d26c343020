"""The client side of the control channel (``control``): one connection from this process to
the owner of a queue's delivery, with requests and their replies, the owner's pushes, and the
beats that keep this process's flows alive (rule `liveness`).

Threads: one reads frames (requests' replies wake their callers; pushes go to ``on_push``), one
sends a beat every quarter of the queue's consumer timeout and whatever ``outbox()`` returns
(the unacked counts of flows whose acks committed). When the connection ends for any reason
other than ``close()``, ``on_lost()`` is called once, from the reading thread.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

from partq.delivery.lock import beat_age, holder, inode_of, lease_for, lock_path
from partq.delivery.peers.control_connection import MAX_CONTROL_FRAME
from partq.delivery.peers.control_requests import VERSION
from partq.delivery.peers.owner_channel import UnixAddress, check_served_by_this_user, socket_path
from partq.errors import DeliveryLocked, FrameError, OwnerLost, PartqError
from partq.wire.error_frames import error_from_frame
from partq.wire.frames import recv_frame, send_frame

CONNECT_TIMEOUT = 5.0      # seconds to reach an owner's socket that renews its lease
REQUEST_TIMEOUT = 10.0     # seconds a request waits for an owner that renews its lease, at least
LEASE_MARGIN = 2.0         # seconds past the lease before a silent, renewing owner is an error
WAIT_SLICE = 0.1           # seconds between looks at the owner's lease while waiting for it
SEND_POLL = 0.02           # seconds between looks at the outbox


def patience(lease: float) -> float:
    """How long to wait for an owner that renews its lease but does not answer: as long as a
    stopped owner keeps its lock, and a margin (a stopped one is given up on sooner, once its
    lease ran out: ``OwnerLink.check_owner``)."""
    return max(CONNECT_TIMEOUT, lease + LEASE_MARGIN)


class OwnerLink:
    def __init__(self, store_path: str, queue: str, qid: int, lease: float,
                 on_push: Callable[[dict], None], on_lost: Callable[[], None],
                 outbox: Callable[[], list[dict]]) -> None:
        """Connect to the owner's socket and say hello. Raises ``OwnerLost`` (the caller takes
        delivery over, or follows whoever did) at once when no process holds the queue's
        delivery lock any more, and as soon as its holder's lease (``lease`` seconds, the
        queue's) ran out while this waited for it: a stopped owner is taken over, never waited
        on past its lease. Raises ``DeliveryLocked`` naming the socket when an owner that renews
        its lease does not answer within ``patience(lease)``, and ``UnsafeDirectory`` when a
        process of another user serves the socket (nothing is sent to it)."""
        self.queue = queue
        self._on_push, self._on_lost, self._outbox = on_push, on_lost, outbox
        self._send_lock = threading.Lock()
        self._requests: dict[int, list] = {}
        self._requests_lock = threading.Lock()
        self._next_req = 0
        self._closed = False
        self._lock_path = lock_path(store_path, qid)
        path = socket_path(store_path, qid)
        welcome = None
        address = UnixAddress(path)
        deadline = time.monotonic() + patience(lease)
        try:
            while welcome is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(CONNECT_TIMEOUT)
                    sock.connect(address.address)
                    check_served_by_this_user(sock, path)
                    send_frame(sock, {"op": "hello", "v": VERSION, "pid": os.getpid(),
                                      "host": socket.gethostname()})
                    welcome = self._welcome(sock, lease, deadline)
                except (OSError, FrameError) as exc:
                    sock.close()
                    self.check_owner(lease)
                    if time.monotonic() > deadline:
                        raise DeliveryLocked(
                            f"queue {queue!r} is delivered by another process whose socket "
                            f"{path} does not answer ({exc}) though it renews its lease; check "
                            f"that process, or retry") from None
                    time.sleep(0.02)
                except BaseException:
                    sock.close()
                    raise
        finally:
            address.close()
        if not isinstance(welcome, dict) or welcome.get("op") != "welcome":
            sock.close()
            if isinstance(welcome, dict) and welcome.get("op") == "error":
                raise error_from_frame(welcome)
            raise PartqError("the delivery owner refused this process")
        sock.settimeout(None)
        self.timeout = float(welcome.get("timeout", 10.0))
        self._sock = sock
        self._lock_inode = inode_of(self._lock_path)
        threading.Thread(target=self._read_loop, name="partq-link-read", daemon=True).start()
        threading.Thread(target=self._send_loop, name="partq-link-send", daemon=True).start()

    def _welcome(self, sock: socket.socket, lease: float, deadline: float):
        """The owner's first frame on ``sock``, waited for in slices: between them, an owner
        whose lease ran out is given up on (``check_owner``); ``TimeoutError`` past
        ``deadline``."""
        sock.settimeout(WAIT_SLICE)
        while True:
            try:
                sock.recv(1, socket.MSG_PEEK)   # something came, or the end: recv_frame says
                break
            except TimeoutError:
                self.check_owner(lease)
                if time.monotonic() > deadline:
                    raise
        sock.settimeout(CONNECT_TIMEOUT)
        return recv_frame(sock, MAX_CONTROL_FRAME)

    def check_owner(self, lease: float) -> None:
        """Raise ``OwnerLost`` when no process holds the queue's delivery lock, or its holder
        has not renewed its lease for ``lease`` seconds (stopped: SIGSTOP, a debugger, a frozen
        job): then the caller takes delivery over (``lock.take_expired``) rather than wait."""
        owner = holder(self._lock_path)
        if owner is None:
            # the owner died (its socket closes before its lock is released): take delivery
            # over rather than knock on a dead socket
            raise OwnerLost(f"no process delivers queue {self.queue!r} now; take it over or bind "
                            f"again")
        age = beat_age(self._lock_path)
        if age is not None and age > lease:
            raise OwnerLost(f"the delivery owner of queue {self.queue!r} ({owner}) has not renewed "
                            f"its lease for {age:.1f} s (lease {lease:g} s, the queue's "
                            f"consumer_timeout): it is stopped; take delivery over")

    def send(self, frame: dict) -> None:
        with self._send_lock:
            send_frame(self._sock, frame)

    def request(self, frame: dict) -> dict:
        """Send ``frame`` with a request id and return the owner's reply; an error reply is
        raised as the partq error it names. An owner that stops renewing its lease meanwhile
        is given up on (``OwnerLost``: take delivery over); one that renews it and does not
        answer within ``REQUEST_TIMEOUT`` (or ``patience`` of its lease) is ``DeliveryLocked``."""
        with self._requests_lock:
            self._next_req += 1
            req = self._next_req
            slot: list = [threading.Event(), None]
            self._requests[req] = slot
        wait = max(REQUEST_TIMEOUT, patience(lease_for(self.timeout)))
        deadline = time.monotonic() + wait
        try:
            self.send({**frame, "req": req})
            while not slot[0].wait(WAIT_SLICE):
                if self._owner_gone():
                    raise OwnerLost(f"the delivery owner of queue {self.queue!r} stopped renewing "
                                    f"its lease, or another process took delivery over; retry")
                if time.monotonic() > deadline:
                    raise DeliveryLocked(f"the delivery owner of queue {self.queue!r} did not "
                                         f"answer within {wait:g} s though it renews its lease; "
                                         f"check that process, or retry")
        except OSError as exc:
            raise OwnerLost(f"lost the delivery owner of queue {self.queue!r}: {exc}") from None
        finally:
            with self._requests_lock:
                self._requests.pop(req, None)
        reply = slot[1]
        if reply is None:
            raise OwnerLost(f"lost the delivery owner of queue {self.queue!r}; retry")
        if reply.get("op") == "error":
            raise error_from_frame(reply)
        return reply

    def _read_loop(self) -> None:
        try:
            while True:
                frame = recv_frame(self._sock, MAX_CONTROL_FRAME)
                if not isinstance(frame, dict):
                    continue
                req = frame.get("req")
                if req is not None:
                    with self._requests_lock:
                        slot = self._requests.get(req)
                    if slot is not None:
                        slot[1] = frame
                        slot[0].set()
                else:
                    self._on_push(frame)
        except (FrameError, OSError):
            pass
        finally:
            with self._requests_lock:
                for slot in self._requests.values():
                    slot[0].set()          # their callers see no reply: the owner is gone
            lost = not self._closed
            self._closed = True
            self._sock.close()
            if lost:
                self._on_lost()

    def _send_loop(self) -> None:
        last_beat = 0.0
        while not self._closed:
            time.sleep(SEND_POLL)
            try:
                now = time.monotonic()
                if now - last_beat >= self.timeout / 4:
                    if self._owner_gone():
                        self._sock.shutdown(socket.SHUT_RDWR)   # the read loop calls on_lost
                        return
                    self.send({"op": "beat"})
                    last_beat = now
                for frame in self._outbox():
                    self.send(frame)
            except OSError:
                return

    def _owner_gone(self) -> bool:
        """Whether the owner this link reaches lost its delivery lock: another process took it
        (a new lock file), or it stopped renewing its lease (stopped past the queue's
        consumer_timeout: ``on_lost`` then takes delivery over, ``lock.take_expired``)."""
        if inode_of(self._lock_path) != self._lock_inode:
            return True
        age = beat_age(self._lock_path)
        return age is not None and age > lease_for(self.timeout)

    def close(self) -> None:
        """End the connection on purpose (``on_lost`` is not called)."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
