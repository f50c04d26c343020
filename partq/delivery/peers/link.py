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
from partq.delivery.peers.owner_channel import MAX_CONTROL_FRAME, VERSION, UnixAddress, socket_path
from partq.errors import DeliveryLocked, FrameError, OwnerLost, PartqError
from partq.wire.error_frames import error_from_frame
from partq.wire.frames import recv_frame, send_frame

CONNECT_TIMEOUT = 5.0      # seconds to reach an owner's socket before giving up
REQUEST_TIMEOUT = 10.0
SEND_POLL = 0.02           # seconds between looks at the outbox


class OwnerLink:
    def __init__(self, store_path: str, queue: str, qid: int, on_push: Callable[[dict], None],
                 on_lost: Callable[[], None], outbox: Callable[[], list[dict]]) -> None:
        """Connect to the owner's socket and say hello; raises ``DeliveryLocked`` naming the
        socket when no owner answers within ``CONNECT_TIMEOUT``, ``OwnerLost`` at once when no
        process holds the queue's delivery lock any more."""
        self.queue = queue
        self._on_push, self._on_lost, self._outbox = on_push, on_lost, outbox
        self._send_lock = threading.Lock()
        self._requests: dict[int, list] = {}
        self._requests_lock = threading.Lock()
        self._next_req = 0
        self._closed = False
        path = socket_path(store_path, qid)
        welcome = None
        address = UnixAddress(path)
        deadline = time.monotonic() + CONNECT_TIMEOUT
        try:
            while welcome is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(CONNECT_TIMEOUT)
                    sock.connect(address.address)
                    send_frame(sock, {"op": "hello", "v": VERSION, "pid": os.getpid(),
                                      "host": socket.gethostname()})
                    welcome = recv_frame(sock, MAX_CONTROL_FRAME)
                except (OSError, FrameError) as exc:
                    sock.close()
                    if holder(lock_path(store_path, qid)) is None:
                        # the owner died (its socket closes before its lock is released): take
                        # delivery over rather than knock on a dead socket for CONNECT_TIMEOUT
                        raise OwnerLost(f"no process delivers queue {queue!r} now; take it "
                                        f"over or bind again") from None
                    if time.monotonic() > deadline:
                        raise DeliveryLocked(
                            f"queue {queue!r} is delivered by another process whose socket "
                            f"{path} does not answer ({exc}); check that process, or retry") \
                            from None
                    time.sleep(0.02)
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
        self._lock_path = lock_path(store_path, qid)
        self._lock_inode = inode_of(self._lock_path)
        threading.Thread(target=self._read_loop, name="partq-link-read", daemon=True).start()
        threading.Thread(target=self._send_loop, name="partq-link-send", daemon=True).start()

    def send(self, frame: dict) -> None:
        with self._send_lock:
            send_frame(self._sock, frame)

    def request(self, frame: dict) -> dict:
        """Send ``frame`` with a request id and return the owner's reply; an error reply is
        raised as the partq error it names."""
        with self._requests_lock:
            self._next_req += 1
            req = self._next_req
            slot: list = [threading.Event(), None]
            self._requests[req] = slot
        try:
            self.send({**frame, "req": req})
            if not slot[0].wait(REQUEST_TIMEOUT):
                raise DeliveryLocked(f"the delivery owner of queue {self.queue!r} did not answer "
                                     f"within {REQUEST_TIMEOUT:g} s")
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
