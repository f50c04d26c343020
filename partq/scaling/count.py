"""Changing a queue's partition count (rule `scaling`, step 4 of the procedure), one commit per step so
that statuses are visible to every process, and finished by whichever process gets there first.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from partq.config import MAX_PARTITIONS, QueueConfig
from partq.delivery.holds import Holds, clear_cutover, read_cutover, write_cutover
from partq.errors import InvalidConfig
from partq.scaling.progress_log import scaling_log as progress_log
from partq.states import ScalingState
from partq.storage import crashpoints


def change_count(broker, name: str, partitions: int, progress=None,
                 online: bool = False, wait: bool = True) -> QueueConfig:
    """Change the partition count (rule `scaling`), one step per commit so statuses are visible.

    ``online`` (rule `online-scaling`): ingress may stay on; the commit that switches the key mapping records
    each old partition's cut-over, and delivery holds a moved key's new messages until its old
    partition drained past it (``partq.delivery.holds``). Refused while an earlier online
    scaling has not drained yet. An offline change forgets any cut-over (no order is promised
    across it).

    Up: ScalingUp while partitions old..new-1 are created; the key mapping switches to the new
    count in the commit that ends the scaling, once every new partition exists. Down: the count
    drops at once (publishes stop using the extra partitions; ScalingDown). Offline, the
    highest-numbered partitions are then deleted first, with their messages (the procedure
    drains them before). Online, nothing published is lost: the removed partitions are retired,
    still delivered until every message of theirs is acked, and deleted once drained; this call
    waits for that (``progress`` reports what is left). Either way the delivery owner
    rebalances at once when the count changes (no holddown). A scaling cut short by a crash is
    finished by the next ``Broker.open`` (an online scale-down only once drained) or the next
    ``change_count``. ``progress(step: str)`` is called after each step.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) \
            or not 1 <= partitions <= MAX_PARTITIONS:
        raise InvalidConfig(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, not "
                            f"{partitions!r}")
    config = broker.queue_config(name)
    if not config.partitioned:
        raise InvalidConfig(f"queue {name!r} is exclusive (non-partitioned); make it "
                            f"partitioned with access_type='non-exclusive' to scale it")
    if config.scaling_status != ScalingState.READY:
        finish_scaling(broker, name, progress, wait=wait)
        config = broker.queue_config(name)
        if config.scaling_status != ScalingState.READY:
            raise InvalidConfig(
                f"queue {name!r} is still retiring partitions {config.scaling_to}.."
                f"{config.scaling_from - 1} of an online scale-down (see `partq queue show "
                f"{name}`); scale again once they drained")
    old = config.partitions
    if partitions == old:
        return config
    up = partitions > old
    with broker.store.read() as r:
        pending = read_cutover(r, config.qid)
        if pending is not None and Holds(pending, r, config.qid).all_drained():
            pending = None      # drained; the delivery owner just has not removed it yet
    if online and pending is not None:
        raise InvalidConfig(
            f"queue {name!r} is still draining its online scaling from {pending.from_partitions} "
            f"to {pending.to_partitions} partitions (see `partq queue show {name}`); scale again "
            f"online once it has drained, or scale offline")

    def start(w):
        c = broker.publisher.config_in(w, name)
        if up:
            c = dataclasses.replace(c, scaling_status=ScalingState.SCALING_UP, scaling_from=old,
                                    scaling_to=partitions, scaling_online=online)
        else:
            c = dataclasses.replace(c, partitions=partitions,
                                    scaling_status=ScalingState.SCALING_DOWN, scaling_from=old,
                                    scaling_to=partitions, scaling_online=online)
            switch_mapping(w, c.qid, old, partitions, online, broker.clock.wall_ns())
        w.put_queue(name, c.to_dict())
    broker.store.write(start)
    if crashpoints.ENABLED and not up:
        crashpoints.hit("after_cutover")     # a scale-down switches the mapping in its start
    if progress:
        progress(f"{'ScalingUp' if up else 'ScalingDown'} {old} -> {partitions}")
    return finish_scaling(broker, name, progress, wait=wait)


def switch_mapping(w, qid: int, old: int, new: int, online: bool, time_ns: int) -> None:
    """In the commit that switches the key mapping: an online scaling records its cut-over;
    an offline one forgets any earlier cut-over."""
    if online:
        write_cutover(w, qid, old, new, time_ns)
    else:
        clear_cutover(w, qid)


def finish_scaling(broker, name: str, progress=None, wait: bool = False) -> QueueConfig:
    """Carry a scaling in progress to its end. Several processes may do this at once (the scaler
    and any process that opens meanwhile), so every step re-checks, in its own transaction, that
    the queue is still in this same scaling, and a partition is created only if it has no state
    yet: a slower finisher must never reset a partition that has already taken publishes.

    An online scale-down deletes a retired partition only once it is drained, in the
    transaction that checks it: with ``wait`` it waits for consumers to drain them (ticking the
    broker), without it leaves the scaling as it is when one still holds messages."""
    store, config_in = broker.store, broker.publisher.config_in
    config = broker.queue_config(name)
    qid, old, new = config.qid, config.scaling_from, config.scaling_to
    scaling = (config.scaling_status, old, new)

    def same(w) -> bool:
        c = config_in(w, name)
        return (c.scaling_status, c.scaling_from, c.scaling_to) == scaling

    def create(w, p):
        if same(w) and not w.has_partition(qid, p):
            w.init_partition(qid, p)

    def drop(w, p):
        return w.drop_partition(qid, p) if same(w) else 0

    if config.scaling_status == ScalingState.SCALING_UP:
        for p in range(old, new):
            store.write(lambda w, p=p: create(w, p))
            if crashpoints.ENABLED:
                crashpoints.hit("during_scaling")
            if progress:
                progress(f"created partition {p}")
        done = {"partitions": new}
    elif config.scaling_status == ScalingState.SCALING_DOWN and config.scaling_online:
        return retire(broker, name, scaling, progress, wait)
    elif config.scaling_status == ScalingState.SCALING_DOWN:
        broker.tick()  # a local delivery owner stops using the extra partitions first
        for p in reversed(range(new, old)):
            n = store.write(lambda w, p=p: drop(w, p))
            if crashpoints.ENABLED:
                crashpoints.hit("during_scaling")
            if progress:
                progress(f"deleted partition {p} ({n} messages)")
        done = {}
    else:
        return config

    def finish(w):
        if not same(w):
            return config_in(w, name)   # another process finished it already
        c = config_in(w, name)
        if c.scaling_status == ScalingState.SCALING_UP:     # the key mapping switches now
            switch_mapping(w, qid, old, new, c.scaling_online, broker.clock.wall_ns())
        c = dataclasses.replace(c, scaling_status=ScalingState.READY, scaling_from=0,
                                scaling_to=0, scaling_online=False, **done)
        w.put_queue(name, c.to_dict())
        return c
    final = store.write(finish)
    if crashpoints.ENABLED:
        crashpoints.hit("after_cutover")
    broker.publisher.forget(name)
    broker.tick()
    if progress:
        progress(f"Ready with {final.partitions} partitions")
    return final


DRAIN_POLL = 0.05        # seconds between looks at the retired partitions' backlog
DRAIN_REPORT = 5.0       # seconds between progress lines while they drain


def finish_retirements(broker, before: Callable[[], None]) -> None:
    """End every online scale-down of a queue ``broker``'s process delivers whose retired
    partitions drained (without waiting for the others); ``before()`` runs first for each, and
    may raise to refuse."""
    for config in broker.queues():
        if config.scaling_status == ScalingState.SCALING_DOWN and config.scaling_online \
                and broker.dispatcher.owns(config.name):
            before()
            finish_scaling(broker, config.name, progress_log(config.name, ""))


def retire(broker, name: str, scaling: tuple, progress, wait: bool) -> QueueConfig:
    """End an online scale-down: once every retired partition is drained (each message acked),
    delete them and make the queue Ready in one transaction, which checks again that they are
    drained, so nothing published or unacked goes with them and delivery never sees a retired
    partition without its log. Without ``wait``, a scale-down still draining is left as it is."""
    store, config_in = broker.store, broker.publisher.config_in
    _, old, new = scaling
    config = broker.queue_config(name)
    qid = config.qid

    def left(r) -> dict[int, int]:
        return {p: r.ack_state(qid, p).backlog(r.head(qid, p)) for p in range(new, old)
                if r.has_partition(qid, p)}

    def finish(w):
        c = config_in(w, name)
        if (c.scaling_status, c.scaling_from, c.scaling_to) != scaling:
            return c                 # another process finished this scaling
        if any(left(w).values()):
            return None
        for p in reversed(range(new, old)):
            w.drop_partition(qid, p)
        c = dataclasses.replace(c, scaling_status=ScalingState.READY, scaling_from=0,
                                scaling_to=0, scaling_online=False)
        w.put_queue(name, c.to_dict())
        return c
    reported = 0.0
    while True:
        with store.read() as r:
            waiting = {p: n for p, n in left(r).items() if n}
        if not waiting:
            if crashpoints.ENABLED:            # drained, not yet removed: one point for each
                for _ in range(new, old):
                    crashpoints.hit("during_scaling")
            final = store.write(finish)
            if final is not None:
                break
        if not wait:
            return config
        now = time.monotonic()
        if progress and waiting and now - reported >= DRAIN_REPORT:
            progress("retiring partitions: " + ", ".join(
                f"{p} has {n} message(s) to be acked first" for p, n in sorted(waiting.items())))
            reported = now
        broker.dispatcher.tick()
        time.sleep(DRAIN_POLL)
    if crashpoints.ENABLED:
        crashpoints.hit("after_cutover")       # removed and Ready, before anyone is told
    broker.publisher.forget(name)
    broker.tick()
    if progress:
        progress(f"retired partitions {new}..{old - 1}: drained and removed; Ready with "
                 f"{final.partitions} partitions")
    return final
