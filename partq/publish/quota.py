"""Queue quotas (rule `quota`): ``max_depth``, messages published and not acked, and
``max_bytes``, bytes of the queue's stored log. One rule for every write that adds messages to
a queue: ``publish``, ``publish_async``, ``publish_many`` (checkpointed ones too: copy-in,
copy-out to a queue, a dead-message requeue), the coalesced publishes of ``partq serve``
(``publish_each``) and a staged job's commit (``partq.jobs.commit``). The messages a write
adds are checked together, in the write transaction that would add them, by ``check``
(through ``Publisher.admit``, the one gate): past either quota, all of them are refused with
``QueueFull`` when ``reject_msg_to_sender`` is on, and discarded and counted otherwise; nothing
of them is stored either way. Where a discard would lose messages silently the write is refused
whatever the setting: a checkpointed ``publish_many``, whose position would move past them. A
write of independent publishes (merged single publishes, ``publish_each``) is the one
exception to "together": when they do not all fit, each is checked alone, in order.

A staged job's commit is checked whole when it begins (all its rows and their bytes: refused,
nothing is published and the job stays open, to be committed again or aborted; discarded, the
whole job is dropped and counted), and each of its slices again when it is appended (another
publisher may have filled the queue between two slices: a refused slice leaves the job
committing with the rest staged, which ``resume_commits`` finishes once there is room).

The check runs in the write transaction, against what that transaction sees, so it holds across
processes: LMDB has one writer at a time, and two processes publishing into one queue can never
pass its quota together. It costs no log scan:

* depth: per existing log of the queue (its partitions, and the parent log ``PARENT``), the
  head minus what its ack state holds acked: one head and one ack state read per log, and only
  for a queue with ``max_depth`` set;
* bytes: a counter in the queue's meta, kept by the storage layer's appends and truncations
  (``partq.storage.writer.QUEUE_BYTES``; created by one scan of the queue's log the first time a
  queue with ``max_bytes`` publishes). It counts stored chunks, so acked messages free their
  bytes when their chunk is truncated: once every message of the chunk is acked (a single
  ``publish`` is a chunk of its own; a ``publish_many`` shares chunks per partition). A publish
  is checked with the bytes of its records (what its chunks hold, less a few bytes of framing).

Counts, of messages (queue meta: they survive restarts and reach a DR-standby like every meta
value): ``quota_discarded``, discarded by the quota, and ``quota_refused``, refused with
``QueueFull`` (a refused ``publish_many`` of 10 counts 10, as a discarded one does).

A refusal is counted in the very transaction that refuses it, not in a write of its own after
the fact, nor in memory: ``Publisher.place`` raises ``QueueFull`` before it has placed anything
(the byte counter it may have created is right either way), so the group-commit operation that
called it (``placed_or_refused``) catches it in that transaction, adds to ``quota_refused``
there and returns the error instead of raising it; the caller's thread raises it once the commit
is durable (``refusal_raised``). So each refusal is counted exactly once, atomically with the
decision and as durably as a publish (a count in memory would be lost with its process and
differ per process; a separate write after catching would cost a commit of its own and be lost
by a crash in between), and a refused publish does not abort the commit it shares with other
publishes (a raising operation makes the group commit run the whole batch again one operation at
a time). A staged job's commit, which writes in transactions of its own, does the same: it
counts the refusal in the transaction that refuses it and raises it once that is committed.
"""
from __future__ import annotations

from partq.config import QueueConfig
from partq.errors import InvalidMessage, PartqError, QueueFull
from partq.publish.encode import Encoded
from partq.storage.encoding import pack_u64, unpack_u64
from partq.storage.writer import log_bytes

COUNTER_REFUSED = b"quota_refused"       # queue meta: messages refused with QueueFull
COUNTER_DISCARDED = b"quota_discarded"   # queue meta: messages discarded by the quota


def queue_depth(reader, qid: int) -> int:
    """Messages published into queue id ``qid`` and not acked, over every log it has (its
    partitions and its parent log): O(logs), no log scan."""
    return sum(reader.ack_state(qid, p).backlog(reader.head(qid, p))
               for p in reader.partitions(qid))


def stored_bytes(reader, qid: int) -> int:
    """Bytes of queue id ``qid``'s stored log: its counter, or (a queue that never needed one)
    the sum of its chunks' sizes."""
    return log_bytes(reader, qid)


def quota_counts(reader, qid: int) -> dict[str, int]:
    """``{"refused": messages refused with QueueFull, "discarded": messages discarded}`` by the
    quota of queue id ``qid``, since it was created."""
    return {"refused": _count(reader, qid, COUNTER_REFUSED),
            "discarded": _count(reader, qid, COUNTER_DISCARDED)}


def record_bytes(config: QueueConfig, items: Encoded) -> int:
    """The bytes ``check`` counts for ``items`` (their records), summed only for a queue with
    ``max_bytes`` (0 otherwise: nothing to count them against)."""
    return sum([len(record) for _, record in items]) if config.max_bytes else 0


def check(w, config: QueueConfig, count: int, nbytes: int) -> QueueFull | None:
    """The ``QueueFull`` that adding ``count`` messages of ``nbytes`` record bytes in this
    transaction would earn, or None when they fit under both quotas (or the queue has none).
    Writes nothing but the byte counter, on a queue's first check with ``max_bytes`` (a value
    that is right whether or not the transaction goes on)."""
    if config.max_depth:
        depth = queue_depth(w, config.qid)
        if depth + count > config.max_depth:
            return QueueFull(config.name, "max_depth", config.max_depth, depth)
    if config.max_bytes:
        stored = w.count_bytes(config.qid)
        if stored + nbytes > config.max_bytes:
            return QueueFull(config.name, "max_bytes", config.max_bytes, stored)
    return None


def refuse(w, config: QueueConfig, full: QueueFull, count: int, reject: bool = False) -> None:
    """``count`` messages do not fit: raise ``full`` (reject_msg_to_sender, or ``reject``: a
    checkpointed batch, which a discard would lose behind its stored position), or count them
    discarded (the caller returns discarded results)."""
    if config.reject_msg_to_sender or reject:
        raise full
    _add(w, config.qid, COUNTER_DISCARDED, count)


def placed_or_refused(publisher, w, queue: str, items: Encoded, encoded_with: QueueConfig,
                      reject: bool = False):
    """``publisher.place(w, queue, items, encoded_with)`` for a group-commit operation: its
    results, or the ``QueueFull`` it raised (before placing anything), counted in this
    transaction, or the ``InvalidMessage`` of a message over limits lowered since it was
    checked; returned for the caller's thread to raise (``refusal_raised``)."""
    try:
        return publisher.place(w, queue, items, encoded_with, reject=reject)
    except QueueFull as full:
        count_refused(w, publisher.config_in(w, queue).qid, len(items))
        return full
    except InvalidMessage as invalid:
        return invalid


def each_alone(publisher, w, queue: str, items: Encoded, config: QueueConfig) -> list:
    """Independent publishes (checked against ``config``) that do not all fit: each placed
    alone, in order (so the ones that fit go in, as if published one after the other); a
    refused one's result is its ``QueueFull`` (counted), a discarded one's is discarded."""
    out: list = []
    for item in items:
        placed = placed_or_refused(publisher, w, queue, [item], config)
        out.append(placed[0] if type(placed) is list else placed)
    return out


def count_refused(w, qid: int, count: int) -> None:
    """Count ``count`` messages refused with ``QueueFull`` in queue id ``qid``, in the
    transaction that refused them."""
    _add(w, qid, COUNTER_REFUSED, count)


def refusal_raised(value):
    """``value``, the result of a publish's write, or raise it when it is the error (a
    ``QueueFull``, counted, or an ``InvalidMessage``) its operation returned instead of
    raising."""
    if isinstance(value, PartqError):
        raise value
    return value


class RaisesRefusal:
    """A group-commit handle whose ``result()`` raises the error its operation returned
    (``refusal_raised``; ``partq.pending.WriteHandle``)."""

    __slots__ = ("_fut",)

    def __init__(self, fut) -> None:
        self._fut = fut

    def done(self) -> bool:
        return self._fut.done()

    def result(self):
        return refusal_raised(self._fut.result())

    def add_done_callback(self, fn) -> None:
        self._fut.add_done_callback(fn)


def _count(reader, qid: int, name: bytes) -> int:
    raw = reader.queue_meta(qid, name)
    return 0 if raw is None else unpack_u64(raw)


def _add(w, qid: int, name: bytes, count: int) -> None:
    w.put_queue_meta(qid, name, pack_u64(_count(w, qid, name) + count))
