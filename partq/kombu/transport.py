"""The kombu transport: kombu's virtual channel over partq queues and flows.

The storage verbs map onto partq's: ``_put`` is a publish (durable when it returns), ``_get`` a
receive of one message from the channel's flow of that queue, ``_size`` a depth, ``_purge`` acks
of what no consumer holds, ``_delete`` a queue deletion. Acks, rejects and restores are the QoS's
(``partq.kombu.qos``). Exchange bindings are stored in partq (``partq.kombu.names``), so direct,
topic and fanout exchanges route alike in every process: Celery's remote control (broadcasts to
every worker's pidbox queue, replies to the caller's queue) works across processes and hosts.
"""
from __future__ import annotations

import heapq
import logging
import os
from queue import Empty
from time import monotonic, sleep
from typing import TYPE_CHECKING, Any

from kombu.exceptions import ChannelError
from kombu.transport import virtual
from kombu.transport.base import to_rabbitmq_queue_arguments
from kombu.utils.json import dumps, loads
from kombu.utils.uuid import uuid

from partq.errors import BrokerClosed, FlowClosed, PartqError, QueueNotFound, ServerUnavailable
from partq.kombu import names
from partq.kombu.backend import open_backend
from partq.kombu.qos import QoS

if TYPE_CHECKING:
    from partq.flow import Flow

log = logging.getLogger("partq.kombu")

# What a queue declared through kombu is created with (transport option ``queue_options`` adds
# to and overrides these, ``partitions`` sets the partition count): "key" ordering so that a
# requeue gives back only the message requeued (unkeyed messages have no order among themselves
# and hold nothing back); no rebalance delay, since a Celery worker that restarts binds anew; no
# max_poll_interval, since a worker whose prefetch is full does not receive while its tasks run.
QUEUE_DEFAULTS = {"ordering": "key", "rebalance_delay": 0.0, "max_poll_interval": 0.0}
DEFAULT_PORT = 7020     # partq serve's port in the docs' examples
GET_MANY = 100       # messages one drain delivers at most (fewer when the prefetch count says so)


def _merged(tasks: list, control: list) -> list:
    """``tasks`` in their order (priority, then publish order) with ``control`` in its order,
    each before the first task published after it."""
    out: list = []
    i = 0
    for task in tasks:
        while i < len(control) and control[i][0] <= task[0]:
            out.append(control[i])
            i += 1
        out.append(task)
    return out + control[i:]


class Channel(virtual.Channel):
    """One kombu channel: a flow per partq queue it consumes from, bound on first use."""

    QoS = QoS
    supports_fanout = True
    # kombu types the base class's pair as exactly two names
    from_transport_options = ("body_encoding", "deadletter_queue",  # type: ignore[assignment]
                              "partitions", "queue_options")
    partitions = 1
    queue_options: dict = {}      # noqa: RUF012 (kombu sets it per channel from transport options)

    def __init__(self, connection, **kwargs) -> None:
        super().__init__(connection, **kwargs)
        self.backend = connection.backend
        self._flows: dict[str, Flow] = {}          # partq queue -> its flow
        self._steps: dict[str, list[str]] = {}     # kombu queue -> partq queues, highest first
        self._no_ack: set[str] = set()             # kombu queues consumed without acks
        self._auto_delete: set[str] = set()
        self._rotation = 0                         # the queue _get_many starts with, in turn

    # ------------------------------------------------------------------ queues
    def _options(self, arguments: dict | None) -> dict:
        options = {**QUEUE_DEFAULTS, "partitions": self.partitions, **self.queue_options}
        ttl = (arguments or {}).get("x-message-ttl")
        if ttl:
            options["max_ttl"] = float(ttl) / 1000.0
        return options

    def prepare_queue_arguments(self, arguments, **kwargs) -> dict:
        """``max_priority`` and ``message_ttl`` as RabbitMQ names them (what ``_new_queue`` reads)."""
        return to_rabbitmq_queue_arguments(arguments, **kwargs)

    def _new_queue(self, queue, auto_delete=False, arguments=None, **kwargs) -> None:
        base = names.queue_name(queue)
        options = self._options(arguments)
        self.backend.ensure_queue(base, options)
        if (arguments or {}).get("x-max-priority"):
            for step in names.PRIORITY_STEPS[1:]:
                self.backend.ensure_queue(names.step_queue(base, step), options)
        self._steps.pop(queue, None)
        if auto_delete:
            self._auto_delete.add(queue)

    def _has_queue(self, queue, **kwargs) -> bool:
        return self.backend.has_queue(names.queue_name(queue))

    def _queues_of(self, queue: str) -> list[str]:
        """The partq queues of kombu queue ``queue``, highest priority first."""
        steps = self._steps.get(queue)
        if steps is None:
            base = names.queue_name(queue)
            steps = [names.step_queue(base, s) for s in reversed(names.PRIORITY_STEPS[1:])]
            steps = [q for q in steps if self.backend.has_queue(q)] + [base]
            self._steps[queue] = steps
        return steps

    def _size(self, queue) -> int:
        return sum(self.backend.depth(q) for q in self._queues_of(queue))

    def _purge(self, queue) -> int:
        return sum(self.backend.purge(q, self.qos.positions(q)) for q in self._queues_of(queue))

    def _delete(self, queue, *args, **kwargs) -> None:
        """Per binding kombu knows in this process: ``queue_delete`` does the work."""

    def queue_delete(self, queue, if_unused=False, if_empty=False, **kwargs) -> None:
        if if_empty and self._size(queue):
            return
        super().queue_delete(queue, if_unused=if_unused, if_empty=if_empty, **kwargs)
        for name in self.backend.queue_names():
            parsed = names.parse_binding(name)
            if parsed is not None and parsed[2][2] == queue:
                self.backend.delete_queue(name)
        for q in self._queues_of(queue):
            flow = self._flows.pop(q, None)
            if flow is not None:
                self._unbind(flow)
            self.backend.delete_queue(q)
        self._steps.pop(queue, None)
        self._auto_delete.discard(queue)

    # ------------------------------------------------------------------ exchanges
    def _queue_bind(self, exchange, routing_key, pattern, queue) -> None:
        if not self.backend.creates_queues:      # kept in this process's table only
            return
        name = names.binding_name(self.typeof(exchange).type, exchange, routing_key,
                                  pattern, queue)
        self.backend.ensure_queue(name, {"partitions": 1})

    def queue_unbind(self, queue, exchange=None, routing_key="", arguments=None, **kwargs):
        meta = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        super().queue_unbind(queue, exchange, routing_key, arguments, **kwargs)
        self.backend.delete_queue(names.binding_name(self.typeof(exchange).type, exchange,
                                                     *meta))

    def _bindings(self) -> list[tuple[str, str, tuple[str, str, str]]]:
        return [b for b in map(names.parse_binding, self.backend.queue_names()) if b is not None]

    def get_table(self, exchange):
        """The bindings of ``exchange`` stored in partq, whichever process made them (a
        ``partq serve`` without the admin verbs lists none: then those made here)."""
        table = [member for _, ex, member in self._bindings() if ex == exchange]
        if not table and exchange in self.state.exchanges:
            return self.state.exchanges[exchange]["table"]
        return table

    def typeof(self, exchange, default="direct"):
        """An exchange declared in another process has the type its bindings were stored with."""
        if exchange in self.state.exchanges or not exchange:
            return super().typeof(exchange, default)
        for kind, ex, _ in self._bindings():
            if ex == exchange and kind in self.exchange_types:
                return self.exchange_types[kind]
        return super().typeof(exchange, default)

    def _put_fanout(self, exchange, message, routing_key, **kwargs) -> None:
        for queue in {member[2] for member in self.get_table(exchange)}:
            self._put(queue, message, **kwargs)

    # ------------------------------------------------------------------ messages
    def _put(self, queue, message, **kwargs) -> None:
        base = names.queue_name(queue)
        step = names.priority_step(self._get_message_priority(message))
        target = base
        if step and names.step_queue(base, step) in self._queues_of(queue):
            target = names.step_queue(base, step)
        expiration = message["properties"].get("expiration")
        ttl = float(expiration) / 1000.0 if expiration else None
        payload = dumps(message).encode()
        try:
            self.backend.publish(target, payload, ttl)
        except QueueNotFound:              # as a Redis list, a queue put to comes to be
            self.backend.ensure_queue(base, self._options(None))
            self.backend.publish(base, payload, ttl)

    def _flow(self, name: str):
        flow = self._flows.get(name)
        if flow is None or flow.closed:
            flow = self._flows[name] = self.backend.bind(name)
        return flow

    def _get(self, queue, timeout=None):
        got = self._receive(queue, 1)
        if not got:
            raise Empty()
        return got[0][1]

    def collect(self) -> tuple[list, list]:
        """What the consumed queues have, each as ``(publish time, message, queue)``: a list
        from the queues consumed with acks (tasks) up to the prefetch room, then a list per
        queue consumed without acks (Celery's remote control and events) whatever the prefetch, as a broker's
        broadcasts come to a worker whose prefetch is full. Read in that order, a control
        message published before a task read here is read too (``Transport`` delivers them
        merged)."""
        active = list(self._active_queues)
        tasks: list[tuple[int, dict, str]] = []
        acked = [q for q in active if q not in self._no_ack]
        if acked and self.qos.can_consume():
            room = self.qos.can_consume_max_estimate() or GET_MANY
            start = self._rotation = (self._rotation + 1) % len(acked)
            for queue in acked[start:] + acked[:start]:
                if len(tasks) >= room:
                    break
                tasks += [(t, m, queue) for t, m in self._receive(queue, min(room - len(tasks),
                                                                             GET_MANY))]
        control = [[(t, m, queue) for t, m in self._receive(queue, GET_MANY)]
                   for queue in active if queue in self._no_ack]
        return tasks, [c for c in control if c]

    def _receive(self, queue: str, limit: int) -> list[tuple[int, dict]]:
        """Up to ``limit`` messages of kombu queue ``queue``, higher priorities first, each with
        its publish time."""
        out: list[tuple[int, dict]] = []
        for name in self._queues_of(queue):
            if len(out) >= limit:
                break
            try:
                flow = self._flow(name)
                msgs = flow.receive(limit - len(out), 0)
            except (FlowClosed, QueueNotFound):
                self._flows.pop(name, None)
                continue
            out += [(m.publish_time_ns, self._delivered(queue, flow, m)) for m in msgs]
        return out

    def _delivered(self, queue: str, flow, msg) -> dict:
        message = loads(msg.payload)
        props = message["properties"]
        props["delivery_tag"] = tag = uuid()
        props.setdefault("delivery_info", {})["redelivered"] = msg.redelivered
        message["redelivered"] = msg.redelivered
        if queue in self._no_ack:
            flow.ack_many_async([msg])
        else:
            self.qos.hold(tag, flow, msg)
        return message

    def basic_consume(self, queue, no_ack, callback, consumer_tag, **kwargs):
        if no_ack:
            self._no_ack.add(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_get(self, queue, no_ack=False, **kwargs):
        message = super().basic_get(queue, no_ack, **kwargs)
        if message is not None and no_ack:
            self.qos.ack(message.delivery_tag)
        return message

    def basic_cancel(self, consumer_tag) -> None:
        queue = self._tag_to_queue.get(consumer_tag)
        super().basic_cancel(consumer_tag)
        if queue is None or queue in self._active_queues:
            return
        self._no_ack.discard(queue)
        if queue in self._auto_delete:
            self.queue_delete(queue)
            return
        for name in self._queues_of(queue):     # others may take what this channel no longer takes
            flow = self._flows.get(name)
            if flow is not None and not self.qos.held_by(flow):
                self._unbind(self._flows.pop(name))

    def _unbind(self, flow) -> None:
        try:
            flow.unbind()
        except PartqError as exc:
            log.debug("unbinding %r: %s", flow, exc)

    def close(self) -> None:
        closing = not self.closed
        super().close()              # cancels consumers, nacks what is held (the QoS's restore)
        if closing:
            if self._qos is not None:
                self._qos.settle()
            for flow in self._flows.values():
                self._unbind(flow)
            self._flows.clear()


class Transport(virtual.Transport):
    """``partq:///abs/dir`` (a directory, opened in this process) or ``partq://HOST:PORT``
    (through ``partq serve``; the token as the URL's password or transport option ``token``)."""

    Channel = Channel
    driver_type = driver_name = "partq"
    default_port = None
    polling_interval = 0.05
    connection_errors: tuple = (*virtual.Transport.connection_errors, ServerUnavailable, BrokerClosed,
                         OSError)
    channel_errors: tuple = (*virtual.Transport.channel_errors, ChannelError, PartqError)
    implements = virtual.Transport.implements.extend(
        asynchronous=True, exchange_type=frozenset(["direct", "topic", "fanout"]))

    backend = None
    _waker: tuple[int, int] | None = None     # the event loop's pipe: (read end, write end)

    def establish_connection(self):
        if self.backend is None:
            self.backend = self._open_backend()
        return super().establish_connection()

    def drain_events(self, connection, timeout=None, **kwargs) -> None:
        """Deliver what the channels' queues have (``Channel.drain``), waiting up to ``timeout``
        for some, looking every ``polling_interval``."""
        start = monotonic()
        while True:
            if self.drain():
                return
            left = None if timeout is None else timeout - (monotonic() - start)
            if left is not None and left <= 0:
                raise TimeoutError()
            sleep(self.polling_interval if left is None else min(self.polling_interval, left))

    # ------------------------------------------------------------------ an event loop's
    def register_with_event_loop(self, connection, loop) -> None:
        """Drain from a kombu event loop (Celery's worker: its consumer then never blocks, so
        remote control is answered while every pool process is busy): when an ack frees
        prefetch room (``wake``), after a drain that delivered, and every ``polling_interval``
        (what other processes publish)."""
        if self._waker is None:
            self._waker = os.pipe()
            for fd in self._waker:
                os.set_blocking(fd, False)
        read_end = self._waker[0]

        def on_wake() -> None:
            try:
                while os.read(read_end, 4096):
                    pass
            except (BlockingIOError, OSError):
                pass
            self._drain_once()
        loop.add_reader(read_end, on_wake)
        loop.call_repeatedly(self.polling_interval, self._drain_once)

    def wake(self) -> None:
        """Have the event loop drain soon (any thread: an ack freed prefetch room)."""
        waker = self._waker
        if waker is not None:
            try:
                os.write(waker[1], b"x")
            except (BlockingIOError, OSError):      # full: a wake is pending already
                pass

    def _drain_once(self) -> None:
        if self.drain():
            self.wake()           # there may be more: after the loop's other work

    def drain(self) -> bool:
        """Deliver what every channel's consumed queues have (``Channel.collect``): each
        channel's tasks in their order (priority, then publish), every control message before
        the first task published after it, so a revoke published before a task is seen before
        it, an inspect published after a task after it. Whether any came."""
        tasks: list = []
        control: list = []          # a list per queue, in its order (priority, then publish)
        for channel in list(self.channels):
            got = channel.collect()
            tasks += got[0]
            control += got[1]
        merged = list(heapq.merge(*control, key=lambda item: item[0]))
        for _, message, queue in _merged(tasks, merged):
            self._deliver(message, queue)
        return bool(tasks or control)

    def _open_backend(self):
        client: Any = self.client
        options = client.transport_options
        vhost = (client.virtual_host or "").strip("/")
        path = options.get("path") or ("/" + vhost if vhost else None)
        if path:                  # partq:///abs/dir (kombu may fill in a default host name)
            return open_backend(path, None, None, None, options.get("durability", "sync"))
        if not client.hostname:
            raise ChannelError("partq:// needs a directory (partq:///abs/dir) or HOST:PORT of "
                               "a partq serve")
        address = f"{client.hostname}:{client.port or DEFAULT_PORT}"
        return open_backend(None, address, options.get("token") or client.password or None,
                            options.get("ssl"), "sync")

    def close_connection(self, connection) -> None:
        try:
            super().close_connection(connection)
        finally:
            backend, self.backend = self.backend, None
            if backend is not None:
                backend.close()
            waker, self._waker = self._waker, None
            for fd in waker or ():
                os.close(fd)

    def driver_version(self) -> str:
        import partq
        return partq.__version__
