"""What a kombu connection talks to: a partq directory opened in this process, or ``partq serve``.

One ``Broker`` per directory per process (LMDB allows one environment per path per process), shared
by every kombu connection of the process and closed with the last of them; a process forked
after opening (Celery's prefork pool) opens its own. ``partq://HOST:PORT`` connects one client per
kombu connection.
"""
from __future__ import annotations

import os
import threading

from partq.errors import QueueExists, QueueNotFound

_lock = threading.Lock()
_brokers: dict[tuple[str, int], list] = {}     # (path, pid) -> [broker, connections using it]


class Backend:
    """The partq verbs the transport uses, over a ``Broker`` or a ``Client``."""

    def __init__(self, target, release=None, *, remote: bool = False) -> None:
        self.target = target
        self.remote = remote
        self._release = release

    # ------------------------------------------------------------------ queues
    @property
    def creates_queues(self) -> bool:
        """False for a ``partq serve`` client without the admin verbs (queues made beforehand)."""
        return hasattr(self.target, "create_queue")

    def ensure_queue(self, name: str, options: dict) -> None:
        """Create queue ``name`` with ``options`` unless it exists."""
        create = getattr(self.target, "create_queue", None)
        if create is None:                        # a partq serve without the admin verbs
            if not self.has_queue(name):
                raise QueueNotFound(f"queue {name!r} does not exist and this partq serve does not "
                                    f"create queues: create it with `partq queue create {name}`")
            return
        try:
            create(name, exist_ok=True, **options)
        except QueueExists:                      # created meanwhile by another process
            pass

    def has_queue(self, name: str) -> bool:
        try:
            self.target.queue_status(name)
        except QueueNotFound:
            return False
        return True

    def queue_names(self) -> list[str]:
        """Every queue's name (a client without the admin verbs: none)."""
        queues = getattr(self.target, "queues", None)
        return [] if queues is None else [c.name for c in queues()]

    def delete_queue(self, name: str) -> None:
        delete = getattr(self.target, "delete_queue", None)
        if delete is None:
            return
        try:
            delete(name)
        except QueueNotFound:
            pass

    def depth(self, name: str) -> int:
        """Messages published to ``name`` and not acked (0 for a queue that does not exist)."""
        try:
            return self.target.queue_status(name).depth
        except QueueNotFound:
            return 0

    # ------------------------------------------------------------------ messages
    def publish(self, queue: str, payload: bytes, ttl: float | None) -> None:
        if self.remote or not ttl:                # partq serve's publish takes no TTL
            self.target.publish(queue, payload)
        else:
            self.target.publish(queue, payload, ttl=ttl)

    def bind(self, queue: str):
        return self.target.bind(queue)

    def purge(self, queue: str, keep: set[tuple[int, int]]) -> int:
        """Ack every stored message of ``queue`` but those in ``keep`` (``(partition, seq)`` of
        the messages the purging channel holds); how many."""
        if self.remote:
            from kombu.exceptions import ChannelError
            raise ChannelError("purging a queue is not offered through partq serve: purge it on "
                               "the host (`partq message ack`), or delete and declare it again")
        from partq.ops.browse import browse

        count = 0
        for row in list(browse(self.target.store, queue, limit=0)):
            if row["acked"] or (row["partition"], row["seq"]) in keep:
                continue
            if self.target.ack_message(queue, row["partition"], row["seq"]):
                count += 1
        return count

    def close(self) -> None:
        if self._release is not None:
            self._release()
        else:
            self.target.close()


def open_backend(path: str | None, address: str | None, token: str | None, ssl,
                 durability: str) -> Backend:
    """A backend on directory ``path`` or on the ``partq serve`` at ``address``."""
    if address is not None:
        from partq.remote.client import connect
        return Backend(connect(address, token=token, ssl=ssl), remote=True)
    assert path is not None
    from partq.broker import Broker

    key = (os.path.abspath(path), os.getpid())
    with _lock:
        entry = _brokers.get(key)
        if entry is None:
            entry = _brokers[key] = [Broker.open(key[0], durability=durability), 0]
        entry[1] += 1

    def release() -> None:
        with _lock:
            entry[1] -= 1
            if entry[1] == 0 and _brokers.get(key) is entry:
                del _brokers[key]
                entry[0].close()
    return Backend(entry[0], release)
