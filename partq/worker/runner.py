"""One handler at work on one flow: a receiving thread that keeps a bounded number of messages
received ahead, ``concurrency`` handler threads that take what the ``KeyScheduler`` hands out,
and one acking thread that acks finished messages in batches (one commit for all that finished
while the previous commit was written).

A handler that returns gets its message acked; one that raises gets it retried after a backoff
(a nack with that delay), or, out of retries, rejected to the dead message queue with the
exception's type and message in its headers (``retry``).
"""
from __future__ import annotations

import logging
import queue as queue_module
import random
import threading
import time
from collections.abc import Callable

from partq.errors import FlowClosed, FlowFenced, PartqError
from partq.flow import Flow
from partq.message import Message
from partq.worker.options import HandlerOptions
from partq.worker.retry import FailurePolicy
from partq.worker.scheduler import Entry, KeyScheduler
from partq.worker.stats import HandlerStats

log = logging.getLogger("partq.worker")

RECEIVE_WAIT = 0.02     # seconds one receive waits (a nack waits for it: see _nack_lock)
FAST_HANDLER = 0.0002   # seconds: a handler that returns faster (on average) ...
FAST_BATCH = 16         # ... has its threads take this many messages at a time
MAX_BATCH = 1000        # messages one receive or one ack commit takes at most


def receive_ahead(concurrency: int) -> int:
    """Messages a handler keeps received and not done: enough that ``concurrency`` handlers find
    a free key among them, few enough that a handoff (which waits for them) ends quickly."""
    return max(32 * concurrency, 256)


class HandlerRunner:
    def __init__(self, options: HandlerOptions, flow: Flow, ordering: str, clock,
                 rng: random.Random, call: Callable[[Message], object],
                 report: Callable[..., None], rebind: Callable[[], Flow]) -> None:
        self.options, self.flow, self.clock = options, flow, clock
        self.rebind = rebind
        self.call, self.report = call, report
        self.stats = HandlerStats()
        self.scheduler = KeyScheduler(ordering)
        self.ahead = receive_ahead(options.concurrency)
        self.failures = FailurePolicy(options, flow, rng)
        self._running: set[Entry] = set()
        self._recent = 1.0          # seconds a run took, a moving average (racy: a hint)
        self._running_lock = threading.Lock()
        # held around each receive and each nack, so that the copies a nack gives back are
        # exactly those received before it (they are dropped; they come again)
        self._nack_lock = threading.Lock()
        self._acks: queue_module.SimpleQueue[list[Entry] | None] = queue_module.SimpleQueue()
        self._stop_receiving = threading.Event()
        self._threads: list[threading.Thread] = []
        self._receiver: threading.Thread | None = None
        self._acker: threading.Thread | None = None

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        tag = self.options.queue
        self._receiver = threading.Thread(target=self._receive_loop, daemon=True,
                                          name=f"partq-worker-receive-{tag}")
        self._acker = threading.Thread(target=self._ack_loop, daemon=True,
                                       name=f"partq-worker-ack-{tag}")
        self._threads = [threading.Thread(target=self._work_loop, daemon=True,
                                          name=f"partq-worker-{tag}-{i}")
                         for i in range(self.options.concurrency)]
        for t in (self._receiver, self._acker, *self._threads):
            t.start()

    # ------------------------------------------------------------------ receive
    def _receive_loop(self) -> None:
        scheduler = self.scheduler
        while not self._stop_receiving.is_set():
            room = scheduler.wait_for_room(self.ahead, 0.1, self.ahead // 4)
            if room <= 0:
                if self.flow.closed and not self._stop_receiving.is_set():
                    self._bind_again(self.flow.closed_reason or "unbound")
                continue
            try:
                with self._nack_lock:
                    msgs = self.flow.receive(min(room, MAX_BATCH), timeout=RECEIVE_WAIT)
                    if msgs:
                        scheduler.add(msgs)
            except FlowClosed as exc:
                if not self._stop_receiving.is_set():
                    self._bind_again(str(exc))
            except PartqError as exc:
                log.error("queue %r: receive failed: %s", self.options.queue, exc)
                self._stop_receiving.wait(1.0)

    def _bind_again(self, why: str) -> None:
        """The flow was unbound under the worker (its queue changed access type, its process
        stalled past consumer_timeout, a handler hung past max_poll_interval with the
        receive-ahead full, partq serve could not bind it again after a reconnect): drop what
        was received and not started (it comes again), wait for the running handlers (a
        key's next run must not overlap them), then bind a new flow."""
        queue = self.options.queue
        log.warning("queue %r: the worker's flow was unbound (%s); binding again once its "
                    "running handlers finish", queue, why)
        self.report("unbound", reason=why)
        self.scheduler.drop_waiting()
        while self.scheduler.buffered() and not self._stop_receiving.wait(0.05):
            pass
        while not self._stop_receiving.is_set():
            try:
                self.flow = self.failures.flow = self.rebind()
            except PartqError as exc:
                log.error("queue %r: binding again failed (%s); trying again in 5 s", queue, exc)
                self._stop_receiving.wait(5.0)
                continue
            log.info("queue %r: the worker's flow is bound again", queue)
            return

    # ------------------------------------------------------------------ run
    def _work_loop(self) -> None:
        scheduler = self.scheduler
        while True:
            # a handler that returns within microseconds takes a few messages at a time (of
            # other keys), so that its thread is not woken once per message
            limit = scheduler.batch = FAST_BATCH if self._recent < FAST_HANDLER else 1
            entries = scheduler.take(0.5, limit)
            if not entries:
                if scheduler.closed():
                    return
                continue
            finished = []
            for i, entry in enumerate(entries):
                if i and scheduler.closed():
                    break       # taken, not started: they go back to the queue at the stop
                if self._run(entry):
                    finished.append(entry)
            if finished:
                self._acks.put(finished)

    def _run(self, entry: Entry) -> bool:
        """Run the handler on ``entry``; True if it returned (to be acked); a failure is
        settled here (retry or dead)."""
        stats = self.stats
        entry.started = self.clock.now()
        with self._running_lock:
            self._running.add(entry)
        stats.started()
        t0 = time.perf_counter()
        error: Exception | None = None
        try:
            self.call(entry.msg)
        except Exception as exc:
            error = exc
        seconds = time.perf_counter() - t0
        self._recent += (seconds - self._recent) / 8
        stats.finished(seconds, error is None)
        with self._running_lock:
            self._running.discard(entry)
        if error is None:
            return True
        self._failed(entry, error)
        return False

    def _failed(self, entry: Entry, error: Exception) -> None:
        with self._nack_lock:
            since = self.scheduler.epoch()
            outcome = self.failures.settle(entry.msg, error)
        if outcome.back is not None:
            self.scheduler.given_back(entry, entry.msg.partition, outcome.back, since)
        else:
            self.scheduler.done([entry])
        self.stats.add(retried=outcome.retried, dead=outcome.dead)
        if outcome.event is not None:
            self.report(outcome.event, msg=entry.msg, **outcome.fields)

    # ------------------------------------------------------------------ ack
    def _ack_loop(self) -> None:
        while True:
            first = self._acks.get()
            batch = list(first) if first is not None else []
            last = first is None
            while len(batch) < MAX_BATCH:
                try:
                    more = self._acks.get_nowait()
                except queue_module.Empty:
                    break
                if more is None:
                    last = True
                else:
                    batch += more
            if batch:
                self._ack(batch)
            if last:
                return

    def _ack(self, batch: list[Entry]) -> None:
        msgs = [e.msg for e in batch]
        try:
            pending = self.flow.ack_many_async(msgs)
        except FlowFenced as exc:
            refused = {(m.partition, m.seq) for m in exc.messages}
            log.warning("queue %r: %d handled message(s) were not acked: their partitions moved "
                        "to another consumer, which gets them again", self.options.queue,
                        len(refused) or len(msgs))
            rest = [e for e in batch if (e.msg.partition, e.msg.seq) not in refused]
            self.scheduler.done([e for e in batch if e not in rest])
            if rest and refused:
                self._ack(rest)
            else:
                self.scheduler.done(rest)
            return
        except PartqError as exc:
            log.error("queue %r: %d handled message(s) could not be acked (%s); they come "
                      "again", self.options.queue, len(msgs), exc)
            self.scheduler.done(batch)
            return
        self.scheduler.done(batch)      # applied: each key's next message may run
        try:
            pending.result()
        except PartqError as exc:
            log.error("queue %r: the ack of %d handled message(s) failed (%s); they come "
                      "again", self.options.queue, len(msgs), exc)
            return
        self.stats.add(handled=len(batch))
        for msg in msgs:
            self.report("handled", msg=msg)

    # ------------------------------------------------------------------ watch
    def running(self) -> list[Entry]:
        with self._running_lock:
            return list(self._running)

    def slow(self, now: float) -> list[Entry]:
        """Running handlers past ``warn_after`` not reported yet (each reported once)."""
        limit = self.options.warn_after
        out = []
        for entry in self.running():
            if not entry.warned and now - entry.started >= limit:
                entry.warned = True
                out.append(entry)
        return out

    def status(self, now: float) -> dict:
        slow = [{"partition": e.msg.partition, "seq": e.msg.seq, "key": e.msg.key,
                 "seconds": round(now - e.started, 3)}
                for e in self.running() if now - e.started >= self.options.warn_after]
        return {"queue": self.options.queue, "handler": self.options.name,
                **self.stats.as_dict(), "buffered": self.scheduler.buffered(),
                "slow": sorted(slow, key=lambda s: (s["partition"], s["seq"]))}

    # ------------------------------------------------------------------ stop
    def stop_receiving(self) -> None:
        """Receive nothing more and hand out nothing more; running handlers go on."""
        self._stop_receiving.set()
        if self._receiver is not None:
            self._receiver.join()
        never = self.scheduler.close()
        if never:
            log.info("queue %r: %d message(s) received ahead and not started go back to the "
                     "queue", self.options.queue, never)

    def finish(self, deadline: float, force: threading.Event) -> int:
        """Wait (until ``deadline`` on ``time.monotonic()``, or ``force``) for the running
        handlers, then ack what they finished, durably. Returns the handlers still running."""
        for t in self._threads:
            while t.is_alive() and time.monotonic() < deadline and not force.is_set():
                t.join(0.05)
        self._acks.put(None)
        acker = self._acker
        while acker is not None and acker.is_alive() and not force.is_set():
            acker.join(0.05)
        return len(self.running())

    def unbind(self) -> None:
        """Leave for good: the partitions go to the queue's other consumers at once."""
        try:
            self.flow.unbind(leave=True)
        except PartqError as exc:
            log.warning("queue %r: unbind failed: %s", self.options.queue, exc)
