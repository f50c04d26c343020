"""The partition-scaling procedure of Solace's partition scaling document (rules `scaling` and
`ingress-egress`), one step at a time, with waits.

    1 disable ingress                 5 wait for the rebalance
    2 wait until every partition      6 wait for the DR-standby to follow
      is drained                      7 enable ingress
    3 wait for the DR-standby
    4 change the partition count

Online (rule `online-scaling`, ``online=True``): ingress stays on, so steps 1, 2, 3 and 7 are skipped; step 4
records the cut-over that keeps per-key order (``partq.delivery.holds``).

``run`` drives the steps and reports each through a ``Reporter`` (the CLI prints lines or JSON).
The procedure is recorded in the store (``record``), so that one that dies is reported, resumed
by a re-run with the same target (ingress goes back to what it was before the *first* run), or
undone by ``abort``. Any failure or interruption it can see (a step that times out, ``stop()``
turning true, an exception) restores ingress and removes the record before the error goes up,
so a failed procedure never leaves the queue refusing publishes.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from partq.config import QueueConfig
from partq.errors import InvalidConfig, ScalingInterrupted, ScalingStepFailed
from partq.scaling.record import STEPS, Procedure, procedure_of, write_record

if TYPE_CHECKING:
    from partq.status import QueueStatus

POLL = 0.05


class Reporter:
    """What the procedure tells its caller. ``start``/``note``/``done`` per step; ``drain`` gets
    the depth while step 2 waits."""

    def start(self, step: int, text: str) -> None: ...
    def note(self, step: int, text: str) -> None: ...
    def done(self, step: int, status: str, seconds: float, detail: dict) -> None: ...
    def drain(self, depth: int, initial: int) -> None: ...


def replication_status(broker):
    """The broker's DR replication status, or None where replication is not available."""
    getter = getattr(broker, "replication_status", None)
    if getter is None:
        return None
    try:
        return getter()
    except (ImportError, NotImplementedError):
        return None


def wait_for_standby(broker, queue: str, phase: str, timeout: float, *,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> dict:
    """Steps 3 and 6: the hook for DR replication (rule `replication`).

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
            raise ScalingStepFailed(3 if phase == "drained" else 6,
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
        raise InvalidConfig(f"queue {config.name!r} is exclusive (non-partitioned), so it has no "
                        f"partitions to scale; make it non-exclusive first with `partq queue "
                        f"update {config.name} --access-type non-exclusive`, then scale it")


def run(broker, queue: str, target: int, *, drain: bool, drain_timeout: float,
        rebalance_timeout: float, standby_timeout: float, reporter: Reporter,
        stop: Callable[[], bool] = lambda: False, online: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep) -> dict:
    """Scale ``queue`` to ``target`` partitions by the procedure's seven steps. Returns a summary.

    ``stop()`` is checked between steps and while a step waits; when it turns true the
    procedure ends with ``ScalingInterrupted``, ingress restored. A procedure recorded for the
    queue by a run that died is resumed when ``target`` is its target (from step 5 when the
    count has changed already), and replaced otherwise; either way ingress ends as it was before
    the first run's step 1."""
    config = broker.queue_config(queue)
    check_scalable(config)
    dataclasses.replace(config, partitions=target)   # InvalidConfig before anything changes
    earlier = procedure_of(broker, queue)
    if earlier is not None and earlier.state == "running" and earlier.pid != os.getpid():
        raise InvalidConfig(f"{earlier.describe()}; wait for it to end, or stop that process")
    resumed = earlier if earlier is not None and earlier.to_partitions == target else None
    old = resumed.from_partitions if resumed is not None else config.partitions
    ingress_before = earlier.ingress_before if earlier is not None else config.ingress_enabled
    first_step = 5 if (resumed is not None and resumed.step >= 4 and config.partitions == target
                       and config.scaling_status == "Ready") else 1
    proc = Procedure(queue, old, target, first_step, ingress_before, os.getpid(),
                     socket.gethostname(), time.time_ns(), online=online)
    write_record(broker, config, proc)
    if resumed is not None:
        reporter.note(first_step, f"resuming the procedure interrupted at step {resumed.step} "
                                  f"(started by pid {resumed.pid} on {resumed.host})")
    elif earlier is not None:
        reporter.note(1, f"replacing the interrupted procedure to {earlier.to_partitions} "
                         f"partitions (stopped at step {earlier.step})")
    t_all = clock()

    def check_stop(n: int) -> None:
        if stop():
            raise ScalingInterrupted(
                f"scaling of queue {queue!r} to {target} partitions was interrupted at step {n} "
                f"({STEPS[n][0]}); ingress is {'on' if ingress_before else 'off'} again as before"
                f" and the partition count is {broker.queue_config(queue).partitions}: run the "
                f"same command again to scale")

    def wait(n: int) -> None:
        check_stop(n)
        sleep(POLL)

    def step(n: int, body: Callable[[], tuple[str, dict]]) -> dict:
        nonlocal proc
        check_stop(n)
        proc = dataclasses.replace(proc, step=n)
        write_record(broker, config, proc)
        reporter.start(n, STEPS[n][1])
        t0 = clock()
        try:
            status, detail = body()
        except ScalingStepFailed as exc:
            reporter.done(n, "timeout", clock() - t0, {"error": str(exc)})
            raise
        except ScalingInterrupted as exc:
            reporter.done(n, "interrupted", clock() - t0, {"error": str(exc)})
            raise
        except Exception as exc:
            reporter.done(n, "failed", clock() - t0, {"error": " ".join(str(exc).split())})
            raise
        reporter.done(n, status, clock() - t0, detail)
        return detail

    def disable() -> tuple[str, dict]:
        broker.update_queue(queue, ingress_enabled=False)
        effect = publishes_while_ingress_off(config)
        reporter.note(1, describe_ingress_off(config))
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
                raise ScalingStepFailed(2, f"step 2 (drain) timed out after {drain_timeout:g} s with "
                                        f"{st.depth} messages left (partition:depth {' '.join(left[:8])}"
                                        f"{' ...' if len(left) > 8 else ''}); ingress is enabled "
                                        f"again and the partition count is unchanged: let consumers "
                                        f"drain {queue!r} and run scale again, raise --drain-timeout, "
                                        f"or pass --no-drain to accept losing messages in removed "
                                        f"partitions")
            wait(2)
            st = broker.queue_status(queue)
        reporter.drain(0, initial)
        return "done", {"drained": initial}

    def standby(phase: str, n: int) -> tuple[str, dict]:
        detail = wait_for_standby(broker, queue, phase, standby_timeout, clock=clock,
                                  sleep=lambda s: wait(n))
        if detail.get("note"):
            reporter.note(n, detail["note"])
        return ("skipped" if not detail.get("waited") else "done"), detail

    def change() -> tuple[str, dict]:
        steps = []
        t0 = clock()

        def progress(text: str) -> None:
            steps.append({"seconds": round(clock() - t0, 6), "step": text})
            reporter.note(4, f"+{clock() - t0:.3f} s {text}")
        final = broker.scale(queue, target, progress=progress, online=online)
        return "done", {"from": old, "to": final.partitions, "steps": steps, "online": online}

    def skipped(n: int) -> Callable[[], tuple[str, dict]]:
        def body() -> tuple[str, dict]:
            reporter.note(n, "skipped (online): ingress stays on; moved keys wait for their old "
                             "partition instead")
            return "skipped", {"online": True}
        return body

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
                raise ScalingStepFailed(5, f"step 5 (rebalance) timed out after {rebalance_timeout:g} s "
                                        f"({why}); the queue already has {target} partitions and "
                                        f"ingress is enabled again: check its consumers with `partq "
                                        f"queue show {queue}`, or raise --rebalance-timeout")
            wait(5)

    def enable() -> tuple[str, dict]:
        _restore(broker, config, ingress_before)
        if online:
            reporter.note(7, "skipped (online): ingress was never turned off")
            return "skipped", {"ingress_enabled": ingress_before, "online": True}
        if not ingress_before:
            reporter.note(7, "ingress was off before the procedure: left off")
        return "done", {"ingress_enabled": ingress_before}

    try:
        if first_step == 1:
            step(1, skipped(1) if online else disable)
            step(2, skipped(2) if online else drained)
            step(3, skipped(3) if online else lambda: standby("drained", 3))
            step(4, change)
        step(5, rebalanced)
        step(6, lambda: standby("scaled", 6))
        step(7, enable)
    except BaseException:
        try:
            _restore(broker, config, ingress_before)
        except Exception:
            pass  # the original error says more; the record stays and `queue show` warns
        raise
    return {"queue": queue, "from": old, "to": target, "seconds": round(clock() - t_all, 6),
            "resumed": resumed}


def abort(broker, queue: str) -> Procedure:
    """Undo the scaling procedure recorded for ``queue`` by a run that died: ingress goes back
    to what it was before its step 1 and the record goes. A partition count it changed already
    stays changed (scale again to change it back). Returns the procedure undone."""
    config = broker.queue_config(queue)
    proc = procedure_of(broker, queue)
    if proc is None:
        raise InvalidConfig(f"no scaling procedure is recorded for queue {queue!r}; nothing to "
                            f"undo")
    if proc.state == "running" and proc.pid != os.getpid():
        raise InvalidConfig(f"{proc.describe()}; stop that process (SIGTERM or Ctrl-C ends it "
                            f"cleanly) instead of undoing it")
    _restore(broker, config, proc.ingress_before)
    return proc


def _restore(broker, config: QueueConfig, ingress: bool) -> None:
    """Put ingress back as it was before the procedure, then forget the procedure."""
    if broker.queue_config(config.name).ingress_enabled != ingress:
        broker.update_queue(config.name, ingress_enabled=ingress)
    write_record(broker, config, None)


def publishes_while_ingress_off(config: QueueConfig) -> str:
    """"rejected" or "discarded": what the queue does with a publish while ingress is off."""
    if config.reject_msg_to_sender and config.reject_msg_to_sender_when_shutdown:
        return "rejected"
    return "discarded"


def describe_ingress_off(config: QueueConfig) -> str:
    """What publishers see while the procedure has ingress off, and how to change it."""
    if publishes_while_ingress_off(config) == "rejected":
        return "publishes are rejected with IngressDisabled until step 7"
    options = ("--reject-when-shutdown on" if config.reject_msg_to_sender
               else "--reject-msg-to-sender on --reject-when-shutdown on")
    return (f"publishes are DISCARDED (counted, and lost) until step 7; to have publishers get "
            f"an error instead, run `partq queue update {config.name} {options}` first")


