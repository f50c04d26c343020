"""The queue configs a publisher checks messages against, and how a change made by another
process reaches them at once.

The caller's thread checks a message against the config this process cached (``cached``), and
the write transaction reads the config as it stands (``in_txn``). Both come from one cache of
decoded configs keyed by their stored bytes, so while nothing changed they are the same object
and the transaction tells so with one identity test (no decode, no read beyond the one it makes
anyway). When they differ (another process, or this one, updated the queue) the stored one
becomes the cached one, and if a message limit (``max_message_size``, ``max_key_size``) went
down, the messages are checked again against it before anything is written (``limits_lowered``,
``check_again``): a lowered limit holds from the next write of every process that has the
queue open. A message the cached limits refuse is checked again against the stored ones
(``encoded``), so a raised limit holds at once too.

Thread-safety: any thread; the caches are dicts whose single operations are atomic, and a miss
only costs a decode.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from partq.config import QueueConfig
from partq.errors import InvalidMessage, QueueNotFound, queue_not_found
from partq.publish.encode import limits_lowered, over_limits
from partq.storage.encoding import decode_meta
from partq.storage.txn import check_queue_name

T = TypeVar("T")


class QueueConfigs:
    """The configs of the queues of one open directory, as its publisher checks against them."""

    def __init__(self, store) -> None:
        self.store = store
        self._cached: dict[str, QueueConfig] = {}       # by queue name: the caller side's
        self._decoded: dict[bytes, QueueConfig] = {}    # by stored bytes: one object per value

    # ------------------------------------------------------------------ caller side
    def cached(self, queue: str) -> QueueConfig:
        """The queue's config as this process last saw it (read on first use)."""
        config = self._cached.get(check_queue_name(queue))
        return self.reload(queue) if config is None else config

    def reload(self, queue: str) -> QueueConfig:
        """The queue's stored config, read now and cached."""
        with self.store.read() as r:
            raw = r.queue_raw(queue)
            if raw is None:
                raise queue_not_found(queue, r.queues())
        config = self._cached[queue] = self._decode(raw, queue)
        return config

    def encoded(self, queue: str, encode_with: Callable[[QueueConfig], T]) -> tuple[QueueConfig, T]:
        """``(config, encode_with(config))`` with the cached config; when that refuses a message
        (``InvalidMessage``) and the stored config differs (another process raised a limit), once
        more with the stored one. ``encode_with`` may run twice: it must not consume an
        iterator."""
        config = self.cached(queue)
        try:
            return config, encode_with(config)
        except InvalidMessage:
            fresh = self.reload(queue)
            if fresh is config:
                raise
        return fresh, encode_with(fresh)

    def forget(self, queue: str) -> None:
        """Drop the cached config of ``queue`` (this process changed it)."""
        self._cached.pop(queue, None)

    # ------------------------------------------------------------------ in the transaction
    def in_txn(self, w, queue: str) -> QueueConfig:
        """The queue's config as of this transaction (another process may have changed it)."""
        raw = w.queue_raw(queue)
        if raw is None:
            raise QueueNotFound(f"no queue named {queue!r}")
        return self._decode(raw, queue)

    def lowered(self, config: QueueConfig, encoded_with: QueueConfig) -> bool:
        """``config``, read in the transaction, differs from ``encoded_with``, the config some
        messages were checked against: cache it for the caller side, and say whether a message
        limit went down (they must be checked again)."""
        self._cached[config.name] = config
        return limits_lowered(encoded_with, config)

    def check_again(self, w, encoded_with: QueueConfig,
                    records: Callable[[], Iterable[bytes]]) -> None:
        """Raise the ``InvalidMessage`` of the first of ``records()`` (encoded records checked
        against ``encoded_with``) that limits lowered since refuse, in this transaction; while
        none was lowered (the common case), look at none."""
        config = self.in_txn(w, encoded_with.name)
        if config is not encoded_with and self.lowered(config, encoded_with):
            for record in records():
                if (invalid := over_limits(config, record)) is not None:
                    raise invalid

    def _decode(self, raw: bytes, queue: str) -> QueueConfig:
        config = self._decoded.get(raw)
        if config is None:
            if len(self._decoded) > 64:
                self._decoded.clear()
            config = self._decoded[raw] = QueueConfig.from_dict(decode_meta(raw, queue))
        return config
