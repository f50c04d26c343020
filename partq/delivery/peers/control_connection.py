"""One client process's connection to the control socket, on the delivery owner's side
(``owner_channel``): a thread that reads its requests and hands each to the server, a thread
that writes what is queued for it (answers, and the pushes the dispatcher queues under its
lock), and when it was last heard from (rule `liveness`)."""
from __future__ import annotations

import logging
import queue as queue_module
import socket
import threading
import time
from typing import TYPE_CHECKING

from partq.errors import FrameError
from partq.message import FlowChangeUpdate
from partq.wire.frames import recv_frame, send_frame

if TYPE_CHECKING:
    from partq.delivery.peers.owner_channel import ControlServer

log = logging.getLogger("partq.delivery")

MAX_CONTROL_FRAME = 1 << 20
SEND_TIMEOUT = 5            # seconds a send to a peer that stopped reading may block


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
                if not self._closed.is_set():    # refused and ending: what follows is not read
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
