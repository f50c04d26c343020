"""Reading a partq directory without writing to it: for a user who may read the directory but
not write it (an auditor, a monitoring account), or on request (``partq --read-only``).

``open_store_read_only(path)`` gives a ``ReadOnlyStore`` (``partq.storage.read_only_store``,
which says what reading without LMDB's reader lock costs) and ``open_read_only(path)`` a
``Broker`` over one: they read exactly what the usual ones read (``queue_config``, ``queues``,
``queue_status``, ``checkpoint``, ``store.read()`` for ``partq.ops.browse``,
``partq.ops.verify``, ``partq.ops.stats``) and refuse every write with ``OpenedReadOnly``.
``read_only_reason(path)`` (``partq.ops.write_access``) says whether this process must read
that way. The delivery owner
(``DIR/delivery-locks``) and its live view are visible only to users who may read that
directory.

Thread-safety: as ``Store``: one process, any thread; never across ``fork()``.
"""
from __future__ import annotations

import dataclasses
import os
import random

from partq.broker import Broker
from partq.clock import SystemClock
from partq.config import QueueConfig
from partq.delivery import queue_holder
from partq.delivery.lock import LOCK_DIR, beat_age, lock_path
from partq.delivery.peers.owner_channel import query_view
from partq.delivery.saved_state import doc_to_view
from partq.errors import queue_not_found
from partq.status import QueueStatus
from partq.status_report import build_queue_status, with_owner_warning
from partq.storage import Store
from partq.storage.read_only_store import ReadOnlyStore


def open_store_read_only(path: str | os.PathLike, reason: str = "opened read-only") -> Store:
    """The store in ``path`` for reading only (``ReadOnlyStore.open``: the store this process
    has open already, if it has). ``reason`` is quoted by errors."""
    return ReadOnlyStore.open(path, reason=reason)


class ReadOnlyBroker(Broker):
    """A ``Broker`` over a store opened for reading: ``queue_config``, ``queues``,
    ``queue_status``, ``checkpoint``, ``replication_status`` and ``store`` as usual; publishes,
    binds and changes raise ``OpenedReadOnly`` (``Broker(read_only=reason)``), also when it
    shares a writable store this process has open. It runs no threads (no timer ticks by
    itself) and takes no lock."""

    def __init__(self, store: Store, reason: str) -> None:
        super().__init__(store, SystemClock(), random.Random(), auto_tick=False, read_only=reason)

    def queue_status(self, queue: str) -> QueueStatus:
        """As ``Broker.queue_status``; the live view comes from the delivery owner's socket when
        this user may reach it, else from the stored state. When this user may not read
        ``DIR/delivery-locks``, a warning says the owner is unknown."""
        config = self.queue_config(queue)
        doc = query_view(self.path, config.qid)
        view = doc_to_view(doc) if doc is not None else None
        with self.store.read() as r:
            raw = r.queue(queue)
            if raw is None:
                raise queue_not_found(queue, r.queues())
            config = QueueConfig.from_dict(raw)
            owner = queue_holder(self.path, config.qid)
            st = build_queue_status(r, config, view, owner, self.clock.wall_ns(),
                                    None if owner else beat_age(lock_path(self.path, config.qid)))
        st = with_owner_warning(st, self.path, config.qid, view is None)
        locks = os.path.join(self.path, LOCK_DIR)
        if os.path.isdir(locks) and not os.access(locks, os.R_OK | os.X_OK):
            st = dataclasses.replace(st, warnings=[*st.warnings, (
                f"delivery owner unknown: this user may not read {locks}; assignments and "
                f"statuses are those last stored")])
        return st


def open_read_only(path: str | os.PathLike, reason: str = "opened read-only") -> Broker:
    """A ``ReadOnlyBroker`` on the store in ``path`` (see ``open_store_read_only``)."""
    store = open_store_read_only(path, reason)
    try:
        return ReadOnlyBroker(store, reason)
    except BaseException:
        store.close()
        raise
