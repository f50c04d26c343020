"""The broker: queues, durable publish, flows, timers. The shell around storage and the core.

Threads and locks
* Callers' threads publish, bind, receive and ack. Publishes never take the broker lock: they
  encode in the caller's thread and queue a write for the group-commit thread.
* ``self._lock`` guards delivery state (``QueueDelivery`` objects). Under it, code may read LMDB
  and *queue* writes, but never waits for a commit: that happens after the lock is released,
  so the commit thread can never wait on a caller holding the lock.
* With a ``SystemClock`` a ticker thread runs due timers every 50 ms. With any other clock
  (``ManualClock`` in tests) timers run when ``tick()`` or ``Flow.receive`` is called.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import threading
import uuid
import weakref
from typing import Iterable

from partq.clock import SystemClock
from partq.config import MAX_PARTITIONS, USER_SETTABLE, QueueConfig
from partq.delivery import QueueDelivery, ack_parent_log, delivery_layout
from partq.delivery_lock import DeliveryLock, queue_holder
from partq.errors import (IngressDisabled, InvalidConfig, InvalidMessage, PartqError, QueueExists,
                          QueueNotFound, StandbyReadOnly)
from partq.flow import Flow
from partq.hashing import crc32c_of
from partq.load import LoadSampler
from partq.partitioners import make_partitioner
from partq.message import PublishResult
from partq.pending import Pending
from partq.publishing import Publisher, discarded_count
from partq.rebalancer import Rebalancer
from partq.replication import ReplicationServer, StandbyFollower, stored_slots_status
from partq.scaling import read_procedure
from partq.status import FlowStatus, PartitionStatus, QueueStatus
from partq.storage import Store, crashpoints
from partq.storage.encoding import (PARENT, check_headers, decode_meta, frame_crc, pack_record_body,
                                    pack_u64, unpack_u64)
from partq.storage.store import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE

log = logging.getLogger("partq.broker")

TICK_INTERVAL = 0.05     # seconds between timer checks with a SystemClock


def _create_logs(w, config: QueueConfig) -> None:
    """Start the logs a queue delivers: its partitions, or the parent queue when exclusive. A
    log that already exists (the parent after earlier exclusive use) keeps its messages."""
    for p in range(config.partitions) if config.partitioned else (PARENT,):
        if not w.has_partition(config.qid, p):
            w.init_partition(config.qid, p)


def _change_logs(w, old: QueueConfig, new: QueueConfig) -> None:
    """The storage side of a change of access type (seed 001): to non-partitioned the
    partitions go with their messages; to partitioned the parent log stays as it is."""
    if old.partitioned:
        for p in reversed(range(old.partitions)):
            w.drop_partition(old.qid, p)
    _create_logs(w, new)


_open_brokers: "weakref.WeakSet[Broker]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A thread of the parent may have held a broker's lock at fork time; in the child that
    thread does not exist, so the lock would never be released. Fresh locks let the child reach
    the pid check and get UsedAcrossFork instead of hanging."""
    for broker in list(_open_brokers):
        broker._lock = threading.RLock()
        broker._data_cond = threading.Condition()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Broker:
    """A partq directory opened for publishing, consuming and administration.

    Use ``Broker.open(path)``; close it (or use ``with``). Safe to share between threads of one
    process; not across ``fork()``: a forked child gets ``UsedAcrossFork`` (LMDB cannot reopen
    its parent's files there either), so open brokers after forking, or use 'spawn'.
    """

    def __init__(self, store: Store, clock, rng: random.Random, auto_tick: bool) -> None:
        self._store = store
        self._replication = None     # ReplicationServer on a primary that listens
        self._follower = None        # StandbyFollower on a standby that follows
        self._standby = False        # True while this directory is a DR-standby
        self.clock = clock
        self._lock = threading.RLock()
        self._deliveries: dict[str, QueueDelivery] = {}
        self._delivery_locks: dict[str, DeliveryLock] = {}
        self.publisher = Publisher(store, clock, rng)
        self._data_cond = threading.Condition()
        self._data_gen = 0
        self._closed = False
        store.on_commit(lambda appended: self._wake_receivers())
        _open_brokers.add(self)
        self._ticker = None
        if auto_tick:
            self._ticker_stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick_loop, name="partq-ticker", daemon=True)
            self._ticker.start()

    @classmethod
    def open(cls, path: str | os.PathLike, *, durability: str = "sync", clock=None,
             seed: int | None = None, map_size: int = DEFAULT_MAP_SIZE,
             max_map_size: int = DEFAULT_MAX_MAP_SIZE, create: bool = True,
             auto_tick: bool | None = None, replication_listen: str | None = None,
             replication_mode: str = "async", sync_timeout: float = 10.0,
             standby_of: str | None = None) -> "Broker":
        """Open the partq directory ``path`` (created if missing unless ``create=False``).

        ``durability``: "sync" (default; publish and ack return after an fsynced commit) or
        "async" (see ``partq.storage.Store.open`` for exactly what it gives up). ``clock``:
        ``SystemClock()`` by default. ``seed``: seeds the random unkeyed partitioner.
        ``map_size``/``max_map_size``: initial and largest LMDB map; the map doubles on demand
        up to the largest, past which writes fail with ``StorageFull``.

        Replication (S27): ``replication_listen="HOST:PORT"`` serves DR-standbys in
        ``replication_mode`` "async" (default) or "sync" (publish returns once a standby has the
        commit durably, or raises ``ReplicationTimeout`` after ``sync_timeout`` s).
        ``standby_of="HOST:PORT"`` opens this directory as a DR-standby that follows that primary;
        a standby refuses publishes and binds until ``promote()``. A directory that was a standby
        stays one (read-only) when reopened without ``standby_of``, until promoted.
        """
        if replication_listen and standby_of:
            raise InvalidConfig("a broker is either a primary (replication_listen) or a standby "
                                "(standby_of), not both")
        clock = clock or SystemClock()
        store = Store.open(path, durability=durability, map_size=map_size, max_map_size=max_map_size,
                           create=create)
        if auto_tick is None:
            auto_tick = isinstance(clock, SystemClock)
        broker = cls(store, clock, random.Random(seed), auto_tick)
        try:
            with store.read() as r:
                broker._standby = r.meta(b"role") == b"standby"
            if standby_of:
                if not broker._standby:
                    if broker.queues():
                        raise InvalidConfig(f"{broker.path} already holds queues; a DR-standby must "
                                            f"start from a new directory")
                    store.write(lambda w: w.put_local_meta(b"role", b"standby"))
                    broker._standby = True
                broker._follower = StandbyFollower(store, standby_of)
            elif not broker._standby:
                for config in broker.queues():
                    if config.scaling_status != "Ready":
                        broker._finish_scaling(config.name)
                if replication_listen:
                    broker._replication = ReplicationServer(store, replication_listen,
                                                            replication_mode, sync_timeout)
        except BaseException:
            broker.close()
            raise
        return broker

    # ------------------------------------------------------------------ replication
    def _check_writable(self) -> None:
        if self._standby:
            raise StandbyReadOnly(f"{self.path} is a DR-standby: it refuses publishes, binds and "
                                  f"queue changes until promoted (`partq dr promote`)")

    def replication_status(self):
        """Role, link state and lag (in messages and seconds) of DR replication."""
        if self._follower is not None:
            return self._follower.status()
        if self._replication is not None:
            return self._replication.status()
        return stored_slots_status(self._store, "standby" if self._standby else "primary")

    def promote(self, replication_listen: str | None = None, replication_mode: str = "async",
                sync_timeout: float = 10.0) -> None:
        """Make this DR-standby a primary: stop following, accept publishes and binds, and (with
        ``replication_listen``) serve standbys of its own. Consumers that rebind with their names
        or hints within the rebalance delay keep their partitions. The promoted store starts a
        new timeline, so a standby of the old primary re-bootstraps instead of resuming from
        LSNs that name other commits here."""
        if not self._standby:
            raise InvalidConfig(f"{self.path} is not a DR-standby; nothing to promote")
        if self._follower is not None:
            self._follower.close()
            self._follower = None

        def op(w):
            applied = w.meta(b"applied_lsn")
            lsn = max(unpack_u64(w.meta(b"lsn") or pack_u64(0)),
                      unpack_u64(applied) if applied else 0)
            w.put_local_meta(b"lsn", pack_u64(lsn))
            w.put_local_meta(b"timeline", uuid.uuid4().hex.encode())
            w.delete_local_meta(b"role")
        self._store.write(op)
        self._standby = False
        if replication_listen:
            self._replication = ReplicationServer(self._store, replication_listen, replication_mode,
                                                  sync_timeout)

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def store(self) -> Store:
        """The storage engine under this broker (read snapshots, raw writes): for partq's own
        tools and for inspection; queue semantics live in the Broker's methods."""
        return self._store

    @property
    def open_report(self) -> dict:
        """What opening did (store created, stale reader slots cleared)."""
        return self._store.report.as_dict()

    # ------------------------------------------------------------------ queues
    def create_queue(self, name: str, partitions: int = 1, **options) -> QueueConfig:
        """Create a queue; options are the fields of ``QueueConfig``."""
        self._check_writable()
        refused = set(options) - USER_SETTABLE
        if refused:
            raise InvalidConfig(f"unknown queue option(s) {', '.join(sorted(refused))}; known: "
                                f"{', '.join(sorted(USER_SETTABLE))}")
        config = QueueConfig(name=name, partitions=partitions, **options)

        def op(w):
            if w.queue(name) is not None:
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
            raise QueueNotFound(f"no queue named {name!r}; create it with create_queue "
                                f"(or `partq queue create {name}`)")
        return QueueConfig.from_dict(raw)

    def queues(self) -> list[QueueConfig]:
        with self._store.read() as r:
            return [QueueConfig.from_dict(c) for c in r.queues().values()]

    def delete_queue(self, name: str) -> None:
        """Delete a queue and its messages. Refused while another process runs its delivery."""
        self._check_writable()
        config = self.queue_config(name)
        with self._lock:
            qd = self._deliveries.pop(name, None)
            if qd is not None:
                for flow in list(qd.flows.values()):
                    flow._close(f"queue {name!r} was deleted")
            lock = self._delivery_locks.pop(name, None) or DeliveryLock(self.path, config.qid, name)
            self.publisher.forget(name)
        def op(w):
            current = w.queue(name)
            if current is not None and current["qid"] == config.qid:
                w.delete_queue(name, config.qid)
        try:
            self._store.write(op)
        finally:
            lock.release()

    # ------------------------------------------------------------------ publish
    def publish(self, queue: str, payload: bytes, key: str | None = None,
                headers: dict | None = None) -> PublishResult:
        """Publish one message; return once it is durable (S23). Concurrent publishers in this
        process share commits. A keyed message goes to ``crc32c(key) % partitions`` (S1)."""
        return self.publish_async(queue, payload, key, headers).result()

    def publish_async(self, queue: str, payload: bytes, key: str | None = None,
                      headers: dict | None = None) -> Pending:
        """``publish`` without waiting for the commit: bad input raises here, and the returned
        ``Pending.result()`` gives the ``PublishResult`` once the message is durable (or raises
        what the commit raised). One thread can keep many publishes in flight this way; they
        share commits like concurrent publishers do, and land in the order they were made."""
        self._check_writable()
        return self.publisher.publish_async(queue, payload, key, headers)

    def publish_many(self, queue: str, items: Iterable,
                     checkpoint: tuple[str, int] | None = None) -> list[PublishResult]:
        """Publish a batch in one transaction: all of it is durable when this returns, or none of
        it is stored. Items are ``payload``, ``(payload, key)`` or ``(payload, key, headers)``.

        ``checkpoint=(name, position)`` makes a resumable copy idempotent: the position is stored
        in the same transaction, and a batch whose position is not beyond the stored one is
        skipped (returns ``[]``). Read it back with ``checkpoint(queue, name)``. A checkpoint
        belongs to the queue it was published into: deleting the queue deletes it, and a queue
        created again under the same name starts with none.
        """
        self._check_writable()
        return self.publisher.publish_many(queue, items, checkpoint)

    def checkpoint(self, queue: str, name: str) -> int | None:
        """The last position ``publish_many(queue, ..., checkpoint=(name, position))`` stored."""
        return self.publisher.checkpoint(queue, name)

    # ------------------------------------------------------------------ changing queues
    def update_queue(self, name: str, **changes) -> QueueConfig:
        """Change settings of a queue (delays, limits, partitioner, ingress/egress, discard
        handling, access type). The delivery owner, in this process or another, applies them
        within a tick.

        ``access_type`` changes the queue between partitioned ("non-exclusive") and
        non-partitioned ("exclusive"), as seed 001 describes: every bound flow is unbound
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
                if current.scaling_status != "Ready":
                    raise InvalidConfig(f"queue {name!r} is {current.scaling_status}; change its "
                                        f"access type once the scaling has finished")
                _change_logs(w, current, new)
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
        acked messages leave the log (S26). Returns how many were newly acked. Refused while the
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

    def scale(self, name: str, partitions: int, progress=None) -> QueueConfig:
        """Change the partition count (S18), one step per commit so statuses are visible.

        Up: ScalingUp while partitions old..new-1 are created; the key mapping switches to the
        new count in the commit that ends the scaling, once every new partition exists.
        Down: the count drops at once (publishes and delivery stop using the extra partitions;
        ScalingDown), then the highest-numbered partitions are deleted first, with their
        messages. Either way the delivery owner rebalances at once (no holddown). A scaling cut
        short by a crash is finished by the next ``Broker.open``. ``progress(step: str)`` is
        called after each step.
        """
        self._check_writable()
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidConfig(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, not {partitions!r}")
        config = self.queue_config(name)
        if not config.partitioned:
            raise InvalidConfig(f"queue {name!r} is exclusive (non-partitioned); make it "
                                f"partitioned with access_type='non-exclusive' to scale it")
        if config.scaling_status != "Ready":
            self._finish_scaling(name, progress)
            config = self.queue_config(name)
        old = config.partitions
        if partitions == old:
            return config

        def start(w):
            c = self.publisher.config_in(w, name)
            if partitions > old:
                c = dataclasses.replace(c, scaling_status="ScalingUp", scaling_from=old, scaling_to=partitions)
            else:
                c = dataclasses.replace(c, partitions=partitions, scaling_status="ScalingDown",
                                        scaling_from=old, scaling_to=partitions)
            w.put_queue(name, c.to_dict())
        self._store.write(start)
        if progress:
            progress(f"{'ScalingUp' if partitions > old else 'ScalingDown'} {old} -> {partitions}")
        return self._finish_scaling(name, progress)

    def _finish_scaling(self, name: str, progress=None) -> QueueConfig:
        """Carry a scaling in progress to its end. Several processes may do this at once (the
        scaler and any process that opens meanwhile), so every step re-checks, in its own
        transaction, that the queue is still in this same scaling, and a partition is created
        only if it has no state yet: a slower finisher must never reset a partition that has
        already taken publishes."""
        config = self.queue_config(name)
        qid, old, new = config.qid, config.scaling_from, config.scaling_to
        scaling = (config.scaling_status, old, new)

        def same(w) -> bool:
            c = self.publisher.config_in(w, name)
            return (c.scaling_status, c.scaling_from, c.scaling_to) == scaling

        def create(w, p):
            if same(w) and not w.has_partition(qid, p):
                w.init_partition(qid, p)

        def drop(w, p):
            return w.drop_partition(qid, p) if same(w) else 0

        if config.scaling_status == "ScalingUp":
            for p in range(old, new):
                self._store.write(lambda w, p=p: create(w, p))
                if crashpoints.ENABLED:
                    crashpoints.hit("during_scaling")
                if progress:
                    progress(f"created partition {p}")
            done = {"partitions": new}
        elif config.scaling_status == "ScalingDown":
            self.tick()  # a local delivery owner stops using the extra partitions first
            for p in reversed(range(new, old)):
                n = self._store.write(lambda w, p=p: drop(w, p))
                if crashpoints.ENABLED:
                    crashpoints.hit("during_scaling")
                if progress:
                    progress(f"deleted partition {p} ({n} messages)")
            done = {}
        else:
            return config

        def finish(w):
            if not same(w):
                return self.publisher.config_in(w, name)   # another process finished it already
            c = dataclasses.replace(self.publisher.config_in(w, name), scaling_status="Ready",
                                    scaling_from=0, scaling_to=0, **done)
            w.put_queue(name, c.to_dict())
            return c
        final = self._store.write(finish)
        self.publisher.forget(name)
        self.tick()
        if progress:
            progress(f"Ready with {final.partitions} partitions")
        return final

    # ------------------------------------------------------------------ consume
    def bind(self, queue: str, name: str | None = None, hint: Iterable[int] | None = None,
             skip_corrupt: bool = False) -> Flow:
        """Bind a flow to ``queue`` and return it with its assigned partitions (S15).

        ``name``: a stable consumer name; a consumer that binds again under it within the
        rebalance delay (even after its own restart) gets its partitions back (S17).
        ``hint``: the partition set a reconnecting consumer held (``flow.partitions``).
        ``skip_corrupt``: deliver past records that fail their checksum (logged) instead of
        stopping delivery of that partition.
        """
        self._store._check_usable()
        self._check_writable()
        if name is not None and not isinstance(name, str):
            raise InvalidConfig(f"flow name must be a str, not {type(name).__name__}")
        if hint is not None:
            hint = list(hint)
            if not all(isinstance(p, int) and not isinstance(p, bool) for p in hint):
                raise InvalidConfig(f"hint must be a collection of partition numbers, not {hint!r}")
        with self._lock:
            qd = self._delivery(queue)
            now = self.clock.now()
            with self._store.read() as r:      # a change stored since the last tick comes first
                ops = self._config_ops(qd, r, now)
            if name is not None and qd.core.find_bound(name) is not None:
                self._submit(ops)
                raise InvalidConfig(f"a flow named {name!r} is already bound to {queue!r}; "
                                    f"unbind it first or pick another name")
            flow = Flow(self, qd, uuid.uuid4().hex[:12], name, skip_corrupt)
            fut = self._submit(ops + qd.bind(flow, hint, now))
        self._wait(fut)
        return flow

    def _delivery(self, queue: str) -> QueueDelivery:
        """This process's delivery runtime for ``queue``; takes the queue's delivery lock."""
        qd = self._deliveries.get(queue)
        if qd is not None:
            return qd
        config = self.queue_config(queue)
        lock = DeliveryLock(self.path, config.qid, queue)
        try:
            with self._store.read() as r:
                qd = QueueDelivery(config, r, self.clock.now())
        except BaseException:
            lock.release()
            raise
        self._delivery_locks[queue] = lock
        self._deliveries[queue] = qd
        return qd

    def _submit(self, ops: list):
        """Queue ``ops`` as one write (call under the lock to keep their order)."""
        if not ops:
            return None
        if len(ops) == 1:
            return self._store.submit(ops[0])
        return self._store.submit(lambda w: [op(w) for op in ops])

    def _wait(self, fut) -> None:
        """Wait for a commit (never under the lock); wake receivers whose state changed."""
        if fut is not None:
            fut.result()
        self._wake_receivers()

    def _wake_receivers(self) -> None:
        with self._data_cond:
            self._data_gen += 1
            self._data_cond.notify_all()

    def _wait_for_data(self, gen: int, timeout: float) -> None:
        with self._data_cond:
            if self._data_gen == gen:
                self._data_cond.wait(timeout)

    # ------------------------------------------------------------------ timers
    def tick(self) -> None:
        """Run every rebalance and handoff timer that is due by the clock."""
        self._store._check_usable()
        with self._lock:
            fut = self._submit(self._due_timer_ops())
        self._wait(fut)

    def _due_timer_ops(self) -> list:
        now = self.clock.now()
        ops: list = []
        if self._deliveries:
            with self._store.read() as r:
                for qd in self._deliveries.values():
                    ops += self._config_ops(qd, r, now)
        for qd in self._deliveries.values():
            deadline = qd.core.next_deadline()
            if deadline is not None and deadline <= now:
                ops += qd.tick(now)
        return ops

    @staticmethod
    def _config_ops(qd: QueueDelivery, r, now: float) -> list:
        """Apply the queue's stored config to its delivery runtime if it changed (in this
        process or another) since the runtime last looked."""
        raw = r.queue_raw(qd.name)
        if raw is None or raw == qd.config_raw:
            return []
        config = QueueConfig.from_dict(decode_meta(raw, f"config of {qd.name!r}"))
        return qd.apply_config(config, raw, r, now)

    def _tick_loop(self) -> None:
        while not self._ticker_stop.wait(TICK_INTERVAL):
            try:
                self.tick()
            except PartqError as exc:
                if self._closed:
                    return
                log.warning("timer run failed: %s", exc)

    # ------------------------------------------------------------------ status
    def queue_status(self, queue: str) -> QueueStatus:
        """Statuses, flows and depths of ``queue``. From a process that does not run its
        delivery, assignments and statuses are those the owner last persisted; when no process
        runs it, the flows of the last owner are shown unbound and their partitions Unbound.
        An exclusive queue shows one partition, ``PARENT``: the parent queue's log."""
        with self._lock:
            qd = self._deliveries.get(queue)
            with self._store.read() as r:
                raw = r.queue(queue)
                if raw is None:
                    raise QueueNotFound(f"no queue named {queue!r}")
                config = QueueConfig.from_dict(raw)
                mode, index = delivery_layout(config)
                owner_text = queue_holder(self.path, config.qid)
                if qd is not None and qd.mode == mode:
                    core, statuses, rebalance = qd.core, None, qd.core.status
                else:
                    qd = None
                    blob = r.state(config.qid)
                    state = decode_meta(blob, f"state of {queue!r}") if blob else None
                    if state is not None and state.get("mode", "partitioned") != mode:
                        state = None     # the owner has not applied an access-type change yet
                    core = (Rebalancer.restored(state["core"], 0, 0, 0) if state
                            else Rebalancer(len(index), 0, 0))
                    live = state is not None and owner_text is not None
                    statuses = state["partition_status"] if live else None
                    rebalance = state["rebalance_status"] if live else "Ready"
                parts = []
                for slot, p in enumerate(index):
                    ack = r.ack_state(config.qid, p)
                    head = r.head(config.qid, p)
                    owner = core.owner[slot] if slot < core.n else None
                    info = core.flows.get(owner) if owner else None
                    ps = qd.part(p) if qd is not None else None
                    if statuses and slot < len(statuses):
                        status = statuses[slot]
                    else:
                        status = core.partition_status(slot) if slot < core.n else "Unassigned"
                    parts.append(PartitionStatus(
                        partition=p, status=status,
                        flow=owner, flow_name=info.name if info else None,
                        depth=ack.backlog(head), unacked=len(ps.inflight) if ps else 0,
                        next_seq=head, ack_floor=ack.floor,
                        error=str(ps.error) if ps is not None and ps.error else None))
                parent_depth = (r.ack_state(config.qid, PARENT).backlog(r.head(config.qid, PARENT))
                                if r.has_partition(config.qid, PARENT) else 0)
                procedure = read_procedure(r, queue, config.qid)
                discarded = discarded_count(r, config.qid)

            def storage_partitions(slots) -> list[int]:
                return sorted(index[s] for s in slots if s < len(index))
            flows = [FlowStatus(f.flow_id, f.name, f.bound if qd is not None else False,
                                bool(f.partitions), storage_partitions(f.partitions))
                     for f in sorted(core.flows.values(), key=lambda f: f.order)]
        return QueueStatus(
            name=queue, partition_count=config.operating_partitions, rebalance_status=rebalance,
            scaling_status=config.scaling_status, ingress_enabled=config.ingress_enabled,
            egress_enabled=config.egress_enabled, depth=sum(p.depth for p in parts),
            partitions=parts, flows=flows, delivery_owner=owner_text,
            access_type=config.access_type, parent_depth=parent_depth, discarded=discarded,
            procedure=procedure.as_dict() if procedure else None,
            warnings=[procedure.describe()] if procedure and procedure.state != "running" else [])

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close flows (their state stays: consumers that come back within the rebalance delay
        after the next open keep their partitions), release delivery locks, close the store."""
        if self._closed:
            return
        self._closed = True
        if self._store._pid != os.getpid():
            return    # a forked child: the parent's locks, threads and environment are not ours
        if self._follower is not None:
            self._follower.close()
        if self._replication is not None:
            self._replication.close()
        if self._ticker is not None:
            self._ticker_stop.set()
            if threading.current_thread() is not self._ticker:
                self._ticker.join()
        with self._lock:
            for qd in self._deliveries.values():
                for flow in list(qd.flows.values()):
                    flow._close("the broker was closed")
            self._deliveries.clear()
            for lock in self._delivery_locks.values():
                lock.release()
            self._delivery_locks.clear()
        self._wake_receivers()
        self._store.close()

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
