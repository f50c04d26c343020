"""The seed's partition-scaling procedure (seed 001, S18/S19), one step at a time, with waits.

    1 disable ingress                 5 wait for the rebalance
    2 wait until every partition      6 wait for the DR-standby to follow
      is drained                      7 enable ingress
    3 wait for the DR-standby
    4 change the partition count

``run`` drives the steps and reports each through a ``Reporter`` (the CLI prints lines or JSON).
A step that times out (or any failure after step 1) re-enables ingress before the error goes
up, so a failed procedure never leaves the queue refusing publishes.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

from partq.broker import Broker
from partq.config import QueueConfig
from partq.status import QueueStatus
from partq.tools.common import UserError

STEPS = {
    1: ("disable-ingress", "Disable ingress"),
    2: ("drain", "Wait for every partition to drain"),
    3: ("standby", "Wait for the DR-standby to have every message acknowledged"),
    4: ("change-count", "Change the partition count"),
    5: ("rebalance", "Wait for the partitions to be rebalanced"),
    6: ("standby-follow", "Wait for the DR-standby to follow the new partition count"),
    7: ("enable-ingress", "Enable ingress"),
}
POLL = 0.05


class StepFailed(UserError):
    def __init__(self, step: int, message: str) -> None:
        self.step = step
        super().__init__(message)


class Reporter:
    """What the procedure tells its caller. ``start``/``note``/``done`` per step; ``drain`` gets
    the depth while step 2 waits."""

    def start(self, step: int, text: str) -> None: ...
    def note(self, step: int, text: str) -> None: ...
    def done(self, step: int, status: str, seconds: float, detail: dict) -> None: ...
    def drain(self, depth: int, initial: int) -> None: ...


def replication_status(broker: Broker):
    """The broker's DR replication status, or None where replication is not available."""
    getter = getattr(broker, "replication_status", None)
    if getter is None:
        return None
    try:
        return getter()
    except (ImportError, NotImplementedError):
        return None


def wait_for_standby(broker: Broker, queue: str, phase: str, timeout: float, *,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> dict:
    """Steps 3 and 6: the hook for DR replication (S27).

    ``phase`` is "drained" (step 3: the standby has every ack of the drain) or "scaled" (step 6:
    the standby has the new partition count). Both mean: the standby applied every change the
    primary committed up to now, i.e. its applied LSN reached the head LSN read at the start.

    Only a process that serves replication (``Broker.open(..., replication_listen=...)``) sees
    a standby's progress; the ``partq`` process does not serve it, so when a standby slot exists
    it can only say so (``waited`` False) and leave the check to `partq dr status`. Wire a
    cross-process standby position (for instance the slots the primary persists) in here.
    """
    status = replication_status(broker)
    links = list(getattr(status, "standbys", None) or [])
    if status is None or (not links and not getattr(status, "primary", None)):
        return {"standby": None, "waited": False, "note": "no DR-standby attached; continuing"}
    if not links:
        return {"standby": "unknown", "waited": False,
                "note": "a DR-standby is registered with this store, but its progress is only "
                        "visible in the process that serves replication; check it with `partq "
                        "dr status` before relying on it"}
    target = status.head_lsn
    deadline = clock() + timeout
    while status.applied_lsn < target:
        if clock() >= deadline:
            raise StepFailed(3 if phase == "drained" else 6,
                             f"the DR-standby did not catch up within {timeout:g} s (applied LSN "
                             f"{status.applied_lsn} of {target}); check the link with `partq dr "
                             f"status`, or raise --standby-timeout")
        sleep(POLL)
        status = replication_status(broker)
    return {"standby": [getattr(link, "standby_id", None) for link in links], "waited": True,
            "applied_lsn": status.applied_lsn}


def rebalance_settled(st: QueueStatus, target: int) -> tuple[bool, str]:
    """Step 5's condition, from any process: the scaling is over and, when some process runs
    delivery, its persisted assignment covers the new partitions (every partition Ready with a
    flow, or no flow holding any, e.g. no consumer bound)."""
    if st.scaling_status != "Ready" or st.partition_count != target:
        return False, f"scaling status {st.scaling_status}, {st.partition_count} partitions"
    if st.delivery_owner is None:
        return True, ("no process runs delivery for the queue: consumers get the new partitions "
                      "when they bind")
    if st.rebalance_status != "Ready":
        return False, f"rebalance status {st.rebalance_status}"
    active = [f for f in st.flows if f.partitions]
    if any(p >= target for f in active for p in f.partitions):
        return False, "the delivery owner has not applied the new partition count yet"
    if not active:
        if all(p.flow is None for p in st.partitions):
            return True, "no consumer holds partitions"
        return False, "partitions still assigned to flows that left"
    waiting = [p.partition for p in st.partitions if p.flow is None or p.status != "Ready"]
    if waiting:
        return False, f"partitions {_ranges(waiting)} not yet Ready on a flow"
    return True, f"{len(active)} flow(s) hold all {target} partitions, every one Ready"


def _ranges(ps: list[int]) -> str:
    return ", ".join(map(str, ps[:8])) + (" ..." if len(ps) > 8 else "")


def check_scalable(config: QueueConfig) -> None:
    """An exclusive queue has no partitions to scale (its operating count is 0): refuse before
    anything changes, ingress included."""
    if not config.partitioned:
        raise UserError(f"queue {config.name!r} is exclusive (non-partitioned), so it has no "
                        f"partitions to scale; make it non-exclusive first with `partq queue "
                        f"update {config.name} --access-type non-exclusive`, then scale it")


def run(broker: Broker, queue: str, target: int, *, drain: bool, drain_timeout: float,
        rebalance_timeout: float, standby_timeout: float, reporter: Reporter,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> dict:
    """Scale ``queue`` to ``target`` partitions by the seed's seven steps. Returns a summary."""
    config = broker.queue_config(queue)
    check_scalable(config)
    dataclasses.replace(config, partitions=target)   # InvalidConfig before anything changes
    old = config.partitions
    t_all = clock()

    def step(n: int, body: Callable[[], tuple[str, dict]]) -> dict:
        reporter.start(n, STEPS[n][1])
        t0 = clock()
        try:
            status, detail = body()
        except StepFailed as exc:
            reporter.done(n, "timeout", clock() - t0, {"error": exc.message})
            raise
        except Exception as exc:
            reporter.done(n, "failed", clock() - t0, {"error": " ".join(str(exc).split())})
            raise
        reporter.done(n, status, clock() - t0, detail)
        return detail

    def disable() -> tuple[str, dict]:
        broker.update_queue(queue, ingress_enabled=False)
        if config.reject_msg_to_sender and config.reject_msg_to_sender_when_shutdown:
            effect = "rejected"
            reporter.note(1, "publishes are rejected with IngressDisabled until step 7")
        else:
            effect = "discarded"
            reporter.note(1, f"publishes are DISCARDED (counted) until step 7; to have them "
                             f"rejected instead: `partq queue update {queue} "
                             f"--reject-when-shutdown on`")
        return "done", {"ingress_enabled": False, "publishes": effect}

    def drained() -> tuple[str, dict]:
        st = broker.queue_status(queue)
        if not drain:
            doomed = sum(p.depth for p in st.partitions if p.partition >= target)
            note = (f"skipped (--no-drain): {st.depth} messages stay"
                    + (f"; {doomed} in partitions {target} to {old - 1} are deleted at step 4"
                       if doomed else ""))
            reporter.note(2, note)
            return "skipped", {"depth": st.depth, "deleted_at_step_4": doomed}
        if not st.egress_enabled and st.depth:
            reporter.note(2, f"egress is off: nothing drains until `partq queue update {queue} "
                             f"--egress on`")
        initial = st.depth
        deadline = clock() + drain_timeout
        while st.depth > 0:
            reporter.drain(st.depth, initial)
            if clock() >= deadline:
                left = [f"{p.partition}:{p.depth}" for p in st.partitions if p.depth]
                raise StepFailed(2, f"step 2 (drain) timed out after {drain_timeout:g} s with "
                                    f"{st.depth} messages left (partition:depth {' '.join(left[:8])}"
                                    f"{' ...' if len(left) > 8 else ''}); ingress is enabled "
                                    f"again and the partition count is unchanged: let consumers "
                                    f"drain {queue!r} and run scale again, raise --drain-timeout, "
                                    f"or pass --no-drain to accept losing messages in removed "
                                    f"partitions")
            sleep(POLL)
            st = broker.queue_status(queue)
        reporter.drain(0, initial)
        return "done", {"drained": initial}

    def standby(phase: str, n: int) -> tuple[str, dict]:
        detail = wait_for_standby(broker, queue, phase, standby_timeout, clock=clock, sleep=sleep)
        if detail.get("note"):
            reporter.note(n, detail["note"])
        return ("skipped" if not detail.get("waited") else "done"), detail

    def change() -> tuple[str, dict]:
        steps = []
        t0 = clock()

        def progress(text: str) -> None:
            steps.append({"seconds": round(clock() - t0, 6), "step": text})
            reporter.note(4, f"+{clock() - t0:.3f} s {text}")
        final = broker.scale(queue, target, progress=progress)
        return "done", {"from": old, "to": final.partitions, "steps": steps}

    def rebalanced() -> tuple[str, dict]:
        deadline = clock() + rebalance_timeout
        last = None
        while True:
            st = broker.queue_status(queue)
            ok, why = rebalance_settled(st, target)
            if ok:
                reporter.note(5, why)
                return "done", {"rebalance_status": st.rebalance_status, "why": why,
                                "delivery_owner": st.delivery_owner}
            if why != last:
                reporter.note(5, f"waiting: {why}")
                last = why
            if clock() >= deadline:
                raise StepFailed(5, f"step 5 (rebalance) timed out after {rebalance_timeout:g} s "
                                    f"({why}); the queue already has {target} partitions and "
                                    f"ingress is enabled again: check its consumers with `partq "
                                    f"queue show {queue}`, or raise --rebalance-timeout")
            sleep(POLL)

    def enable() -> tuple[str, dict]:
        broker.update_queue(queue, ingress_enabled=True)
        return "done", {"ingress_enabled": True}

    step(1, disable)
    try:
        step(2, drained)
        step(3, lambda: standby("drained", 3))
        step(4, change)
        step(5, rebalanced)
        step(6, lambda: standby("scaled", 6))
    except BaseException:
        try:
            broker.update_queue(queue, ingress_enabled=True)
        except Exception:
            pass  # the original error says more; ingress state is visible in `queue show`
        raise
    step(7, enable)
    return {"queue": queue, "from": old, "to": target, "seconds": round(clock() - t_all, 6)}
