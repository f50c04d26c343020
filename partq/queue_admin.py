"""The queue verbs of ``Broker``: create, look up, change, delete and scale queues, and ack or
kill one message by its position (an operator's tools). ``Broker`` provides the store, the
publisher, the dispatcher and the clock (declared here)."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from partq import scaling
from partq.config import USER_SETTABLE, QueueConfig
from partq.delivery import DeliveryLock, ack_parent_log
from partq.delivery.holds import clear_cutover
from partq.delivery.outside import ack_op, kill_op
from partq.errors import InvalidConfig, QueueExists, queue_not_found
from partq.flow import U32, U64
from partq.publish.publisher import Publisher
from partq.scaling.progress_log import scaling_log
from partq.states import ScalingState
from partq.storage import Store
from partq.storage.encoding import PARENT


def _create_logs(w, config: QueueConfig) -> None:
    """Start the logs a queue delivers: its partitions, or the parent queue when exclusive. A
    log that already exists (the parent after earlier exclusive use) keeps its messages."""
    for p in range(config.partitions) if config.partitioned else (PARENT,):
        if not w.has_partition(config.qid, p):
            w.init_partition(config.qid, p)


def _change_logs(w, old: QueueConfig, new: QueueConfig) -> None:
    """The storage side of a change of access type (rule `ingress-egress`): to non-partitioned the
    partitions go with their messages; to partitioned the parent log stays as it is."""
    if old.partitioned:
        for p in reversed(range(old.partitions)):
            w.drop_partition(old.qid, p)
    _create_logs(w, new)


def check_position(partition, seq) -> None:
    """Refuse a position storage cannot hold (a partition below 2**32, a seq below 2**64)."""
    for what, v, high in (("partition", partition, U32), ("seq", seq, U64)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= high:
            raise InvalidConfig(f"{what} must be an integer from 0 to {high}, not {v!r}")


class QueueAdmin:
    """The queue verbs of ``Broker``."""

    _store: Store
    publisher: Publisher
    dispatcher: Any
    clock: Any

    def _check_writable(self) -> None:
        raise NotImplementedError

    def tick(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ queues
    def create_queue(self, name: str, partitions: int = 1, exist_ok: bool = False,
                     **options) -> QueueConfig:
        """Create a queue and return its config; options are the fields of ``QueueConfig``.

        A queue of that name that exists already raises ``QueueExists``; with ``exist_ok=True``
        its config is returned instead, as stored, so a service can run its setup on every
        start. Its settings are not compared with the ones given (an operator may have scaled
        or updated it since, and a service must still start): compare the returned config if
        they matter. The arguments are checked either way."""
        self._check_writable()
        refused = set(options) - USER_SETTABLE
        if refused:
            raise InvalidConfig(f"unknown queue option(s) {', '.join(sorted(refused))}; known: "
                                f"{', '.join(sorted(USER_SETTABLE))}")
        config = QueueConfig(name=name, partitions=partitions, **options)

        def op(w):
            existing = w.queue(name)
            if existing is not None:
                if exist_ok:
                    return QueueConfig.from_dict(existing)
                raise QueueExists(f"queue {name!r} already exists; pick another name or delete it")
            created = dataclasses.replace(config, qid=w.allocate_qid())
            w.put_queue(name, created.to_dict())
            _create_logs(w, created)
            return created
        return self._store.write(op)

    def queue_config(self, name: str) -> QueueConfig:
        with self._store.read() as r:
            raw = r.queue(name)
            if raw is None:
                raise queue_not_found(name, r.queues())
        return QueueConfig.from_dict(raw)

    def ensure_dead_message_queue(self, name: str) -> tuple[str, list[str]]:
        """Make sure that what queue ``name`` rejects is kept, not discarded: a queue without a
        ``dead_message_queue`` gets ``<name>.dead``, and the dead message queue is created (one
        partition) when it does not exist. One transaction. Returns the dead message queue's
        name and what was done, in words for a log (empty when nothing was)."""
        self._check_writable()
        self.queue_config(name)     # QueueNotFound with the names there are

        def op(w):
            current = self.publisher.config_in(w, name)
            dead = current.dead_message_queue or f"{name}.dead"
            done = []
            if w.queue(dead) is None:
                created = QueueConfig(name=dead, partitions=1)
                created = dataclasses.replace(created, qid=w.allocate_qid())
                w.put_queue(dead, created.to_dict())
                _create_logs(w, created)
                done.append(f"created queue {dead!r}")
            if not current.dead_message_queue:
                w.put_queue(name, current.updated(dead_message_queue=dead).to_dict())
                done.append(f"set it as the dead message queue of {name!r}")
            return dead, done
        dead, done = self._store.write(op)
        if done:
            self.publisher.forget(name)
            self.tick()
        return dead, done

    def queues(self) -> list[QueueConfig]:
        with self._store.read() as r:
            return [QueueConfig.from_dict(c) for c in r.queues().values()]

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages. Refused while another process runs its delivery."""
        self._check_writable()
        config = self.queue_config(name)
        lock = (self.dispatcher.release(name, f"queue {name!r} was deleted")
                or DeliveryLock(self._store.path, config.qid, name))
        self.publisher.forget(name)

        def op(w):
            current = w.queue(name)
            if current is not None and current["qid"] == config.qid:
                w.delete_queue(name, config.qid)
        try:
            self._store.write(op)
        finally:
            lock.release()

    # ------------------------------------------------------------------ changing queues
    def update_queue(self, name: str, **changes) -> QueueConfig:
        """Change settings of a queue (delays, limits, partitioner, ingress/egress, discard
        handling, access type). The delivery owner, in this process or another, applies them
        within a tick.

        ``access_type`` changes the queue between partitioned ("non-exclusive") and
        non-partitioned ("exclusive") as rule `ingress-egress` says: every bound flow is unbound
        (``FlowClosed`` says why). To exclusive, the partitions are removed with their messages
        and publishes go to the parent queue; to non-exclusive, the partitions are created
        afresh and messages still in the parent queue stay there, no longer delivered: copy them
        out with ``partq copy-out QUEUE --parent``. Done in one transaction."""
        self._check_writable()
        self.queue_config(name).updated(**changes)  # validate before writing

        def op(w):
            current = self.publisher.config_in(w, name)
            new = current.updated(**changes)
            if new.partitioned != current.partitioned:
                if current.scaling_status != ScalingState.READY:
                    raise InvalidConfig(f"queue {name!r} is {current.scaling_status}; change its "
                                        f"access type once the scaling has finished")
                _change_logs(w, current, new)
                clear_cutover(w, current.qid)     # no partitions, no per-key holds
            w.put_queue(name, new.to_dict())
            return new
        new = self._store.write(op)
        self.publisher.forget(name)
        self.tick()
        return new

    def ack_parent(self, name: str, seqs: Iterable[int]) -> int:
        """Ack messages of the parent queue's log of a *partitioned* queue: the ones a change
        from exclusive to non-exclusive left there, which nothing delivers any more. Call it once
        copies of them are durable elsewhere (``partq copy-out QUEUE --parent --move`` does);
        acked messages leave the log (rule `truncation`). Returns how many were newly acked. Refused while the
        queue is exclusive: its parent log is then delivered, and acks go through a flow."""
        self._check_writable()
        seqs = list(seqs)
        if not all(type(s) is int and s >= 0 for s in seqs):
            raise InvalidConfig("parent-queue sequences must be integers >= 0")

        def op(w):
            config = self.publisher.config_in(w, name)
            if not config.partitioned:
                raise InvalidConfig(f"queue {name!r} is exclusive: its parent-queue log is what it "
                                    f"delivers; ack its messages through a flow")
            return ack_parent_log(w, config.qid, seqs)
        return self._store.write(op)

    def ack_message(self, queue: str, partition: int, seq: int) -> bool:
        """Ack one message by its position, whoever holds it: an operator's way to unblock a
        partition (``partq message ack``). Whoever delivers the partition sees it before its
        next delivery. Returns False when it was acked already; raises ``PartitionNotFound``."""
        self._check_writable()
        check_position(partition, seq)
        return self._store.write(ack_op(self.publisher.config_in, queue, partition, seq))

    def kill_message(self, queue: str, partition: int, seq: int) -> bool:
        """Move one message by its position to the queue's dead message queue, as a reject
        would (``dead_reason`` "rejected"; discarded and counted without one): an operator's way
        to unblock a partition held by a message nobody can process (``partq message kill``).
        Returns False when it was acked already; raises ``PartitionNotFound``."""
        self._check_writable()
        check_position(partition, seq)
        return self._store.write(kill_op(self.publisher.config_in, queue, partition, seq,
                                         self.clock.wall_ns()))

    def scale(self, name: str, partitions: int, progress=None, online: bool = False,
              wait: bool = True) -> QueueConfig:
        """Change the partition count (rule `scaling`), one step per commit so statuses are visible; see
        ``partq.scaling.change_count``. ``progress(step: str)`` is called after each step. The
        seven-step procedure around it (ingress, drain, DR waits) is ``partq.scaling.run``.

        ``online=True`` (rule `online-scaling`) keeps per-key order with ingress on: a message published after
        the switch whose key moved is delivered only once its key's old partition has been
        acked up to the switch; unkeyed messages and keys that did not move flow at once.
        Scaling down online retires the removed partitions: publishes stop going there, they
        are delivered until drained, then removed; ``wait`` (default) returns once that is done,
        ``wait=False`` at once (the queue stays ScalingDown until this process or the next that
        delivers it sees them drained)."""
        self._check_writable()
        return scaling.change_count(self, name, partitions, scaling_log(name, "", progress), online,
                                    wait=wait)
