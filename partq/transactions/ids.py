"""Transaction ids kept durably, so that a transaction a client sends again (its answer was
lost with the connection, or with the server) is answered "committed" and not applied twice.

Per client (``client_id``, the same on every connection of one ``partq.connect`` client) one
meta value holds its last ``KEEP`` transaction ids with their commit times; an id older than
``EXPIRY`` seconds is dropped. The value is written in the transaction's own commit (so it is
there exactly when the transaction is), and replicated like every meta value: a promoted
DR-standby answers a retry as its primary would have. A client that sends nothing for
``EXPIRY`` leaves one small value behind, dropped by the next commit that finds it (one in
``SWEEP_EVERY`` commits of transactions with ids looks at every client's).
"""
from __future__ import annotations

import random
import time

import msgpack

PREFIX = b"txn_ids/"
KEEP = 256                # ids kept per client: retries come within seconds of the first try
EXPIRY = 24 * 3600.0      # seconds an id is kept at most
SWEEP_EVERY = 1024


class _AlreadyCommitted(Exception):
    """Raised inside a transaction's write whose id is stored (a retry of one that committed):
    the write is dropped and ``partq.remote.txn_request`` answers "committed". Internal to
    the two: it never reaches a user, so it is not one of ``partq.errors``."""


AlreadyCommitted = _AlreadyCommitted


def _key(client_id: str) -> bytes:
    return PREFIX + client_id.encode("utf-8", "replace")[:200]


def _ids(r, client_id: str) -> list:
    raw = r.meta(_key(client_id))
    return [] if raw is None else msgpack.unpackb(raw, raw=False)


def committed(r, client_id: str, txn_id: str) -> bool:
    """Whether transaction ``txn_id`` of ``client_id`` committed (read in ``r``)."""
    return any(entry[0] == txn_id for entry in _ids(r, client_id))


def remember(w, client_id: str, txn_id: str) -> None:
    """Store ``txn_id`` in write ``w``, the transaction's own (which checked ``committed``
    first)."""
    now = time.time()
    kept = [e for e in _ids(w, client_id) if now - e[1] < EXPIRY]
    kept = (kept + [[txn_id, now]])[-KEEP:]
    w.put_meta(_key(client_id), msgpack.packb(kept))
    if random.random() < 1 / SWEEP_EVERY:
        _sweep(w, now)


def _sweep(w, now: float) -> None:
    """Drop the ids of clients whose newest is past ``EXPIRY``."""
    stale = []
    for key, raw in w.meta_prefix(PREFIX):
        entries = msgpack.unpackb(raw, raw=False)
        if not entries or now - entries[-1][1] >= EXPIRY:
            stale.append(key)
    for key in stale:
        w.delete_meta(key)
