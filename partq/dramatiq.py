"""dramatiq on partq: ``PartqBroker``, a dramatiq broker whose queues are partq queues, in a
directory (``PartqBroker("data/")``) or through ``partq serve`` (``PartqBroker(address=
"host:7020", token=...)``).

    import dramatiq
    from partq.dramatiq import PartqBroker

    dramatiq.set_broker(PartqBroker("data/"))

    @dramatiq.actor
    def charge(customer, amount): ...

    charge.send_with_options(args=("c-42", 10), partq_key="c-42")   # one at a time per key

A dramatiq queue ``NAME`` is three partq queues: ``NAME`` (``ordering="key"``, its dead
message queue ``NAME.XQ``), ``NAME.DQ`` for delayed messages and ``NAME.XQ`` for dead ones.
An ack is a partq ack (durable when it returns; no visibility timeout), a dead letter a partq
reject, a retry of the Retries middleware a nack with its delay (the message comes back in
its place), a delayed message waits in ``NAME.DQ`` as a nack's delay. docs/dramatiq.md says
what each dramatiq option maps to.
"""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from typing import Any

from dramatiq.broker import Broker, Consumer, MessageProxy
from dramatiq.common import current_millis, dq_name, q_name, xq_name
from dramatiq.errors import ConnectionClosed, QueueJoinTimeout
from dramatiq.errors import QueueNotFound as DramatiqQueueNotFound
from dramatiq.message import Message

from partq.config import USER_SETTABLE
from partq.dramatiq_consumer import PartqConsumer, PartqMessageProxy
from partq.errors import InvalidConfig, QueueNotFound, ServerUnavailable

__all__ = ["PartqBroker", "PartqConsumer", "PartqMessageProxy"]

# dramatiq's TimeLimit bounds a task (10 min by default): a partition handed to another worker
# process waits that long for the keys a task of the old one still runs, so no key overlaps.
HANDOFF_TIME = 600.0
QUEUE_DEFAULTS = {"ordering": "key", "max_handoff_time": HANDOFF_TIME, "max_poll_interval": 0.0}


class PartqBroker(Broker):
    """A dramatiq broker on partq. ``path``: a partq directory (created if missing), opened in
    this process on first use (and again in a forked child); or ``address`` (``HOST:PORT`` of
    ``partq serve``) with ``token`` and ``ssl`` as ``partq.connect`` takes them.

    ``partitions``: partitions of each queue it creates (a worker process's consumer gets a
    share of them; one key's messages are in one partition). ``queue_options``: more settings
    of the queues it creates (``partq.QueueConfig`` fields, such as ``max_redelivery`` or
    ``max_depth``). ``durability``: the directory's, as ``partq.Broker.open`` takes it.
    ``fail_fast_default``: whether ``join`` raises the error of a message a worker of this
    process dead-lettered (as dramatiq's StubBroker does for tests)."""

    def __init__(self, path: str | os.PathLike | None = None, *, address: str | None = None,
                 token: str | bytes | None = None, ssl=None, middleware=None, partitions: int = 4,
                 queue_options: dict | None = None, durability: str = "sync",
                 fail_fast_default: bool = False) -> None:
        if (path is None) == (address is None):
            raise InvalidConfig("PartqBroker takes a directory (path) or the address of partq "
                                "serve (address=HOST:PORT), one of the two")
        refused = set(queue_options or {}) - USER_SETTABLE
        if refused:
            raise InvalidConfig(f"unknown queue option(s) {', '.join(sorted(refused))}; known: "
                                f"{', '.join(sorted(USER_SETTABLE))}")
        super().__init__(middleware=middleware)
        self.path = None if path is None else os.fspath(path)
        self.address = address
        self._token, self._ssl, self._durability = token, ssl, durability
        self.partitions = partitions
        self.queue_options = {**QUEUE_DEFAULTS, **(queue_options or {})}
        self.fail_fast_default = fail_fast_default
        self.queues: set[str] = set()
        self._declared: set[str] = set()      # canonical names known to exist in partq
        self.actor_options.add("partq_key")
        self._conn_lock = threading.Lock()
        self._lock = threading.Lock()         # the consumers
        self._conn: Any = None      # a partq.Broker or a partq.Client
        self._conn_pid = 0
        self._consumers: dict[str, PartqConsumer] = {}
        self._consumers_pid = os.getpid()
        self._dead: defaultdict[str, list[tuple[type, tuple]]] = defaultdict(list)

    # ------------------------------------------------------------------ the partq side
    @property
    def connection(self):
        """The ``partq.Broker`` (directory) or ``partq.Client`` (``partq serve``) this broker
        uses, opened on first use in this process."""
        with self._conn_lock:
            if self._conn is None or self._conn_pid != os.getpid():
                if self.path is not None:
                    from partq.broker import Broker as PartqDirectory
                    self._conn = PartqDirectory.open(self.path, durability=self._durability)
                else:
                    from partq.remote.client import connect
                    assert self.address is not None
                    self._conn = connect(self.address, token=self._token, ssl=self._ssl)
                self._conn_pid = os.getpid()
            return self._conn

    def _create(self, name: str, **options) -> None:
        """Create partq queue ``name`` unless it exists; through ``partq serve`` (whose client
        creates no queues) check that it exists."""
        conn = self.connection
        create = getattr(conn, "create_queue", None)
        if create is None:
            try:
                conn.queue_status(name)
            except QueueNotFound:
                raise QueueNotFound(
                    f"queue {name!r} does not exist on partq serve at {self.address}; create "
                    f"the dramatiq queue's three partq queues on the server as docs/dramatiq.md "
                    f"says (partq queue create ...)") from None
            return
        create(name, options.pop("partitions", self.partitions), exist_ok=True, **options)

    def _create_all(self, canonical: str) -> None:
        xq, dq = xq_name(canonical), dq_name(canonical)
        self._create(xq, partitions=1)
        self._create(canonical, **{**self.queue_options, "dead_message_queue": xq})
        self._create(dq, **{**self.queue_options, "max_redelivery": 0})

    # ------------------------------------------------------------------ dramatiq's Broker
    def declare_queue(self, queue_name: str) -> None:
        """Declare ``queue_name``: its partq queues are created (with ``exist_ok``) and a
        running worker starts consuming it and its delay queue."""
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        self._create_all(q_name(queue_name))
        self._declared.add(q_name(queue_name))
        self.queues.add(queue_name)
        self.emit_after("declare_queue", queue_name)
        delayed = dq_name(queue_name)
        self.delay_queues.add(delayed)
        self.emit_after("declare_delay_queue", delayed)

    def enqueue(self, message: Message, *, delay: int | None = None) -> Message:
        """Publish ``message`` (durable when this returns); ``delay`` (ms) publishes it to the
        delay queue with its eta. A message a worker of this broker runs now, re-enqueued with a
        delay (the Retries middleware does), is nacked with that delay once it ends instead:
        it comes back in its place. ``partq_key`` (message option, or actor option) is the
        partq key."""
        if delay is not None and self._retry_in_place(message, delay):
            return message
        queue_name = message.queue_name
        self._check_queue(queue_name)
        key = self._key(message)
        if delay is not None:
            queue_name, key = dq_name(queue_name), None
            message = message.copy(queue_name=queue_name, options={"eta": current_millis() + delay})
        self.emit_before("enqueue", message, delay)
        try:
            self.connection.publish(queue_name, message.encode(), key=key)
        except QueueNotFound:
            raise DramatiqQueueNotFound(queue_name) from None
        except ServerUnavailable as exc:
            raise ConnectionClosed(exc) from None
        self.emit_after("enqueue", message, delay)
        return message

    def _check_queue(self, queue_name: str) -> None:
        """``QueueNotFound`` for a queue neither declared here nor in partq (as the StubBroker)."""
        if q_name(queue_name) in self._declared:
            return
        try:
            self.connection.queue_status(q_name(queue_name))
        except QueueNotFound:
            raise DramatiqQueueNotFound(queue_name) from None
        self._declared.add(q_name(queue_name))

    def _key(self, message: Message) -> str | None:
        key = message.options.get("partq_key")
        if key is None and message.actor_name in self.actors:
            key = self.actors[message.actor_name].options.get("partq_key")
        if key is not None and not isinstance(key, str):
            raise InvalidConfig(f"partq_key must be a string, not {type(key).__name__}")
        return key

    def _retry_in_place(self, message, delay: int) -> bool:
        if not isinstance(message, PartqMessageProxy) or message.consumer.delayed \
                or message.consumer not in self._consumers.values() or not message.consumer.holds(message):
            return False
        self.emit_before("enqueue", message, delay)
        message.retry_delay = max(0, delay)
        self.emit_after("enqueue", message, delay)
        return True

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        """A consumer of ``queue_name`` (or of its delay queue, ``NAME.DQ``): its own partq
        flow. ``prefetch`` bounds the messages it hands out and not yet settled."""
        delayed = queue_name in self.delay_queues
        if queue_name not in self.queues and not delayed:
            raise DramatiqQueueNotFound(queue_name)
        partq_queue = dq_name(queue_name) if delayed else q_name(queue_name)
        # one consumer (one flow) per queue and process: a worker's consumer thread asks again
        # after a pause, and its threads settle the messages the first one handed out
        with self._lock:
            if self._consumers_pid != os.getpid():     # a forked child: the parent's are not its own
                self._consumers, self._consumers_pid = {}, os.getpid()
            consumer = self._consumers.get(queue_name)
            if consumer is None or consumer.closed:
                # named for this process and broker: a consumer made again (a worker's consumer
                # thread closes it when paused or after an error) gets its partitions back
                name = f"dramatiq-{os.getpid()}-{id(self):x}-{partq_queue}"
                consumer = self._consumers[queue_name] = PartqConsumer(
                    queue_name, lambda: self.connection.bind(partq_queue, name=name), prefetch,
                    timeout, delayed, self._dead_lettered)
            else:
                consumer.prefetch, consumer.timeout = max(1, prefetch), timeout / 1000
            return consumer

    def _dead_lettered(self, queue_name: str, exc: BaseException | None) -> None:
        # the error's type and arguments, not the error (which would keep its frames alive)
        if exc is not None:
            self._dead[q_name(queue_name)].append((type(exc), exc.args))

    @property
    def dead_letters_by_queue(self) -> dict[str, list[MessageProxy]]:
        """The dead-lettered messages of each declared queue, read (not consumed) from its
        ``NAME.XQ`` in the directory; ``partq dead requeue NAME.XQ`` sends them back."""
        store = getattr(self.connection, "store", None)
        if store is None:
            raise InvalidConfig("dead letters are read from the directory: through partq serve, "
                                "inspect NAME.XQ with `partq inspect` on the server")
        from partq.ops.browse import browse
        out: dict[str, list[MessageProxy]] = {}
        for name in sorted({q_name(q) for q in self.queues}):
            rows = browse(store, xq_name(name), limit=0)
            out[name] = [MessageProxy(Message.decode(r["payload"])) for r in rows
                         if not r["acked"] and not r.get("corrupt")]
        return out

    @property
    def dead_letters(self) -> list[MessageProxy]:
        """The dead-lettered messages of every declared queue (see ``dead_letters_by_queue``)."""
        return [m for messages in self.dead_letters_by_queue.values() for m in messages]

    def get_declared_queues(self) -> set[str]:
        return self.queues.copy()

    def flush(self, queue_name: str) -> None:
        """Drop every message of the queue and of its delay queue: each is deleted and made
        again with its settings. Refused (``partq.DeliveryLocked``) while a process other than
        this one runs the queue's delivery; through ``partq serve``, refused."""
        conn = self.connection
        if not hasattr(conn, "delete_queue"):
            raise InvalidConfig("flush needs the queues' directory: partq serve's client "
                                "deletes no queues")
        canonical = q_name(queue_name)
        for name in (canonical, dq_name(canonical)):
            try:
                config = conn.queue_config(name)
            except QueueNotFound:
                continue
            settings = {k: v for k, v in config.to_dict().items() if k in USER_SETTABLE}
            conn.delete_queue(name)
            conn.create_queue(name, config.partitions, exist_ok=True, **settings)
        self._dead.pop(canonical, None)

    def flush_all(self) -> None:
        for name in {q_name(q) for q in self.queues}:
            self.flush(name)
        self._dead.clear()

    def join(self, queue_name: str, *, interval: int = 20, timeout: int | None = None,
             fail_fast: bool | None = None) -> None:
        """Wait until the queue and its delay queue hold no message that is not acked (a
        message given back, delayed or waiting out a retry counts). ``fail_fast`` (default
        ``fail_fast_default``): raise the error of a message a worker of this process
        dead-lettered. Raises ``QueueJoinTimeout`` after ``timeout`` ms."""
        canonical = q_name(queue_name)
        if canonical not in {q_name(q) for q in self.queues}:
            raise DramatiqQueueNotFound(queue_name)
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        quiet = 0
        while quiet < 2:     # empty twice running: a message moving between the two is seen
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            depths = [self.connection.queue_status(n).depth for n in (dq_name(canonical), canonical)]
            quiet = quiet + 1 if not any(depths) else 0
            if quiet < 2:
                time.sleep(interval / 1000)
        if fail_fast if fail_fast is not None else self.fail_fast_default:
            for error_type, args in self._dead.get(canonical, ()):
                raise _rebuilt(error_type, args)

    def close(self) -> None:
        """Close the consumers and the directory or connection."""
        with self._lock:
            mine = self._consumers_pid == os.getpid()
            consumers, self._consumers = list(self._consumers.values()) if mine else [], {}
        with self._conn_lock:
            conn, self._conn = self._conn, None
        for consumer in consumers:
            consumer.close()
        if conn is not None and self._conn_pid == os.getpid():
            conn.close()


def _rebuilt(error_type: type, args: tuple) -> BaseException:
    try:
        return error_type(*args)
    except Exception:
        return RuntimeError(f"a message was dead-lettered with {error_type.__name__}{args!r}")
