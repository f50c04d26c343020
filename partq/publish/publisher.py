"""Publishing: validate and encode messages in the caller's thread, place them in the write
transaction (rules `key-hash`, `unkeyed-partitioner`, `ingress-egress` and
`durable-publish`).

The partition of a message is chosen *inside* the write transaction, from the partition count
that transaction sees, so a scale done by another process meanwhile can never misplace it: the
caller's thread only hashes keys (``partq.publish.encode``); ``place`` takes them modulo the
count.

The same holds for the queue's limits: messages are checked in the caller's thread against the
config this process cached, and again in the transaction when the stored config lowered a limit
since (``partq.publish.configs``), so a change made by another process holds at once.

Every write that adds messages to a queue passes ``admit``, the one gate of rules
`ingress-egress` and `quota`: ``place`` (every publish call), and a staged job's commit
(``partq.jobs.commit``), which appends its staged rows itself once they are admitted.

Thread-safety: ``publish_async`` and ``publish_many`` may be called from any thread;
``place``, ``admit`` and ``append_admitted`` run inside a write operation.
"""
from __future__ import annotations

import random
from collections.abc import Iterable
from itertools import count, repeat

from partq.config import QueueConfig
from partq.core.partitioners import RandomPartitioner, StickyPartitioner, make_partitioner
from partq.errors import (
    IngressDisabled,
    InvalidConfig,
    InvalidMessage,
    QueueFull,
    QueueNotFound,
)
from partq.message import PublishResult
from partq.pending import Pending
from partq.publish import quota
from partq.publish.configs import QueueConfigs
from partq.publish.encode import (
    Encoded,
    encode,
    encode_item,
    encode_one,
    expiry,
    over_limits,
    replayable,
)
from partq.publish.load_sampler import LoadSampler
from partq.storage import crashpoints
from partq.storage.encoding import PARENT, pack_u64, unpack_u64
from partq.storage.txn import mark_ttl_seen

DISCARDED = PublishResult(-1, -1, discarded=True)
COUNTER_DISCARDED = b"discarded"     # queue meta: publishes discarded while ingress was off

class _PublishOne:
    """One ``publish`` queued for the group commit. Concurrent publishes to one queue that land
    in the same commit are placed together (``run_merged``): one append per partition instead of
    one per message, which is what lets many publishing threads share a commit cheaply."""

    __slots__ = ("publisher", "queue", "config", "items", "merge_key", "ttl")

    def __init__(self, publisher: Publisher, queue: str, config: QueueConfig, items: Encoded,
                 ttl: bool) -> None:
        self.publisher, self.queue, self.config, self.items, self.ttl = \
            publisher, queue, config, items, ttl
        # publishes checked against one config merge (the op keeps that config alive, so its
        # id is not reused while the op waits)
        self.merge_key = ("publish", id(publisher), queue, id(config))

    def __call__(self, w) -> object:    # its PublishResult, or its refusal (QueueFull counted)
        if self.ttl:
            self.publisher.ttl_seen(w, self.queue)
        placed = quota.placed_or_refused(self.publisher, w, self.queue, self.items, self.config)
        return placed[0] if type(placed) is list else placed

    @staticmethod
    def run_merged(w, ops: list[_PublishOne]) -> list:
        first = ops[0]
        if any(op.ttl for op in ops):
            first.publisher.ttl_seen(w, first.queue)
        return first.publisher.place(w, first.queue, [op.items[0] for op in ops], first.config,
                                     each=True)


def checkpoint_key(name: str) -> bytes:
    # (a lone surrogate, as os.fsdecode makes of a byte that is not UTF-8, has no UTF-8 form)
    raw = name.encode("utf-8", "replace") if isinstance(name, str) else b""
    if not 0 < len(raw) <= 400 or raw.decode() != name:
        raise InvalidConfig(f"a checkpoint name is a str of 1 to 400 bytes of UTF-8, not "
                            f"{name!r:.80}")
    return b"checkpoint/" + raw


def checkpoint_position(checkpoint) -> tuple[str, int]:
    """``(name, position)`` of a ``publish_many`` checkpoint, checked: the position is stored
    as an unsigned 64-bit integer, so it must be an int from 0 to 2**64 - 1."""
    if not isinstance(checkpoint, tuple) or len(checkpoint) != 2:
        raise InvalidConfig(f"checkpoint must be a (name, position) tuple, not {checkpoint!r}")
    name, position = checkpoint
    if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < 1 << 64:
        raise InvalidConfig(f"a checkpoint position must be an integer from 0 to 2**64 - 1, not "
                            f"{position!r}")
    return name, position


class Publisher:
    """The publishing side of one open directory."""

    def __init__(self, store, clock, rng: random.Random) -> None:
        self.store = store
        self.clock = clock
        self._rng = rng
        self.configs = QueueConfigs(store)
        self._partitioners: dict[int, tuple[QueueConfig, RandomPartitioner | StickyPartitioner,
                                            LoadSampler]] = {}

    # ------------------------------------------------------------------ caller side
    def config(self, queue: str) -> QueueConfig:
        """The queue's config for validating publishes (cached: the write transaction checks
        against the stored one, ``partq.publish.configs``)."""
        return self.configs.cached(queue)

    def forget(self, queue: str) -> None:
        """Drop the cached config of ``queue`` (it changed)."""
        self.configs.forget(queue)

    def publish(self, queue: str, payload: bytes, key: str | None = None,
                headers: dict | None = None, ttl: float | None = None) -> PublishResult:
        """One message, durable when this returns: committed in this thread when the writer
        is idle (``Store.submit``'s ``wait``), else in the next shared commit."""
        return quota.refusal_raised(self._submit_one(queue, payload, key, headers, ttl,
                                                     True).result())

    def publish_async(self, queue: str, payload: bytes, key: str | None = None,
                      headers: dict | None = None, ttl: float | None = None) -> Pending:
        return Pending(quota.RaisesRefusal(self._submit_one(queue, payload, key, headers, ttl)))

    def _submit_one(self, queue: str, payload: bytes, key: str | None, headers: dict | None,
                    ttl: float | None, wait: bool = False):
        now = self.clock.wall_ns()
        expires = expiry(now, ttl)
        config, encoded = self.configs.encoded(queue, lambda config: [
            encode_one(config, payload, key, headers, now, expires)])
        return self.store.submit(_PublishOne(self, queue, config, encoded, expires is not None),
                                 wait)

    def publish_many_async(self, queue: str, items: Iterable, ttl: float | None = None,
                           wait: bool = False) -> Pending:
        """``publish_many`` without waiting: checked and encoded now, one transaction, durable
        once ``result()`` returns (``wait``: the caller waits at once: ``Store.submit``)."""
        now = self.clock.wall_ns()                 # one commit, one publish time
        expires = expiry(now, ttl)
        items = replayable(items)
        config, encoded = self.configs.encoded(queue, lambda config: encode(config, items, now, expires))
        if not encoded:
            return Pending(None, [])

        def op(w):
            if expires is not None:
                self.ttl_seen(w, queue)
            return quota.placed_or_refused(self, w, queue, encoded, config)
        return Pending(quota.RaisesRefusal(self.store.submit(op, wait)))

    def publish_each_async(self, queue: str, items: list, wait: bool = False) -> Pending:
        """Publish independent messages in one transaction: each item's result, or the
        ``InvalidMessage`` or ``QueueFull`` that refused it alone (``result()`` gives one entry per
        item). A server coalesces its clients' single publishes this way."""
        config = self.config(queue)
        now = self.clock.wall_ns()
        out: list = [None] * len(items)
        positions: list[int] | None = None      # of the encoded items, when some were refused
        try:
            encoded = encode(config, items, now)    # all of them good: the common case
        except InvalidMessage:
            config = self.configs.reload(queue)     # another process may have raised a limit
            positions, encoded = [], []
            for i, item in enumerate(items):
                try:
                    encoded.append(encode_item(config, item, now))
                    positions.append(i)
                except InvalidMessage as exc:
                    out[i] = exc
        if not encoded:
            return Pending(None, out)

        def op(w):
            results = self.place(w, queue, encoded, config, each=True)
            if positions is None:
                return results
            for i, result in zip(positions, results, strict=True):
                out[i] = result
            return out
        return Pending(self.store.submit(op, wait))

    def publish_many(self, queue: str, items: Iterable, checkpoint: tuple[str, int] | None = None,
                     ttl: float | None = None) -> list[PublishResult]:
        if checkpoint is None:
            return self.publish_many_async(queue, items, ttl, wait=True).result()
        name, position = checkpoint_position(checkpoint)
        key = checkpoint_key(name)
        now = self.clock.wall_ns()                 # one commit, one publish time
        expires = expiry(now, ttl)
        items = replayable(items)
        encoded_with, encoded = self.configs.encoded(queue, lambda config: encode(config, items, now,
                                                                          expires))

        def op(w):
            config = self.config_in(w, queue)
            if expires is not None:
                mark_ttl_seen(w, config.qid)
            stored = w.queue_meta(config.qid, key)
            if stored is not None and unpack_u64(stored) >= position:
                return []
            if not config.ingress_enabled:
                raise IngressDisabled(f"queue {queue!r} has ingress disabled: a checkpointed copy "
                                      f"would lose the batch; enable ingress and run it again")
            # over a quota, a checkpointed batch is refused even where the queue discards: a
            # discarded one would be lost for good behind its stored position
            placed = quota.placed_or_refused(self, w, queue, encoded, encoded_with,
                                             True) if encoded else []
            if type(placed) is list:
                w.put_queue_meta(config.qid, key, pack_u64(position))
            return placed
        return quota.refusal_raised(self.store.write(op))

    def checkpoint(self, queue: str, name: str) -> int | None:
        with self.store.read() as r:
            raw = r.queue(queue)
            if raw is None:
                raise QueueNotFound(f"no queue named {queue!r}")
            stored = r.queue_meta(raw["qid"], checkpoint_key(name))
        return None if stored is None else unpack_u64(stored)

    # ------------------------------------------------------------------ in the transaction
    def ttl_seen(self, w, queue: str) -> None:
        """Messages with a TTL go to ``queue`` in this transaction: its expired messages are
        swept even while nobody consumes it (``partq.delivery.expiry``)."""
        mark_ttl_seen(w, self.config_in(w, queue).qid)

    def config_in(self, w, queue: str) -> QueueConfig:
        """The queue's config as of this transaction (another process may have changed it)."""
        return self.configs.in_txn(w, queue)

    def admit(self, w, config: QueueConfig, count: int, nbytes: int, reject: bool = False) -> bool:
        """The gate of every write that adds messages to a queue: may ``count`` messages of
        ``nbytes`` record bytes (``quota.record_bytes``) be appended to the queue of ``config``
        (read in this transaction)? True: append them. False: they are discarded, and counted
        (ingress is off, rule `ingress-egress`; or they would pass a quota, rule `quota`, and the
        queue discards). Raises ``IngressDisabled`` or ``QueueFull`` when the queue rejects
        (``reject``: ``QueueFull`` whatever the queue's reject_msg_to_sender), having written
        nothing."""
        if not config.ingress_enabled:
            self._refuse(w, config, count)
            return False
        if not (config.max_depth or config.max_bytes):
            return True                         # no quota: the common case, no call
        full = quota.check(w, config, count, nbytes)
        if full is None:
            return True
        quota.refuse(w, config, full, count, reject)
        return False

    def place(self, w, queue: str, items: Encoded, encoded_with: QueueConfig,
              each: bool = False, reject: bool = False) -> list:
        """Append encoded messages to ``queue`` in this transaction; one result per message (a
        discarded one when ingress is off and the queue discards, rule `ingress-egress`). Past a
        quota (rule `quota`, ``partq.publish.quota``) all of them are refused, ``QueueFull``
        raised before anything is written, or discarded and counted (``reject``: raised
        whatever the queue's reject_msg_to_sender). ``encoded_with``: the config the messages
        were checked against; when the stored one has lower limits they are checked again, and
        one over them raises its ``InvalidMessage``, nothing written. ``each``: they are
        independent publishes (merged single publishes, ``publish_each``); a message over the
        limits gets its ``InvalidMessage`` as result, and when they do not all fit the quota
        each is placed alone in turn, the result of one refused being its ``QueueFull``,
        counted."""
        config = self.configs.in_txn(w, queue)
        if config is not encoded_with and self.configs.lowered(config, encoded_with):
            return self._place_checked(w, queue, config, items, each, reject)
        try:
            if not self.admit(w, config, len(items), quota.record_bytes(config, items),
                              reject or each):
                return [DISCARDED] * len(items)
        except QueueFull:
            if not each:
                raise
            return quota.each_alone(self, w, queue, items, config)
        ps, firsts = self._append(w, config, items)
        # each partition's seqs go up from its first, in batch order (C-level loops: a
        # Python loop over the batch cost a quarter more)
        counters = {p: count(first) for p, first in firsts.items()}
        seqs = map(next, map(counters.__getitem__, ps))
        return list(map(tuple.__new__, repeat(PublishResult), zip(ps, seqs, repeat(False))))

    def _place_checked(self, w, queue: str, config: QueueConfig, items: Encoded, each: bool,
                       reject: bool) -> list:
        """``place`` of messages checked against limits the stored ``config`` has lowered since:
        each checked again first (rare: the first writes after such a change)."""
        refused = [over_limits(config, record) for _, record in items]
        if not any(refused):
            return self.place(w, queue, items, config, each, reject)
        if not each:
            raise next(exc for exc in refused if exc is not None)
        fit = [item for item, exc in zip(items, refused, strict=True) if exc is None]
        placed = iter(self.place(w, queue, fit, config, True) if fit else [])
        return [next(placed) if exc is None else exc for exc in refused]

    def append_admitted(self, w, config: QueueConfig, items: Encoded) -> None:
        """Append messages ``admit`` let in (in this transaction), each placed as a publish
        places it."""
        self._append(w, config, items)

    def _append(self, w, config: QueueConfig, items: Encoded) -> tuple[list[int], dict[int, int]]:
        """Choose each message's partition (rules `key-hash`, `unkeyed-partitioner`) and append them,
        one append per partition; return the partition of each message and the first sequence each
        partition got."""
        qid, n = config.qid, config.partitions
        if not config.partitioned:     # exclusive: the parent queue's log, in publish order
            return [PARENT] * len(items), {PARENT: w.append(qid, PARENT, [r for _, r in items])}
        if len(items) == 1:
            key_hash, record = items[0]
            p = key_hash % n if key_hash is not None else self._unkeyed(w, config)(len(record))
            return [p], {p: w.append(qid, p, [record])}
        try:
            # all keyed, the common case; a None hash raises TypeError, handled below
            ps = [key_hash % n for key_hash, _ in items]  # type: ignore[operator]
        except TypeError:
            choose = self._unkeyed(w, config)
            ps = [key_hash % n if key_hash is not None else choose(len(record))
                  for key_hash, record in items]
        buckets: dict[int, list[bytes]] = {p: [] for p in set(ps)}
        for p, (_, record) in zip(ps, items, strict=True):
            buckets[p].append(record)
        firsts = {}
        for p, recs in buckets.items():
            firsts[p] = w.append(qid, p, recs)
            if crashpoints.ENABLED and len(firsts) == 1 and len(buckets) > 1:
                crashpoints.hit("mid_batch")
        return ps, firsts

    def _refuse(self, w, config: QueueConfig, count: int) -> None:
        """Ingress is disabled (rule `ingress-egress`): reject when reject-msg-to-sender applies
        while the queue is shut down, otherwise discard and count (Solace's default: expect loss)."""
        if config.reject_msg_to_sender and config.reject_msg_to_sender_when_shutdown:
            raise IngressDisabled(f"queue {config.name!r} has ingress disabled; retry after "
                                  f"`partq queue update {config.name} --ingress on`")
        raw = w.queue_meta(config.qid, COUNTER_DISCARDED)
        total = (0 if raw is None else unpack_u64(raw)) + count
        w.put_queue_meta(config.qid, COUNTER_DISCARDED, pack_u64(total))

    def _unkeyed(self, w, config: QueueConfig):
        """``choose(size) -> partition`` for this transaction's unkeyed messages: the queue's
        partitioner (rebuilt when its settings change) fed with sampled backlog (rules
        `unkeyed-partitioner`, `sticky`, `adaptive` and `availability-timeout`).
        Runs in the group-commit thread only."""
        entry = self._partitioners.get(config.qid)
        if entry is None or not _same_partitioner(entry[0], config):
            entry = (config, make_partitioner(config, self._rng), LoadSampler())
            self._partitioners[config.qid] = entry
        _, part, sampler = entry
        n, qid = config.partitions, config.qid
        if config.partitioner == "random":
            return lambda size: part.partition(n, size, None, 0.0)
        now = self.clock.now()
        load = sampler.load(w, qid, n, now) if config.adaptive else None

        def choose(size: int) -> int:
            p = part.partition(n, size, load, now)
            if load is not None:
                sampler.note_appended(p, 1)
            return p
        return choose


def discarded_count(reader, qid: int) -> int:
    """Publishes the queue discarded while its ingress was off (rule `ingress-egress`)."""
    raw = reader.queue_meta(qid, COUNTER_DISCARDED)
    return 0 if raw is None else unpack_u64(raw)


def _same_partitioner(a: QueueConfig, b: QueueConfig) -> bool:
    return (a.partitioner, a.sticky_batch_size, a.adaptive, a.partition_availability_timeout) == \
        (b.partitioner, b.sticky_batch_size, b.adaptive, b.partition_availability_timeout)
