"""``partq.Worker``: handlers registered with a decorator, run over their queues with
concurrency across keys, order within a key, retries with backoff, a dead message queue by
default, and a clean stop.

    worker = partq.Worker("data/")

    @worker.handler("orders", concurrency=8, retries=5, backoff=(0.5, 60))
    def handle(msg: partq.Message) -> None:
        ...

    worker.run()        # until SIGINT or SIGTERM; or start() ... stop()

Each handler binds one flow to its queue; ``partq.worker.runner`` runs it. Async handlers (``async
def``) run on the worker's one event loop (``partq.worker.loop``).

Thread-safety: ``handler`` before ``start``; ``start``, ``stop`` and ``status`` from any thread.
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from partq.clock import SystemClock
from partq.errors import InvalidConfig, PartqError
from partq.message import Message
from partq.worker.loop import EventLoopThread
from partq.worker.options import (
    DEFAULT_BACKOFF,
    DEFAULT_CONCURRENCY,
    DEFAULT_RETRIES,
    DEFAULT_WARN_AFTER,
    HandlerOptions,
)
from partq.worker.runner import HandlerRunner
from partq.worker.stopping import wait_for_signal

log = logging.getLogger("partq.worker")

WATCH_EVERY = 0.5       # seconds between looks for slow handlers


class Worker:
    """Runs handlers over queues of a directory (``path``) or of a ``partq serve`` (``address``,
    with ``token`` and ``ssl`` as ``partq.connect``). ``path=None`` and ``address=None``: the
    ``partq worker`` command sets the directory from ``--data``. ``metrics_listen="HOST:PORT"``
    serves the worker's metrics (with the broker's, on a directory) for Prometheus.
    ``on_event``: called with a dict for each thing the worker did (a message handled,
    retried, dead; a slow handler), from the worker's threads (``partq worker --json``)."""

    def __init__(self, path: str | os.PathLike | None = None, *, address: str | None = None,
                 token: str | bytes | None = None, ssl=None, metrics_listen: str | None = None,
                 clock=None, rng: random.Random | None = None,
                 on_event: Callable[[dict], None] | None = None) -> None:
        if path is not None and address is not None:
            raise InvalidConfig("a Worker takes a directory (path) or a partq serve address, "
                                "not both")
        self.path = None if path is None else os.fspath(path)
        self.address, self.token, self.ssl = address, token, ssl
        self.metrics_listen = metrics_listen
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.on_event = on_event
        self.handlers: list[HandlerOptions] = []
        self._runners: list[HandlerRunner] = []
        self._conn: Any = None      # the Broker or Client the worker opened
        self._loop: EventLoopThread | None = None
        self._metrics = None
        self._lock = threading.Lock()
        self._state = "new"         # new -> started -> stopped
        self._force = threading.Event()
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.stopped_cleanly: bool | None = None

    # ------------------------------------------------------------------ set-up
    def handler(self, queue: str, *, concurrency: int = DEFAULT_CONCURRENCY,
                retries: int = DEFAULT_RETRIES,
                backoff: tuple[float, float] = DEFAULT_BACKOFF,
                warn_after: float = DEFAULT_WARN_AFTER) -> Callable[[Callable], Callable]:
        """Register the decorated function (plain or ``async def``) as the handler of ``queue``:
        it is called with each ``partq.Message``; returning acks the message, raising retries
        it after a backoff, at most ``retries`` times, then moves it to the queue's dead message
        queue with the exception's type and message in its headers. At most ``concurrency``
        run at once, never two of one key (``ordering="key"``) or of one partition
        (``ordering="partition"``). The function is returned unchanged."""
        def register(fn: Callable) -> Callable:
            options = HandlerOptions(queue, fn, concurrency, retries, backoff, warn_after)
            with self._lock:
                if self._state != "new":
                    raise InvalidConfig("register handlers before the worker starts")
                if any(h.queue == queue for h in self.handlers):
                    raise InvalidConfig(f"queue {queue!r} has a handler already")
                self.handlers.append(options)
            return fn
        return register

    def set_concurrency(self, concurrency: int) -> None:
        """Every handler's concurrency (``partq worker --concurrency``), before ``start``."""
        with self._lock:
            self.handlers = [HandlerOptions(h.queue, h.fn, concurrency, h.retries, h.backoff,
                                            h.warn_after) for h in self.handlers]

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Open the directory (or connect), set up each handler's dead message queue, bind
        and start receiving; returns at once."""
        with self._lock:
            if self._state != "new":
                raise InvalidConfig(f"the worker is {self._state} already; a Worker starts once")
            if not self.handlers:
                raise InvalidConfig("the worker has no handlers: register one with "
                                    "@worker.handler(queue)")
            self._state = "started"
        try:
            self._conn = self._open()
            if any(h.is_async for h in self.handlers):
                self._loop = EventLoopThread()
            for options in self.handlers:
                self._runners.append(self._runner(options))
            self._metrics = self._serve_metrics()
        except BaseException:
            self._close_all()
            self._state = "stopped"
            raise
        for runner in self._runners:
            runner.start()
        self._watcher = threading.Thread(target=self._watch, name="partq-worker-watch",
                                         daemon=True)
        self._watcher.start()
        self._event("started", handlers=[h.queue for h in self.handlers],
                    where=self.address or self.path)

    def _open(self):
        if self.address is not None:
            from partq.remote.client import connect
            return connect(self.address, token=self.token, ssl=self.ssl)
        if self.path is None:
            raise InvalidConfig("the worker has no directory: give Worker(path) or "
                                "Worker(address=...), or run it with partq --data DIR worker")
        from partq.broker import Broker
        return Broker.open(self.path, metrics_listen=self.metrics_listen)

    def _runner(self, options: HandlerOptions) -> HandlerRunner:
        conn = self._conn
        dead, done = conn.ensure_dead_message_queue(options.queue)
        if done:
            log.warning("queue %r had no dead message queue: %s, so that messages whose handler "
                        "keeps failing are kept there, not discarded", options.queue,
                        " and ".join(done))
        ordering = conn.queue_config(options.queue).ordering
        flow = conn.bind(options.queue)
        log.info("worker: handler %s on queue %r (ordering %r, concurrency %d, retries %d, "
                 "backoff %s, dead message queue %r)", options.name, options.queue, ordering,
                 options.concurrency, options.retries, options.backoff, dead)
        return HandlerRunner(options, flow, ordering, self.clock, self.rng,
                             self._caller(options), self._reporter(options),
                             lambda: conn.bind(options.queue))

    def _caller(self, options: HandlerOptions) -> Callable[[Message], object]:
        fn = options.fn
        if not options.is_async:
            return fn
        loop = self._loop
        assert loop is not None
        return lambda msg: loop.call(fn, msg)

    def _reporter(self, options: HandlerOptions) -> Callable[..., None]:
        def report(event: str, msg: Message | None = None, **fields) -> None:
            if self.on_event is None:
                return
            where = {} if msg is None else {"partition": msg.partition, "seq": msg.seq,
                                            "key": msg.key}
            self._event(event, queue=options.queue, **where, **fields)
        return report

    def _event(self, event: str, **fields) -> None:
        if self.on_event is not None:
            try:
                self.on_event({"event": event, **fields})
            except Exception:
                log.exception("worker: on_event raised")

    def _serve_metrics(self):
        if self.metrics_listen is None:
            return None
        from partq.worker.metrics import serve_metrics
        broker = self._conn if self.address is None else None
        return serve_metrics(broker, self.metrics_listen, self._runners, self.clock)

    @property
    def metrics_address(self) -> str | None:
        """The HOST:PORT the metrics are served on (None without ``metrics_listen``)."""
        return None if self._metrics is None else self._metrics.address

    # ------------------------------------------------------------------ watch
    def _watch(self) -> None:
        while not self._watch_stop.wait(WATCH_EVERY):
            self.check_slow()

    def check_slow(self) -> int:
        """Log each running handler past its ``warn_after`` (once per message); return how
        many were new. The worker's watch thread calls it every half second."""
        now, found = self.clock.now(), 0
        for runner in self._runners:
            for entry in runner.slow(now):
                found += 1
                msg = entry.msg
                log.warning("worker: the handler of queue %r has run %.0f s on key %r (partition "
                            "%d, seq %d); that key waits, the others go on", msg.queue,
                            now - entry.started, msg.key, msg.partition, msg.seq)
                self._event("slow", queue=msg.queue, partition=msg.partition, seq=msg.seq,
                            key=msg.key, seconds=round(now - entry.started, 3))
        return found

    def status(self) -> list[dict]:
        """Per handler: its queue, counts (handled, failed, retried, dead, running), messages
        buffered, and the handlers running past ``warn_after`` (``slow``)."""
        now = self.clock.now()
        return [runner.status(now) for runner in self._runners]

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 30.0) -> bool:
        """Stop receiving; let running handlers finish for up to ``timeout`` seconds; ack what
        they finished (durably); unbind, so the queues' partitions go to other consumers; close.
        Messages received and not started, and handlers still running at the timeout, come
        back to the queue, marked redelivered. Returns True when every handler finished in
        time. ``force()`` (a second signal under ``run``) cuts the wait short."""
        with self._lock:
            if self._state != "started":
                return bool(self.stopped_cleanly)
            self._state = "stopping"
        deadline = time.monotonic() + timeout
        for runner in self._runners:
            runner.stop_receiving()
        left = sum(runner.finish(deadline, self._force) for runner in self._runners)
        clean = not left and not self._force.is_set()
        if left:
            log.warning("worker: %d handler(s) still running at the stop; their messages come "
                        "back to the queue, marked redelivered", left)
        self._close_all()
        self.stopped_cleanly = clean
        self._state = "stopped"
        self._event("stopped", clean=clean, running_left=left)
        return clean

    def force(self) -> None:
        """Stop at once: a ``stop`` under way waits no more (unacked messages come back)."""
        self._force.set()

    def _close_all(self) -> None:
        self._watch_stop.set()
        for runner in self._runners:
            runner.unbind()
        if self._metrics is not None:
            self._metrics.close()
        if self._loop is not None:
            self._loop.close()
        if self._conn is not None:
            try:
                self._conn.close()
            except PartqError as exc:
                log.warning("worker: close failed: %s", exc)

    def run(self, timeout: float = 30.0) -> bool:
        """``start``, block until SIGINT or SIGTERM, then ``stop(timeout)``; a second signal
        stops at once. Returns what ``stop`` returned. Signals are caught only in the main
        thread (elsewhere it blocks until ``stop`` is called from another thread)."""
        with wait_for_signal(self.force) as signalled:
            self.start()
            while not signalled.wait(0.5):
                if self._state != "started":
                    return bool(self.stopped_cleanly)
            log.info("worker: stopping (a second signal stops at once)")
            return self.stop(timeout)

    def __repr__(self) -> str:
        where = self.address or self.path
        return f"<Worker {where!r} {self._state} handlers={[h.queue for h in self.handlers]}>"
