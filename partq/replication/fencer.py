"""The promoted store's side of superseding (``supersede`` is the old primary's): tell the old
primary, until it answered, that it must refuse writes.

A promotion remembers the address the standby followed (``FENCE_TARGET``, local meta). While a
process runs the promoted store as a primary, a ``Fencer`` thread connects to that address as a
standby would, with the token and TLS options it was given (the follower's, when the process
that promotes also followed), and says ``supersedes`` with its timeline history, the standby's
slot secret, its last commit of the old primary and the proof of its last snapshot. Once the
old primary answers ``superseded`` the promoted store forgets the address, the secret and the
proof; until then each attempt's failure is kept (``FENCE_ERROR``), so `partq dr status` run
from any process can say that the old primary was not told yet, and why. `partq dr promote`
waits for the answer (``wait_told``) before it returns.

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
from partq.replication.settings import FENCE_ERROR, FENCE_TARGET, fence_state
from partq.replication.status import u64
from partq.replication.supersede import SECRET, SNAPSHOT_PROOF
from partq.wire.frames import parse_address, recv_frame
from partq.wire.handshake import client_handshake

log = logging.getLogger("partq.replication")

RETRY = 5.0                       # seconds between attempts to reach the old primary, at most
POLL = 0.05                       # seconds between checks of ``wait_told``


def wait_told(store, timeout: float) -> tuple[str | None, str | None]:
    """Wait up to ``timeout`` seconds for the ``Fencer`` of this process to tell the old
    primary; return ``fence_state`` then ((None, None): told, or nothing to tell)."""
    deadline = time.monotonic() + timeout
    while True:
        with store.read() as r:
            state = fence_state(r)
        if state[0] is None or time.monotonic() >= deadline:
            return state
        time.sleep(POLL)


def _told(w) -> None:
    for key in (FENCE_TARGET, FENCE_ERROR, SECRET, SNAPSHOT_PROOF):
        w.delete_local_meta(key)


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
            return fence_state(r)[0]

    def _run(self) -> None:
        last, wait = None, 0.1
        while not self._stop.is_set():
            target = self._target()
            if target is None:
                break
            try:
                self._tell(target)
                self.store.write(_told)
                log.warning("the old primary %s was told it is superseded: it refuses writes now",
                            target)
                break
            except (OSError, ssl.SSLError, FrameError, PartqError) as exc:
                if self._stop.is_set():
                    break
                error = str(exc) or type(exc).__name__
                if error != last:
                    log.warning("cannot tell the old primary %s that it is superseded yet (%s); "
                                "trying again, every %g s at most", target, error, RETRY)
                    self._keep_error(error)
                last = error
            self._stop.wait(wait)
            wait = min(wait * 2, RETRY)
        self.done.set()

    def _keep_error(self, error: str) -> None:
        def op(w) -> None:
            if w.meta(FENCE_TARGET) is not None:      # not told meanwhile by another process
                w.put_local_meta(FENCE_ERROR, error.encode())
        try:
            self.store.write(op)
        except PartqError:      # a closing store or a full disk: the error is in the log
            pass

    def _tell(self, target: str) -> None:
        addr = parse_address(target)
        with self.store.read() as r:
            history = timeline.read_history(r)
            sid, secret = r.meta(b"standby_id"), r.meta(SECRET)
            applied, crc = r.meta(b"applied_lsn"), r.meta(b"applied_crc")
            snapshot = r.meta(SNAPSHOT_PROOF)
        snapshot_lsn, proof = msgpack.unpackb(snapshot) if snapshot else (None, None)
        sock = socket.create_connection(addr, timeout=HANDSHAKE_TIMEOUT)
        try:
            if self.options.ssl_context is not None:
                sock = self.options.ssl_context.wrap_socket(sock, server_hostname=addr[0])
            client_handshake(sock, ROLE, self.options.token, HANDSHAKE_TIMEOUT,
                             standby_id=(sid or b"promoted").decode(),
                             applied_lsn=None if applied is None else u64(applied),
                             timeline=timeline.current(history),
                             applied_crc=None if crc is None else u64(crc),
                             slot_secret=secret, snapshot_lsn=snapshot_lsn, snapshot_proof=proof,
                             supersedes=[list(t) for t in history])
            sock.settimeout(HANDSHAKE_TIMEOUT)
            reply = recv_frame(sock, MAX_FRAME)
        finally:
            sock.close()
        if kind(reply) != "superseded":
            reason = reply.get("reason") if isinstance(reply, dict) else None
            raise PeerRefused(f"it refused: {reason}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HANDSHAKE_TIMEOUT + 1)
