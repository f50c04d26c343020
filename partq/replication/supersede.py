"""No split brain: a promoted standby tells its old primary, which then refuses writes.

A standby is promoted when its primary is taken for lost; the primary may come back (a host
restarted, a network healed) and take writes again, and then two primaries diverge. So the
promoted store remembers the address it followed (``FENCE_TARGET``, written with the promotion)
and, while a process serves it as a primary, a ``Fencer`` thread connects to that address as a
standby would, with the same token and TLS options, and says ``supersedes`` with its timeline
history. The old primary checks that the history forks from its own (``forked_from``: the
first timeline the old primary does not know follows one it does, so the new primary was a
standby of it), marks its directory (``SUPERSEDED``, a meta value of its own, not copied to
standbys) and answers ``superseded``; the promoted store then forgets the address. From the
mark on, every commit of the old directory that would change queues or messages fails with
``Superseded``, in every process of it (``partq.storage.group_commit``), and it serves no
standby. A history that does not fork from the primary's is refused and changes nothing.

The old primary must be reachable at the address its standby followed, with its replication
listener up: until then it takes writes, as any partitioned primary would (fencing needs the
message to arrive). docs/rules.md, rule `replication`, says the same for users.
"""
from __future__ import annotations

import logging
import socket
import ssl
import threading
import time

import msgpack

from partq.errors import FrameError, PartqError, PeerRefused
from partq.replication import timeline
from partq.replication.protocol import HANDSHAKE_TIMEOUT, MAX_FRAME, ROLE, ReplicationOptions, kind
from partq.storage.group_commit import SUPERSEDED
from partq.wire.frames import parse_address, recv_frame
from partq.wire.handshake import client_handshake

log = logging.getLogger("partq.replication")

FENCE_TARGET = b"fence_primary"   # local meta of a promoted store: the old primary's address
RETRY = 5.0                       # seconds between attempts to reach the old primary, at most


def forked_from(mine: timeline.History, theirs: timeline.History) -> bool:
    """Whether history ``theirs`` forks from ``mine``: its first timeline that ``mine`` does not
    hold comes right after one that ``mine`` holds (a standby of this primary, promoted)."""
    known = {tid for tid, _ in mine}
    for i, (tid, _) in enumerate(theirs):
        if tid not in known:
            return i > 0 and theirs[i - 1][0] in known
    return False


def mark_superseded(w, theirs: timeline.History, where: str) -> str | None:
    """In the old primary's write transaction: mark it superseded by the promoted store at
    ``where`` whose history is ``theirs``. Returns why not (None: marked)."""
    if not forked_from(timeline.read_history(w), theirs):
        return ("its timeline history does not fork from this primary's: it was never a standby "
                "of it, so it cannot supersede it")
    if w.meta(SUPERSEDED) is None:
        w.put_local_meta(SUPERSEDED, msgpack.packb({"by": where, "timeline": theirs[-1][0],
                                                    "at": time.time()}))
    return None


def superseded(r) -> bool:
    return r.meta(SUPERSEDED) is not None


class Fencer:
    """Runs in a promoted store's primary process until its old primary said ``superseded``."""

    def __init__(self, store, options: ReplicationOptions) -> None:
        self.store = store
        self.options = options
        self._stop = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partq-fencer", daemon=True)
        self._thread.start()

    def _target(self) -> str | None:
        with self.store.read() as r:
            raw = r.meta(FENCE_TARGET)
        return None if raw is None else raw.decode()

    def _run(self) -> None:
        last, wait = None, 0.1
        while not self._stop.is_set():
            target = self._target()
            if target is None:
                break
            try:
                self._tell(target)
                self.store.write(lambda w: w.delete_local_meta(FENCE_TARGET))
                log.warning("the old primary %s was told it is superseded: it refuses writes now",
                            target)
                break
            except (OSError, ssl.SSLError, FrameError, PartqError) as exc:
                if str(exc) != last and not self._stop.is_set():
                    log.warning("cannot tell the old primary %s that it is superseded yet (%s); "
                                "trying again, every %g s at most", target, exc, RETRY)
                last = str(exc)
            self._stop.wait(wait)
            wait = min(wait * 2, RETRY)
        self.done.set()

    def _tell(self, target: str) -> None:
        addr = parse_address(target)
        with self.store.read() as r:
            history = timeline.read_history(r)
            sid = r.meta(b"standby_id")
        sock = socket.create_connection(addr, timeout=HANDSHAKE_TIMEOUT)
        try:
            if self.options.ssl_context is not None:
                sock = self.options.ssl_context.wrap_socket(sock, server_hostname=addr[0])
            client_handshake(sock, ROLE, self.options.token, HANDSHAKE_TIMEOUT,
                             standby_id=(sid or b"promoted").decode(), applied_lsn=None,
                             timeline=timeline.current(history), applied_crc=None,
                             supersedes=[list(t) for t in history])
            reply = recv_frame(sock, MAX_FRAME)
        finally:
            sock.close()
        if kind(reply) != "superseded":
            reason = reply.get("reason") if isinstance(reply, dict) else None
            raise PeerRefused(f"it refused: {reason}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HANDSHAKE_TIMEOUT + 1)

