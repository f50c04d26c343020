"""Runs rounds of real publisher, consumer and scaler processes against one directory, kills them
with SIGKILL at random moments, restarts them, drains, and checks (``checker``).

The processes are forked by ``spawner`` (a fork server that imported partq and opened nothing),
so a restart costs a fork, not a Python start-up. Everything random (which process dies when,
queue shapes, scalings, crash points armed in restarted processes, the workers' own choices)
comes from one seed. The kill *times* are real time, so a seed reproduces the schedule, not the
exact interleaving.

A process dies either at a random moment from its start (20%: that includes start-up and
``Broker.open``), or at a random moment 0.02-0.7 s after it opened the broker; 25% of the
restarted processes also arm a deterministic crash point (``PARTQ_CRASH_AT``) at a random N.

Processes start and die while scalings run, so some of them open the directory mid-scaling and
finish it alongside the scaler (the bugs that once lost messages there are pinned in
``test_crash_regressions``).

*Lifecycle rounds* (``run_rounds(..., lifecycle_every=N)``; off by default, other rounds unchanged):
the message lifecycle of ``lifecycle``; the drain drains the dead message queue too, and
``logs/harness.jsonl`` says when consumer and scaler processes died, for ``lifecycle_checks``.

*Key rounds* (``key_share``, half by default; drawn after the rest of a round's shape, which
stays as it was): the queue has ``ordering="key"``, checked by ``key_checks``.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import checker
import lifecycle
import lifecycle_checks
import scaler
from helpers import wait_until

import partq
from partq.delivery.lock import LOCK_DIR, holder, inode_of

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = {"pub": "publisher", "con": "consumer", "scale": "scaler"}
CRASH_POINTS_BY_ROLE = {
    "pub": ("before_commit", "after_commit_before_return", "mid_batch"),
    "con": ("before_commit", "after_commit_before_return", "at_ack", "during_truncation",
            "during_handoff"),
    "scale": ("during_scaling", "before_commit", "after_commit_before_return", "after_cutover"),
}


class Spawner:
    """Client of ``spawner.py``: spawn, poll, kill (see there)."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
        self._p = subprocess.Popen([sys.executable, os.path.join(HERE, "spawner.py")], cwd=HERE,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env=env)

    def _ask(self, **cmd) -> dict:
        self._p.stdin.write(json.dumps(cmd) + "\n")
        self._p.stdin.flush()
        line = self._p.stdout.readline()
        if not line:
            raise RuntimeError(f"the spawner died ({self._p.wait()})")
        return json.loads(line)

    def spawn(self, script: str, argv: list, crash_at: str | None, stderr: str) -> int:
        return self._ask(op="spawn", script=script, argv=argv, crash_at=crash_at,
                         stderr=stderr)["pid"]

    def poll(self) -> dict[int, int]:
        return dict(self._ask(op="poll")["exited"])

    def kill(self, pid: int) -> int | None:
        return self._ask(op="kill", pid=pid)["status"]

    def close(self) -> None:
        self._p.stdin.close()
        self._p.wait(timeout=60)


@dataclass
class Proc:
    role: str
    slot: int
    inc: int
    pid: int
    log: str
    err: str
    started: float
    kill_at: float | None          # absolute time, or None until the process has opened
    kill_after_open: float | None  # the delay after "opened" at which it dies
    crash_at: str | None
    argv: list
    status: int | None = None
    cont_at: float | None = None   # SIGSTOPped: when it gets SIGCONT
    held: dict = field(default_factory=dict)   # ... and the delivery locks it held then


@dataclass
class Figures:
    rounds: int = 0
    processes_started: int = 0
    killed_by_harness: int = 0
    killed_by_crash_point: int = 0
    stopped: int = 0               # SIGSTOP/SIGCONT of a consumer process
    owner_takeovers: int = 0       # ... of an owner whose delivery lock another process took
                                   # meanwhile (rule `owner-takeover`)
    concurrent_rounds: int = 0     # rounds whose consumer processes delivered side by side
    scalings: int = 0
    scalings_skipped: int = 0      # an online scaling whose predecessor had not drained in time
    published: int = 0
    attempted: int = 0
    deliveries: int = 0
    delivered: int = 0
    acked: int = 0
    redeliveries: int = 0
    recovered: int = 0
    unknown: int = 0
    dropped_by_scale_down: int = 0
    lifecycle_rounds: int = 0      # rounds with the message lifecycle (see the module doc)
    key_rounds: int = 0            # rounds whose queue has ordering="key" (see the module doc)
    refused: int = 0               # publishes refused by the quota (QueueFull)
    certainly_dead: int = 0        # messages the checker knew had to die (``dead_lost``)
    nacked: int = 0                # poison nacks
    rejected: int = 0              # rejects that returned
    dead: dict = field(default_factory=lambda: {r: 0 for r in lifecycle_checks.DEAD_REASONS})
    violations: dict = field(default_factory=lambda: {k: 0 for k in checker.VIOLATIONS})
    max_open_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def killed(self) -> int:
        return self.killed_by_harness + self.killed_by_crash_point

    def add(self, report: dict) -> None:
        for k in ("published", "attempted", "deliveries", "delivered", "acked", "redeliveries",
                  "recovered", "unknown", "dropped_by_scale_down"):
            setattr(self, k, getattr(self, k) + report[k])
        for k in checker.VIOLATIONS:
            self.violations[k] += report[k]
        for k in ("refused", "nacked", "rejected", "certainly_dead"):
            setattr(self, k, getattr(self, k) + report[k])
        for k in lifecycle_checks.DEAD_REASONS:
            self.dead[k] += report["dead_by_reason"].get(k, 0)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["processes_killed"] = self.killed
        return d


class RoundFailed(AssertionError):
    pass


class Round:
    def __init__(self, spawner: Spawner, root: str, rng: random.Random, figures: Figures,
                 duration: float, lifecycle: bool = False, key_share: float = 0.5) -> None:
        self.sp = spawner
        self.root = root
        self.data = os.path.join(root, "data")
        self.logs = os.path.join(root, "logs")
        self.errs = os.path.join(root, "stderr")
        os.makedirs(self.logs)
        os.makedirs(self.errs)
        self.rng = rng
        self.fig = figures
        self.duration = duration
        self.incs: dict[tuple, int] = {}
        self.procs: list[Proc] = []
        self.scaling = False        # a scaling is unfinished (scaler alive or killed)
        self.scale_target = 0
        # the shape of this round
        self.partitions = rng.randint(2, 5)
        self.flows = rng.choice([1, 2, 2])
        self.standby = rng.random() < 0.4
        self.publishers = rng.choice([1, 2, 2, 3])
        self.rebalance_delay = rng.choice([0.05, 0.2])
        self.max_handoff_time = rng.choice([0.0, 0.1, 0.3])
        n_scales = rng.choice([0, 1, 2, 3])
        self.scale_plan = sorted(rng.uniform(0.1, 0.8) * duration for _ in range(n_scales))
        self.online = rng.random() < 0.5     # rule `online-scaling`: per-key order is checked
        # rule `peer-flows`: consumer processes with their own flows, delivering side by side (one owns
        # delivery and serves the others); otherwise one consumer process (and maybe a standby
        # process for the same names)
        self.spread = rng.choice([0, 0, 2, 3])
        self.stop_rate = 0.004 if self.spread else 0.0    # per look: a SIGSTOP now and then
        self.consumer_timeout = 1.0
        self.crash_point_rate = 0.25
        # the message lifecycle (drawn after the rest: a round without it is drawn as before)
        self.lifecycle = lifecycle
        self.max_depth = rng.choice([200, 500, 1500]) if lifecycle else 0
        self.dead_partitions = rng.randint(1, 3) if lifecycle else 0
        # the queue's ordering (drawn after the rest: the shape above is drawn as before)
        self.ordering = "key" if rng.random() < key_share else "partition"
        self._hlog = None
        self._polled = time.monotonic()     # when the last poll began (lifecycle rounds)

    def describe(self) -> dict:
        return {k: getattr(self, k) for k in ("partitions", "flows", "standby", "publishers",
                                              "rebalance_delay", "max_handoff_time", "scale_plan",
                                              "online", "spread", "lifecycle", "max_depth",
                                              "ordering")}

    def _died(self, proc: Proc, lo: float, status) -> None:
        """Log (lifecycle rounds) that a consumer or scaler process died between ``lo`` and now:
        its crash may count a delivery it never made (rule `delivery-count`)."""
        if self._hlog is None or proc.role == "pub":
            return
        self._hlog.write(json.dumps({"op": "died", "proc": f"{proc.role}-{proc.slot}-{proc.inc}",
                                     "role": proc.role, "status": status, "lo": lo,
                                     "hi": time.monotonic()}) + "\n")
        self._hlog.flush()

    # ------------------------------------------------------------------ processes
    def _start(self, role: str, slot: int, argv: list) -> Proc:
        inc = self.incs[(role, slot)] = self.incs.get((role, slot), 0) + 1
        name = f"{role}-{slot}-{inc:04d}"
        log = os.path.join(self.logs, name + ".jsonl")
        err = os.path.join(self.errs, name + ".err")
        crash_at = None
        armed = self.rng.random() < self.crash_point_rate
        if armed:
            point = self.rng.choice(CRASH_POINTS_BY_ROLE[role])
            crash_at = f"{point}:{self.rng.randint(1, 3 if role == 'scale' else 40)}"
        extra = ["--tag", f"{slot}.{inc}"] if role == "pub" else []
        full_argv = [self.data, log, "--seed", str(self.rng.randrange(1 << 31))] + extra + argv
        pid = self.sp.spawn(SCRIPTS[role], full_argv, crash_at, err)
        now = time.monotonic()
        kill_at = kill_after_open = None
        if role == "scale":
            if self.rng.random() < 0.3:
                kill_after_open = self.rng.uniform(0.0, 0.02)
        elif self.rng.random() < 0.2:        # anywhere from start-up through opening
            kill_at = now + self.rng.uniform(0.0, 0.3)
        elif role == "con" and self.spread:   # long enough to get partitions beside the others
            kill_after_open = self.rng.uniform(0.3, 2.0)
        else:                                 # while it works
            kill_after_open = self.rng.uniform(0.02, 0.7)
        proc = Proc(role, slot, inc, pid, log, err, now, kill_at, kill_after_open, crash_at, argv)
        self.procs.append(proc)
        self.fig.processes_started += 1
        return proc

    def _logged(self, proc: Proc, op: str) -> bool:
        try:
            with open(proc.log, "rb") as f:
                return b'"op":"%s"' % op.encode() in f.read(4096)
        except FileNotFoundError:
            return False

    def _reap(self) -> None:
        polled, self._polled = self._polled, time.monotonic()
        exited = self.sp.poll()
        for proc in list(self.procs):
            if proc.pid not in exited:
                continue
            rc = exited[proc.pid]
            self.procs.remove(proc)
            self._died(proc, polled, rc)
            if rc == -signal.SIGKILL and proc.crash_at:
                self.fig.killed_by_crash_point += 1
            elif rc == 0 and proc.role == "scale":
                self.scaling = False
                self.fig.scalings += 1
                continue
            elif rc == scaler.SKIPPED and proc.role == "scale":
                self.scaling = False
                self.fig.scalings_skipped += 1
                continue
            else:
                with open(proc.err, "rb") as f:
                    err = f.read().decode(errors="replace")
                raise RoundFailed(f"{proc.role}-{proc.slot}-{proc.inc} exited with {rc} "
                                  f"(crash_at={proc.crash_at}):\n{err[-3000:]}")
            self._start(proc.role, proc.slot, proc.argv)

    def _kill(self, proc: Proc) -> None:
        lo = time.monotonic()
        status = self.sp.kill(proc.pid)
        self.procs.remove(proc)
        self._died(proc, lo, status)
        if status == -signal.SIGKILL or status is None:
            self.fig.killed_by_harness += 1
        elif not (proc.role == "scale" and status == 0):
            with open(proc.err, "rb") as f:
                err = f.read().decode(errors="replace")
            raise RoundFailed(f"{proc.role}-{proc.slot}-{proc.inc} exited with {status}:\n"
                              f"{err[-3000:]}")

    def _stop_and_continue(self, now: float) -> None:
        """SIGSTOP a consumer process now and then, for up to three times the consumer timeout
        (past it the owner unbinds its flows; a stopped owner loses delivery to another
        process, rule `owner-takeover`), then SIGCONT it: its held messages' acks are fenced
        (or, an old owner's, refused as its flows were closed), its flows come back."""
        for proc in self.procs:
            if proc.cont_at is not None and now >= proc.cont_at:
                proc.cont_at = None
                self.fig.owner_takeovers += sum(1 for path, ino in proc.held.items()
                                                if inode_of(path) != ino)
                proc.held = {}
                os.kill(proc.pid, signal.SIGCONT)
        if self.stop_rate and self.rng.random() < self.stop_rate:
            running = [p for p in self.procs if p.role == "con" and p.cont_at is None]
            if running:
                proc = self.rng.choice(running)
                proc.cont_at = now + self.rng.uniform(0.1, 3 * self.consumer_timeout)
                proc.kill_at = None if proc.kill_at is None else max(proc.kill_at, proc.cont_at)
                locks = os.path.join(self.data, LOCK_DIR)
                paths = [os.path.join(locks, n) for n in os.listdir(locks) if n.endswith(".lock")] \
                    if os.path.isdir(locks) else []
                os.kill(proc.pid, signal.SIGSTOP)
                # the delivery locks it holds: a new file there by its SIGCONT is a takeover
                proc.held = {path: inode_of(path) for path in paths
                             if (holder(path) or "").startswith(f"pid {proc.pid} ")}
                self.fig.stopped += 1

    # ------------------------------------------------------------------ the round
    def run(self) -> dict:
        extra = lifecycle.queue_options(self.max_depth) if self.lifecycle else {}
        with partq.Broker.open(self.data) as b:
            if self.lifecycle:
                b.create_queue(lifecycle.DEAD_QUEUE, partitions=self.dead_partitions)
            b.create_queue("q", partitions=self.partitions, rebalance_delay=self.rebalance_delay,
                           max_handoff_time=self.max_handoff_time,
                           consumer_timeout=self.consumer_timeout, ordering=self.ordering,
                           **extra)
        self.fig.rounds += 1
        if self.ordering == "key":
            self.fig.key_rounds += 1
        flag = ["--lifecycle"] if self.lifecycle else []
        if self.lifecycle:
            self.fig.lifecycle_rounds += 1
            self._hlog = open(os.path.join(self.logs, "harness.jsonl"), "a")
        try:
            return self._run(flag)
        finally:
            if self._hlog is not None:
                self._hlog.close()

    def _run(self, flag: list) -> dict:
        for slot in range(self.publishers):
            self._start("pub", slot, flag)
        con_argv = ["--flows", str(self.flows), "--churn", "0.02",
                    "--ordering", self.ordering] + flag
        if self.spread:
            self.fig.concurrent_rounds += 1
            for slot in range(self.spread):
                self._start("con", slot, con_argv + ["--prefix", f"s{slot}c"])
        else:
            for slot in range(2 if self.standby else 1):
                self._start("con", slot, con_argv)
        t0 = time.monotonic()
        plan = list(self.scale_plan)
        try:
            while time.monotonic() - t0 < self.duration or self.scaling:
                # the schedule's clock: a random pause between looks, so kills land at random
                # moments of the processes' work (the randomness is the point, not a wait)
                time.sleep(self.rng.uniform(0.002, 0.02))
                self._reap()
                now = time.monotonic()
                if plan and now - t0 >= plan[0] and not self.scaling:
                    plan.pop(0)
                    current = self.scale_target or self.partitions
                    target = self.rng.choice([n for n in range(1, 7) if n != current])
                    self.scale_target = target
                    self.scaling = True
                    self._start("scale", 0, ["--to", str(target)]
                                + (["--online"] if self.online else []))
                self._stop_and_continue(now)
                for proc in list(self.procs):
                    if proc.kill_at is None and proc.kill_after_open is not None and \
                            self._logged(proc, "opened"):
                        proc.kill_at = time.monotonic() + proc.kill_after_open
                    if proc.kill_at is not None and now >= proc.kill_at:
                        self._kill(proc)
                        self._start(proc.role, proc.slot, proc.argv)
        finally:
            for proc in list(self.procs):
                self._kill(proc)
        drain_log = os.path.join(self.logs, "zz-drain.jsonl")
        drain_err = os.path.join(self.errs, "drain.err")
        dead = ["--dead", lifecycle.DEAD_QUEUE] if self.lifecycle else []
        pid = self.sp.spawn("drain", [self.data, drain_log, "--timeout", "60"] + dead, None,
                            drain_err)
        exited: dict[int, int] = {}

        def drain_exited() -> bool:
            exited.update(self.sp.poll())
            return pid in exited
        try:
            wait_until(drain_exited, 90, "the drain process to exit")
            status = exited[pid]
        except AssertionError:
            self.sp.kill(pid)
            status = "hung"
        if status != 0:
            with open(drain_err, "rb") as f:
                raise RoundFailed(f"drain failed ({status}): "
                                  f"{f.read().decode(errors='replace')[-3000:]}")
        drain_events = checker.read_log(drain_log)
        self.fig.max_open_seconds = max(self.fig.max_open_seconds, drain_events[0]["seconds"])
        report = checker.check(checker.load_dir(self.logs), concurrent=bool(self.spread),
                               lifecycle={"max_redelivery": lifecycle.MAX_REDELIVERY}
                               if self.lifecycle else None, ordering=self.ordering)
        report["drained"] = next(e for e in drain_events if e["op"] == "drained")
        self.fig.add(report)
        if not report["ok"]:
            raise RoundFailed("checker found violations:\n" + checker.summary(report))
        return report


def run_rounds(base: str, seed: int, rounds: int, duration: float,
               lifecycle_every: int = 0, key_share: float = 0.5) -> Figures:
    """Run ``rounds`` rounds of ``duration`` seconds each under ``base``; raise ``RoundFailed``
    (with the seed, the round and its shape) on the first failure. ``lifecycle_every``: every
    that many rounds one is a lifecycle round (rounds ``N-1``, ``2N-1``, ...; 1: all, 0: none).
    ``key_share``: the chance a round is a key round (1: all, 0: none)."""
    rng = random.Random(seed)
    fig = Figures()
    t0 = time.monotonic()
    spawner = Spawner()
    try:
        for i in range(rounds):
            rnd = Round(spawner, os.path.join(base, f"round-{i:03d}"),
                        random.Random(rng.randrange(1 << 62)), fig, duration,
                        lifecycle=bool(lifecycle_every) and i % lifecycle_every == lifecycle_every - 1,
                        key_share=key_share)
            try:
                rnd.run()
            except RoundFailed as exc:
                raise RoundFailed(f"PARTQ_CRASH_SEED={seed} round {i} {json.dumps(rnd.describe())} "
                                  f"in {rnd.root}: {exc}") from None
    finally:
        spawner.close()
        fig.seconds = round(time.monotonic() - t0, 1)
    return fig
