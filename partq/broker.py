"""The broker: one open partq directory, and the verbs of the public API.

The Broker is a facade over its rooms: ``publishing`` (encode, place), ``delivery`` (the
dispatcher that owns this process's flows, timers and delivery locks), ``scaling``, ``status``
and ``replication``. It holds no queue state of its own beyond what those hold.

Thread-safety: a Broker may be shared by the threads of one process; not across ``fork()``:
a forked child gets ``UsedAcrossFork`` (LMDB cannot reopen its parent's files there either),
so open brokers after forking, or use 'spawn'.
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

from partq import scaling
from partq.clock import SystemClock
from partq.config import QueueConfig
from partq.delivery.lock import beat_age, lock_path, queue_holder
from partq.delivery.open_report import log_open_report
from partq.errors import (
    BrokerClosed,
    InvalidConfig,
    OpenedReadOnly,
    PartqError,
    StandbyReadOnly,
    queue_not_found,
)
from partq.flow import BoundFlows, Flow
from partq.message import PublishResult
from partq.pending import Pending
from partq.publish.publisher import Publisher
from partq.queue_admin import QueueAdmin
from partq.replication.role import ReplicationRole, replication_options
from partq.replication.settings import check_sync_timeout
from partq.scaling.progress_log import scaling_log
from partq.states import ScalingState
from partq.storage import Store
from partq.storage.store import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE

if TYPE_CHECKING:
    from partq.delivery.dispatcher import Dispatcher
    from partq.metrics import MetricsServer
    from partq.replication.status import ReplicationStatus
    from partq.status import QueueStatus
    from partq.transactions import BrokerTransaction


_open_brokers: weakref.WeakSet[Broker] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for broker in list(_open_brokers):
        broker.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

log = logging.getLogger("partq.broker")

RETIRE_CHECK = 0.25   # seconds between looks for online scale-downs that drained
SWEEP_INTERVAL = 30.0     # seconds between sweeps of expired messages (``sweep_expired``)

class Broker(QueueAdmin):
    """A partq directory opened for publishing, consuming and administration.

    Use ``Broker.open(path)``; close it (or use ``with``).
    """

    _metrics: MetricsServer | None = None     # the endpoint of ``metrics_listen``

    def __init__(self, store: Store, clock, rng: random.Random, auto_tick: bool, *,
                 read_only: str | None = None) -> None:
        """A broker over ``store``; ``Broker.open`` is the usual way. ``read_only``: why this
        broker refuses publishes, binds and changes (``partq.ops.read_only``), None: it
        writes."""
        self.read_only = read_only
        self._store = store
        self._role = ReplicationRole(store)
        self._closed = False
        self.clock = clock
        self.publisher = Publisher(store, clock, rng)
        self._auto_tick = auto_tick
        self._dispatcher: Dispatcher | None = None
        self._building = threading.Lock()
        self.bound_flows = BoundFlows()       # what a transaction finds received messages in
        self._retire_checked = 0.0
        self._swept = time.monotonic()
        # a process that only publishes builds no dispatcher, but its periodic work (expired
        # messages, drained scale-downs) still starts within a sweep interval of the open
        self._janitor = threading.Timer(SWEEP_INTERVAL, self._start_periodic) if auto_tick \
            else None
        if self._janitor is not None:
            self._janitor.daemon = True
            self._janitor.start()
        _open_brokers.add(self)

    @property
    def dispatcher(self) -> Dispatcher:
        """The delivery of this process (``partq.delivery.dispatcher``: flows, timers,
        delivery locks, the ticker), built at its first use: a bind, a status, a queue deletion,
        or the periodic work a sweep interval after the open. A process that only publishes
        does not load delivery."""
        return self._dispatcher or self._build_dispatcher()

    def _build_dispatcher(self) -> Dispatcher:
        with self._building:
            if self._dispatcher is None:
                if self._closed:
                    raise BrokerClosed(f"the broker of {self.path} is closed; open it again")
                from partq.delivery.dispatcher import Dispatcher
                built = Dispatcher(self._store, self.clock, self._auto_tick)
                built.after_tick = self._periodic
                self._dispatcher = built
            return self._dispatcher

    def _start_periodic(self) -> None:
        """The janitor's one job: build the dispatcher, whose ticker runs ``_periodic``."""
        try:
            self._build_dispatcher()
        except BrokerClosed:
            pass

    def after_fork(self) -> None:
        """In a forked child (``os.register_at_fork``): see ``Dispatcher.after_fork``."""
        if self._dispatcher is not None:
            self._dispatcher.after_fork()

    @classmethod
    def open(cls, path: str | os.PathLike, *, durability: str = "sync", clock=None,
             seed: int | None = None, map_size: int = DEFAULT_MAP_SIZE,
             max_map_size: int = DEFAULT_MAX_MAP_SIZE, create: bool = True,
             auto_tick: bool | None = None, replication_listen: str | None = None,
             replication_mode: str = "async", sync_timeout: float = 10.0,
             standby_of: str | None = None, replication_token: str | bytes | None = None,
             replication_token_file: str | None = None, replication_ssl=None,
             max_slot_keep: int | None = None, metrics_listen: str | None = None) -> Broker:
        """Open the partq directory ``path`` (created if missing unless ``create=False``).

        ``durability``: "sync" (default; publish and ack return after an fsynced commit) or
        "async" (see ``partq.storage.Store.open`` for exactly what it gives up). ``clock``:
        ``SystemClock()`` by default. ``seed``: seeds the random unkeyed partitioner.
        ``map_size``/``max_map_size``: initial and largest LMDB map; the map doubles on demand
        up to the largest, past which writes fail with ``StorageFull``.

        Replication (rule `replication`): ``replication_listen="HOST:PORT"`` serves DR-standbys in
        ``replication_mode`` "async" (default) or "sync" (publish returns once a standby has the
        commit durably, or raises ``ReplicationTimeout`` after ``sync_timeout`` s).
        ``standby_of="HOST:PORT"`` opens this directory as a DR-standby that follows that primary;
        a standby refuses publishes and binds until ``promote()``. A directory that was a standby
        stays one (read-only) when reopened without ``standby_of``, until promoted.

        Both sides (rule `listener-security`, docs/security.md): ``replication_token`` (or
        ``replication_token_file``, its first line) is the shared secret each side proves to the other, never
        sent; without one the primary admits loopback standbys only (protected mode). ``replication_ssl``: an
        ``ssl.SSLContext``, a server context on the primary, a client context trusting its CA on
        the standby. ``max_slot_keep``: bytes of change log kept for an absent or slow standby
        before its slot is dropped and it re-snapshots (default 1 GiB, at most a quarter of
        ``max_map_size``).

        Metrics (rule `metrics`, docs/operations.md): ``metrics_listen="HOST:PORT"`` serves Prometheus
        metrics over HTTP on that address (an empty host is 127.0.0.1; port 0 picks a free one,
        see ``metrics_address``) until the broker closes.
        """
        if replication_listen and standby_of:
            raise InvalidConfig("a broker is either a primary (replication_listen) or a standby "
                                "(standby_of), not both")
        if replication_mode not in ("async", "sync"):
            raise InvalidConfig(f"replication_mode must be 'async' or 'sync', not "
                                f"{replication_mode!r}")
        sync_timeout = check_sync_timeout(sync_timeout)
        repl = replication_options(replication_token, replication_token_file, replication_ssl,
                                   max_slot_keep)
        clock = clock or SystemClock()
        store = Store.open(path, durability=durability, map_size=map_size, max_map_size=max_map_size,
                           create=create)
        if auto_tick is None:
            auto_tick = isinstance(clock, SystemClock)
        broker = cls(store, clock, random.Random(seed), auto_tick)
        try:
            broker._start_roles(standby_of, replication_listen, replication_mode, sync_timeout, repl,
                                metrics_listen)
        except BaseException:
            broker.close()
            raise
        return broker

    def _start_roles(self, standby_of, replication_listen, replication_mode, sync_timeout, repl,
                     metrics_listen) -> None:
        """Take the directory's replication role (standby, primary serving standbys, or neither),
        finish a scaling an earlier process left, report the open, start the metrics server."""
        role = self._role
        if standby_of:
            role.follow(standby_of, repl, has_queues=bool(self.queues()))
        elif not role.standby:
            for config in self.queues():
                if config.scaling_status != ScalingState.READY:
                    scaling.finish_scaling(self, config.name,
                                           scaling_log(config.name, "finishing at open: "))
            role.serve(replication_listen, replication_mode, sync_timeout, repl)
        log_open_report(self)
        if metrics_listen is not None:
            from partq.metrics import MetricsServer
            self._metrics = MetricsServer(self, metrics_listen)

    # ------------------------------------------------------------------ replication
    def _check_writable(self) -> None:
        if self.read_only is not None:
            raise OpenedReadOnly(f"{self.path} is open read-only ({self.read_only}); publishes, "
                                 f"binds and changes are refused: run as a user who may write it")
        self._store.check_writable()
        if self._role.standby:
            raise StandbyReadOnly(f"{self.path} is a DR-standby: it refuses publishes, binds and "
                                  f"queue changes until promoted (`partq dr promote`)")

    def replication_status(self) -> ReplicationStatus:
        """Role, link state and lag (in messages and seconds) of DR replication."""
        return self._role.status()

    def promote(self, replication_listen: str | None = None, replication_mode: str = "async",
                sync_timeout: float = 10.0, *, replication_token: str | bytes | None = None,
                replication_token_file: str | None = None, replication_ssl=None,
                max_slot_keep: int | None = None) -> None:
        """Make this DR-standby a primary: stop following, accept publishes and binds, and (with
        ``replication_listen`` and the options of ``open``) serve standbys of its own. Consumers
        that rebind with their names or hints within the rebalance delay keep their partitions.
        The promoted store starts a new timeline: a standby of the old primary that is not ahead
        of this one follows it, and one that is ahead is refused and told to re-snapshot."""
        sync_timeout = check_sync_timeout(sync_timeout)
        repl = replication_options(replication_token, replication_token_file, replication_ssl,
                                   max_slot_keep)
        self._role.promote(replication_listen, replication_mode, sync_timeout, repl)

    @property
    def metrics_address(self) -> str | None:
        """The HOST:PORT the metrics endpoint is bound to (None without ``metrics_listen``)."""
        return None if self._metrics is None else self._metrics.address

    def add_metrics(self, collector) -> bool:
        """Serve a Prometheus ``collector``'s metrics on this broker's metrics endpoint too
        (a worker's); False when the broker serves none (no ``metrics_listen``)."""
        if self._metrics is None:
            return False
        self._metrics.add(collector)
        return True

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def store(self) -> Store:
        """The storage engine under this broker (read snapshots, raw writes): for partq's own
        tools and for inspection; queue semantics live in the Broker's methods."""
        return self._store

    @property
    def replication_address(self) -> str | None:
        """The HOST:PORT the replication listener is bound to (None when not listening)."""
        return self._role.address

    @property
    def open_report(self) -> dict:
        """What opening did (store created, stale reader slots cleared)."""
        return self._store.report.as_dict()

    # ------------------------------------------------------------------ publish
    def publish(self, queue: str, payload: bytes, key: str | None = None,
                headers: dict | None = None, ttl: float | None = None) -> PublishResult:
        """Publish one message; return once it is durable (rule `durable-publish`). Concurrent
        publishers in this process share commits. A keyed message goes to
        ``crc32c(key) % partitions`` (rule `key-hash`). ``ttl``: seconds after which the message
        expires (is never delivered, and goes to the dead message queue: rule `expiry`);
        None or 0 for none (the queue's ``max_ttl`` still applies)."""
        self._check_writable()
        return self.publisher.publish(queue, payload, key, headers, ttl)

    def publish_async(self, queue: str, payload: bytes, key: str | None = None,
                      headers: dict | None = None, ttl: float | None = None) -> Pending:
        """``publish`` without waiting for the commit: bad input raises here, and the returned
        ``Pending.result()`` gives the ``PublishResult`` once the message is durable (or raises
        what the commit raised). One thread can keep many publishes in flight this way; they
        share commits like concurrent publishers do, and land in the order they were made."""
        self._check_writable()
        return self.publisher.publish_async(queue, payload, key, headers, ttl)

    def publish_many(self, queue: str, items: Iterable, checkpoint: tuple[str, int] | None = None,
                     ttl: float | None = None) -> list[PublishResult]:
        """Publish a batch in one transaction: all of it is durable when this returns, or none of
        it is stored. Items are ``payload``, ``(payload, key)`` or ``(payload, key, headers)``.

        ``checkpoint=(name, position)`` makes a resumable copy idempotent: the position is stored
        in the same transaction, and a batch whose position is not beyond the stored one is
        skipped (returns ``[]``). Read it back with ``checkpoint(queue, name)``. A checkpoint
        belongs to the queue it was published into: deleting the queue deletes it, and a queue
        created again under the same name starts with none. ``ttl``: as ``publish``'s, for every
        item.
        """
        self._check_writable()
        return self.publisher.publish_many(queue, items, checkpoint, ttl)

    def publish_many_async(self, queue: str, items: Iterable, ttl: float | None = None, *,
                           commit_here: bool = False) -> Pending:
        """``publish_many`` without waiting for the commit: bad input raises here, and the
        returned ``Pending.result()`` gives the results once the whole batch is durable. With
        ``commit_here``, when no commit is under way and none is queued, the batch commits in
        the calling thread before this returns (a caller about to wait anyway saves the hand-off
        to the writer thread: ``partq serve``'s connections); otherwise it is queued as usual."""
        self._check_writable()
        return self.publisher.publish_many_async(queue, items, ttl, wait=commit_here)

    def publish_each_async(self, queue: str, items: list, *, commit_here: bool = False) -> Pending:
        """Independent publishes in one transaction (each item's result or its own
        ``InvalidMessage``); ``partq serve`` coalesces its clients' single publishes with it.
        ``commit_here`` as for ``publish_many_async``."""
        self._check_writable()
        return self.publisher.publish_each_async(queue, items, wait=commit_here)

    def checkpoint(self, queue: str, name: str) -> int | None:
        """The last position ``publish_many(queue, ..., checkpoint=(name, position))`` stored."""
        return self.publisher.checkpoint(queue, name)

    # ------------------------------------------------------------------ consume
    def bind(self, queue: str, name: str | None = None, hint: Iterable[int] | None = None,
             skip_corrupt: bool = False) -> Flow:
        """Bind a flow to ``queue`` and return it with its assigned partitions (rule `bind-hint`).

        ``name``: a stable consumer name; a consumer that binds again under it within the
        rebalance delay (even after its own restart) gets its partitions back (rule `named-flows`).
        ``hint``: the partition set a reconnecting consumer held (``flow.partitions``).
        ``skip_corrupt``: deliver past records that fail their checksum (logged) instead of
        stopping delivery of that partition.
        """
        self._store.check_usable()
        self._check_writable()
        if name is not None and not isinstance(name, str):
            raise InvalidConfig(f"flow name must be a str, not {type(name).__name__}")
        if name is not None and (not name.isprintable() or not 0 < len(name) <= 256):
            raise InvalidConfig(f"flow name {name!r} must be 1 to 256 printable characters (no "
                                f"control characters: it is shown in status and logs)")
        if hint is not None:
            hint = list(hint)
            if not all(isinstance(p, int) and not isinstance(p, bool) for p in hint):
                raise InvalidConfig(f"hint must be a collection of partition numbers, not {hint!r}")
        endpoint = self.dispatcher.bind(queue, name, hint, skip_corrupt)
        return self.bound_flows.add(Flow(endpoint, queue, name, skip_corrupt))

    def transaction(self) -> BrokerTransaction:
        """``with broker.transaction() as tx:``: acks, nacks and rejects of messages the flows
        of this broker received, and publishes, committed together at the block's end in one
        write, or none of it (``partq.transactions``)."""
        self._check_writable()
        from partq.transactions import BrokerTransaction
        return BrokerTransaction(self)

    def tick(self) -> None:
        """Run every rebalance and handoff timer that is due by the clock, and end online
        scale-downs whose retired partitions drained."""
        self.dispatcher.tick()
        self._finish_retirements(force=True)

    def _periodic(self) -> None:
        """The ticker's work besides timers: end drained online scale-downs, sweep expired
        messages every ``SWEEP_INTERVAL`` seconds."""
        self._finish_retirements()
        now = time.monotonic()
        if now - self._swept >= SWEEP_INTERVAL:
            self._swept = now
            try:
                self.sweep_expired()
            except PartqError as exc:             # read-only, closing: next time
                log.debug("sweeping expired messages: %s", exc)

    def sweep_expired(self) -> int:
        """Kill the expired messages at the head of the queues this process delivers, and of
        those no process delivers (rule `expiry`: a queue nobody consumes does not keep them);
        returns how many. A process with a ticker does it every 30 s by itself."""
        from partq.delivery import expiry
        self._check_writable()
        configs = [(c, self.dispatcher.owner_guard(c.name)) for c in self.queues()
                   if self.dispatcher.owns(c.name) or queue_holder(self.path, c.qid) is None]
        return expiry.sweep(self._store, configs, self.clock.wall_ns())

    def _finish_retirements(self, force: bool = False) -> None:
        """End the online scale-downs this process delivers whose retired partitions drained,
        at most every ``RETIRE_CHECK`` seconds unless ``force``d (the ticker calls this)."""
        now = time.monotonic()
        if not force and now - self._retire_checked < RETIRE_CHECK:
            return
        self._retire_checked = now
        try:
            # a DR-standby or a read-only open only looks: not its to end
            scaling.finish_retirements(self, before=self._check_writable)
        except PartqError as exc:                   # the store closing: next time
            log.debug("ending online scale-downs: %s", exc)

    # ------------------------------------------------------------------ status
    def queue_status(self, queue: str) -> QueueStatus:
        """Statuses, flows and depths of ``queue``. From a process that does not run its
        delivery, assignments and statuses are those the owner last persisted; when no process
        runs it, the flows of the last owner are shown unbound and their partitions Unbound.
        An exclusive queue shows one partition, ``PARENT``: the parent queue's log."""
        from partq.status_report import build_queue_status, with_owner_warning
        view = self.dispatcher.view(queue)
        with self._store.read() as r:
            raw = r.queue(queue)
            if raw is None:
                raise queue_not_found(queue, r.queues())
            config = QueueConfig.from_dict(raw)
            owner = queue_holder(self.path, config.qid)
            st = build_queue_status(r, config, view, owner, self.clock.wall_ns(),
                                    None if owner else beat_age(lock_path(self.path, config.qid)))
        return with_owner_warning(st, self.path, config.qid, view is None)

    def rebalance_plan(self, queue: str, consumers: int | None = None,
                       add: Iterable[str] = (), remove: Iterable[str] = ()) -> dict:
        """What the rebalancer would do now (rule `rebalance-dry-run`), worked out on a copy of the
        queue's delivery state; nothing changes. With no argument: for the current consumers (e.g. at the end
        of a holddown in progress). ``consumers=N``: with N bound flows (added or removed);
        ``add``/``remove``: with these flows bound or gone (names or flow ids). Returns the
        plan document of ``partq.core.rebalance_plan.plan_rebalance``."""
        from partq.core.rebalance_plan import plan_rebalance
        from partq.core.rebalancer import Rebalancer
        from partq.delivery.layout import delivery_layout
        from partq.delivery.saved_state import decode_state
        config = self.queue_config(queue)
        st = self.queue_status(queue)
        view = self.dispatcher.view(queue)
        mode, index = delivery_layout(config)
        with self._store.read() as r:
            state = decode_state(r.state(config.qid), f"queue {queue!r}")
        core = (state.core if state is not None and state.mode == mode
                else Rebalancer(len(index), 0, 0).to_dict())
        if core["n"] != len(index):     # scaled while no process ran delivery: plan the new count
            n = len(index)
            core = {**core, "n": n, "epochs": (list(core.get("epochs", [])) + [0] * n)[:n],
                    "flows": [[*f[:4], [p for p in f[4] if p < n]] for f in core["flows"]],
                    "handoffs": [h for h in core["handoffs"] if h[0] < n]}
        doc = plan_rebalance(
            core, owner_running=st.delivery_owner is not None,
            rebalance_delay=config.rebalance_delay, max_handoff_time=config.max_handoff_time,
            index=index, unacked={p.partition: p.unacked for p in st.partitions},
            depth={p.partition: p.depth for p in st.partitions}, consumers=consumers,
            inflight_keys=None if config.ordering != "key" or view is None else {
                s.partition: (s.inflight_keys, s.inflight_key_count) for s in view.slots
                if s.inflight_key_count >= 0},
            add=list(add), remove=list(remove))
        return {"queue": queue, "rebalance_status": st.rebalance_status,
                "delivery_owner": st.delivery_owner, **doc}

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Close flows (their state stays: consumers that come back within the rebalance delay
        after the next open keep their partitions), release delivery locks, close the store."""
        if self._closed:
            return
        self._closed = True
        if not self._store.in_owner_process():
            return    # a forked child: the parent's locks, threads and environment are not ours
        if self._janitor is not None:
            self._janitor.cancel()
        if self._metrics is not None:
            self._metrics.close()
        with self._building:          # (no dispatcher is built from here on)
            dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.settle()       # a commit DR-standbys still connected receive
        self._role.close()
        if dispatcher is not None:
            dispatcher.close("the broker was closed")
        self._store.close()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
