"""The peers bench/remote.py runs beside ``partq serve``: Redis Streams, RabbitMQ, NATS JetStream
and the reference server (bench/reference_server.py), each a side of the interleaved pairs.

A side has ``start()`` (raises ``Skip`` with the reason when it cannot run here), ``stop()``,
``publish(n, seconds)`` and ``consume(n, seconds, prefill)``, each a rate in msgs/s from ``n``
client processes started by ``run_clients`` (partq serve's too), and the names of its lines:
``pub_line`` / ``con_line`` (its own figure, ``{n}`` the number of client processes) and
``partq_pub`` / ``partq_con`` (partq serve's figure beside it). ``own_lines``: its figure is also
a line of its own, printed before the comparison. ``durability`` says what a reply guarantees.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from queue import Empty
from typing import Protocol

import brokers
import reference_server
from brokers import PAYLOAD, NatsServer, RabbitMQServer
from peers import RedisServer

import partq


def run_clients(target, args_list: list[tuple], seconds: float, settle=None) -> float:
    """Start one process per args, wait until all are ready (and ``settle()`` returns: the
    consumers' partitions assigned), start them together; return the total messages per
    second: over the slice for publishers (they report a count), from the start to the last
    ack for consumers (they report the count and the time of their last ack)."""
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args[:1], ready, go, out, seconds, *args[1:]))
             for args in args_list]
    for p in procs:
        p.start()
    give_up = time.monotonic() + 60
    for _ in procs:
        while not ready.acquire(timeout=0.2):
            dead = [p.exitcode for p in procs if p.exitcode is not None]
            if dead or time.monotonic() > give_up:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"client processes exited with {dead} before they were ready"
                                   if dead else "client processes were not ready within 60 s")
    if settle is not None:
        settle()
    t0 = time.monotonic()
    go.set()
    results: list = []
    give_up = time.monotonic() + seconds + 120
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=0.2))
        except Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > give_up:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"client processes exited with {dead} (see stderr)" if dead
                                   else "client processes did not report in time") from None
    elapsed = time.monotonic() - t0
    for p in procs:
        p.join(timeout=30)
    if results and isinstance(results[0], tuple):
        return sum(n for n, _ in results) / max(max(t for _, t in results) - t0, 1e-9)
    return sum(results) / elapsed


def settled(data: str, queue: str, flows: int) -> None:
    """Wait until ``flows`` flows hold the queue's partitions, rebalancing Ready."""
    deadline = time.monotonic() + 60
    with partq.Broker.open(data) as broker:
        while True:
            st = broker.queue_status(queue)
            if st.rebalance_status == "Ready" and sum(1 for f in st.flows if f.active) == flows:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{flows} consumers of {queue} did not settle")
            time.sleep(0.02)


def consume_queue(data: str, name: str, prefill: int) -> None:
    """Create queue ``name`` of 8 partitions in ``data`` holding ``prefill`` keyed messages
    (untimed): what every consume slice of partq serve and of the reference server drains."""
    with partq.Broker.open(data) as broker:
        broker.create_queue(name, partitions=8, rebalance_delay=0.2, max_handoff_time=0.2)
        for start in range(0, prefill, 1000):
            broker.publish_many(name, [(PAYLOAD, f"k{i}")
                                       for i in range(start, min(start + 1000, prefill))])


class ServerSide:
    """A side whose server object starts, stops and tells its version."""

    server: RabbitMQServer | NatsServer

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    @property
    def version(self) -> str:
        return self.server.version


class Side(Protocol):
    key: str
    pub_line: str
    con_line: str
    partq_pub: str
    partq_con: str
    own_lines: bool
    target: float | None
    target_clients: tuple[int, ...]     # the client counts ``target`` is for
    publish_many: bool      # partq's figure beside it is publish_many's, not publish_async's
    durability: str

    @property
    def version(self) -> str: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def publish(self, n: int, seconds: float) -> float: ...
    def consume(self, n: int, seconds: float, prefill: int) -> float: ...


# ---------------------------------------------------------------------------- Redis
def redis_publisher(port: int, ready, go, out, seconds: float, stream: str) -> None:
    import redis
    r = redis.Redis(host="127.0.0.1", port=port)
    ready.release()
    go.wait()
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        pipe = r.pipeline(transaction=False)
        for _ in range(100):
            pipe.xadd(stream, {"p": PAYLOAD})
        pipe.execute()
        n += 100
    out.put(n)


def redis_consumer(port: int, ready, go, out, seconds: float, stream: str, me: str) -> None:
    import redis
    r = redis.Redis(host="127.0.0.1", port=port)
    ready.release()
    go.wait()
    n, last, end = 0, time.monotonic(), time.monotonic() + seconds
    while time.monotonic() < end:
        got = r.xreadgroup("g", me, {stream: ">"}, count=100)
        ids = [mid for mid, _ in got[0][1]] if got else []
        if not ids:
            break
        r.xack(stream, "g", *ids)
        n += len(ids)
        last = time.monotonic()
    out.put((n, last))


def fresh_stream(redis_server: RedisServer, prefill: int, tag: str) -> str:
    r = redis_server.client
    name = f"bench-{tag}-{time.monotonic_ns()}"
    for start in range(0, prefill, 1000):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(1000, prefill - start)):
            pipe.xadd(name, {"p": PAYLOAD})
        pipe.execute()
    if prefill:
        r.xgroup_create(name, "g", id="0")
    return name


class RedisSide:
    """Redis Streams (bench/peers.py's RedisServer: AOF with ``appendfsync always``)."""
    key = "redis"
    pub_line = "redis_xadd_pipeline_100_{n}_clients"
    con_line = "redis_xreadgroup_xack_100_{n}_clients"
    partq_pub = "remote_publish_pipelined_100_{n}_clients"
    partq_con = "remote_consume_ack_100_{n}_clients"
    own_lines = False
    target_clients: tuple[int, ...] = (1, 4)
    publish_many = False
    target: float | None = 2.0
    durability = "equal: appendfsync always, the AOF is fdatasynced before the replies are sent"

    def __init__(self) -> None:
        self.server = RedisServer()

    def start(self) -> None:
        self.server.start()
        self.port = self.server.client.connection_pool.connection_kwargs["port"]

    def stop(self) -> None:
        self.server.stop()

    @property
    def version(self) -> str:
        return self.server.version.split(" sha")[0]

    def publish(self, n: int, seconds: float) -> float:
        stream = fresh_stream(self.server, 0, "pub")
        try:
            return run_clients(redis_publisher, [(self.port, stream)] * n, seconds)
        finally:
            self.server.client.delete(stream)

    def consume(self, n: int, seconds: float, prefill: int) -> float:
        stream = fresh_stream(self.server, prefill, "con")
        try:
            return run_clients(redis_consumer, [(self.port, stream, f"c{j}") for j in range(n)],
                               seconds)
        finally:
            self.server.client.delete(stream)


# ---------------------------------------------------------------------------- RabbitMQ
class RabbitMQSide(ServerSide):
    key = "rabbitmq"
    pub_line = "rabbitmq_quorum_publish_confirm_100_{n}_clients"
    con_line = "rabbitmq_quorum_consume_ack_100_{n}_clients"
    partq_pub = "remote_publish_pipelined_100_{n}_clients_vs_rabbitmq"
    partq_con = "remote_consume_ack_100_{n}_clients_vs_rabbitmq"
    own_lines = False
    target_clients: tuple[int, ...] = ()
    publish_many = False
    target: float | None = None
    durability = ("equal for publishes: a durable quorum queue (one Ra member) fdatasyncs its "
                  "WAL before it confirms (checked with strace on beam.smp: about 3 fdatasyncs "
                  "per confirmed batch of 100, each confirm sent after an fdatasync of the WAL "
                  "returned); acks go to the same log, but an AMQP ack has no reply")

    def __init__(self) -> None:
        self.server, self._queues = RabbitMQServer(), 0

    def _queue(self, tag: str) -> str:
        self._queues += 1
        name = f"bench-{tag}-{self._queues}"
        self.server.declare(name)
        return name

    def publish(self, n: int, seconds: float) -> float:
        queue = self._queue("pub")
        try:
            return run_clients(brokers.rabbit_publisher, [(self.server.port, queue)] * n, seconds)
        finally:
            self.server.delete(queue)

    def consume(self, n: int, seconds: float, prefill: int) -> float:
        queue = self._queue("con")
        try:
            brokers.rabbit_publish(self.server.port, queue, 1000, total=prefill)   # untimed
            return run_clients(brokers.rabbit_consumer, [(self.server.port, queue)] * n, seconds)
        finally:
            self.server.delete(queue)


# ---------------------------------------------------------------------------- NATS
class NatsSide(ServerSide):
    key = "nats"
    pub_line = "nats_jetstream_publish_100_{n}_clients"
    con_line = "nats_jetstream_fetch_ack_100_{n}_clients"
    partq_pub = "remote_publish_pipelined_100_{n}_clients_vs_nats"
    partq_con = "remote_consume_ack_100_{n}_clients_vs_nats"
    own_lines = False
    target_clients: tuple[int, ...] = ()
    publish_many = False
    target: float | None = None
    durability = ("no fsync per publish: not equal durability (JetStream 2.9 file store: a "
                  "publish ack means written to the OS, synced every 2 min; checked with strace: "
                  "no fsync/fdatasync in nats-server during the publishes)")

    def __init__(self) -> None:
        self.server, self._streams = NatsServer(), 0

    def _stream(self, tag: str, prefill: int, consumer: bool) -> str:
        self._streams += 1
        name = f"bench-{tag}-{self._streams}"
        self.server.run(brokers.nats_add_stream, name, prefill, consumer)    # untimed
        return name

    def publish(self, n: int, seconds: float) -> float:
        stream = self._stream("pub", 0, False)
        try:
            return run_clients(brokers.nats_publisher, [(self.server.port, stream)] * n, seconds)
        finally:
            self.server.run(brokers.nats_delete_stream, stream)

    def consume(self, n: int, seconds: float, prefill: int) -> float:
        stream = self._stream("con", prefill, True)
        try:
            return run_clients(brokers.nats_consumer, [(self.server.port, stream)] * n, seconds)
        finally:
            self.server.run(brokers.nats_delete_stream, stream)


# ---------------------------------------------------------------------------- reference
class ReferenceSide:
    key = "reference"
    pub_line = "reference_publish_pipelined_100_{n}_clients"
    con_line = "reference_consume_ack_100_{n}_clients"
    partq_pub = "remote_publish_pipelined_100_{n}_clients_vs_reference"
    partq_con = "remote_consume_ack_100_{n}_clients_vs_reference"
    own_lines = True
    target_clients: tuple[int, ...] = (1, 4)
    publish_many = False
    target: float | None = 0.95
    durability = ("equal: the same partq Broker (durability sync) behind both servers; the "
                  "reference replies to a batch once publish_many / ack_many returned")
    version = "bench/reference_server.py"

    def __init__(self, root: str) -> None:
        self.server = reference_server.ReferenceServer(os.path.join(root, "reference-data"))
        self._queues = 0

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def publish(self, n: int, seconds: float) -> float:
        return run_clients(reference_server.ref_publisher,
                           [(self.server.address, "bench", PAYLOAD)] * n, seconds)

    def consume(self, n: int, seconds: float, prefill: int) -> float:
        """A fresh queue of 8 partitions, as partq serve's (rebalance settled before the slice)."""
        self._queues += 1
        queue, data = f"consume-{self._queues}", self.server.data
        consume_queue(data, queue, prefill)
        return run_clients(reference_server.ref_consumer,
                           [(self.server.address, queue, f"c{j}") for j in range(n)], seconds,
                           settle=lambda: settled(data, queue, n))


# ---------------------------------------------------------------------------- in-process
class InProcessSide:
    """partq without a socket: each client process opens the directory itself (its own
    ``Broker``) and runs the same loop as a ``partq.connect`` client (``publisher`` and
    ``consumer``: remote.py's workers), ``publish_many`` of 100 and ``receive(100)`` +
    ``ack_many``. One client is the line the socket path is held to; with 4, the other three
    processes are served by the first (peer flows): context, no target."""
    key = "in_process"
    pub_line = "in_process_publish_many_100_{n}_clients"
    con_line = "in_process_consume_ack_100_{n}_clients"
    partq_pub = "remote_publish_many_100_{n}_clients_vs_in_process"
    partq_con = "remote_consume_ack_100_{n}_clients_vs_in_process"
    own_lines = True
    target: float | None = 0.85
    target_clients = (1,)
    publish_many = True
    durability = ("equal: the same partq Broker (durability sync), opened by the client process "
                  "itself instead of reached through partq serve")

    def __init__(self, root: str, publisher, consumer) -> None:
        self.data = os.path.join(root, "in-process-data")
        self._publisher, self._consumer = publisher, consumer
        self._queues = 0

    def start(self) -> None:
        with partq.Broker.open(self.data) as broker:
            broker.create_queue("bench", partitions=8)

    def stop(self) -> None:
        pass

    @property
    def version(self) -> str:
        return f"partq {partq.__version__}"

    def publish(self, n: int, seconds: float) -> float:
        return run_clients(self._publisher, [(self.data,)] * n, seconds)

    def consume(self, n: int, seconds: float, prefill: int) -> float:
        self._queues += 1
        queue = f"consume-{self._queues}"
        consume_queue(self.data, queue, prefill)
        return run_clients(self._consumer, [(self.data, queue, f"c{j}") for j in range(n)],
                           seconds, settle=lambda: settled(self.data, queue, n))
