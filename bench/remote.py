"""partq reached over a socket, beside Redis Streams, RabbitMQ, NATS JetStream and a reference server.

Lines (JSON, one per result; ``ratio`` is the median of interleaved pairs, with its min-max). Every
socket line: 256-byte payloads, batches of 100, 1 and 4 client processes (``{n}``), each client
process its own connection; a line carries ``durability`` (what a reply guarantees) and
``peer_version``. partq's figure is the same in all the lines of one ``{n}`` (one set of slices).

* ``remote_publish_pipelined_100_{n}_clients``: client processes publishing through
  ``partq serve`` (``publish_async`` 100 at a time, then waiting for all: durable on return)
  beside ``redis_xadd_pipeline_100_{n}_clients`` (a pipeline of 100 XADD per round trip, Redis
  with ``appendfsync always``: equal durability), the same number of client processes.
* ``remote_consume_ack_100_{n}_clients``: ``receive(100)`` + ``ack_many`` through the server
  beside ``redis_xreadgroup_xack_100_{n}_clients`` (XREADGROUP COUNT 100 + XACK), the same
  number of client processes, each with its own consumer name.
* ``remote_{publish_pipelined,consume_ack}_100_{n}_clients_vs_rabbitmq``: the same partq figures
  beside RabbitMQ (Debian's rabbitmq-server, started here on loopback, bench/brokers.py), a
  durable quorum queue per slice: ``rabbitmq_quorum_publish_confirm_100_{n}_clients`` publishes
  100 in confirm mode and waits for their 100 confirms; ``rabbitmq_quorum_consume_ack_100_{n}_
  clients`` consumes with manual acks, prefetch 100, one ``basic_ack(multiple=True)`` per 100.
  Durability equal for publishes: a quorum queue fdatasyncs its Ra WAL before it confirms
  (strace: each confirm leaves after an fdatasync of the WAL). Its acks are logged too, but an
  AMQP ack has no reply: the consumer does not wait for it (the next 100 do, prefetch 100).
* ``remote_{publish_pipelined,consume_ack}_100_{n}_clients_vs_nats``: beside NATS JetStream
  (Debian's nats-server 2.9, ``-js``, loopback), a file-storage stream per slice:
  ``nats_jetstream_publish_100_{n}_clients`` sends 100 ``publish_async`` and gathers their 100
  acks; ``nats_jetstream_fetch_ack_100_{n}_clients`` fetches 100 from a durable pull consumer
  shared by the clients, ``ack()`` each, then one ``flush()`` (a PING round trip: the server has
  the acks). NOT equal durability: no fsync per publish (the 2.9 file store syncs every 2
  minutes; strace saw no fsync/fdatasync at all during publishes and consumes).
* ``remote_publish_many_100_{n}_clients_vs_reference``: partq serve's clients calling
  ``publish_many`` of 100 (one request, all or nothing), beside the same reference figure: the
  same client loop on both sides. The ``publish_pipelined`` line beside it keeps partq's
  ``publish_async`` loop (each message alone), which costs its client more CPU per 100.
* ``reference_{publish_pipelined,consume_ack}_100_{n}_clients``: bench/reference_server.py, the
  least a server over the public ``partq.Broker`` API does (one thread per connection, one
  request and one reply per batch: ``publish_many`` of 100; ``receive(100)`` with the previous
  batch's ``ack_many`` riding on the request): the limit of partq serve's socket path, same
  broker, same durability. ``remote_..._{n}_clients_vs_reference`` puts partq serve beside it
  (ratio partq / reference; target 0.95).
* ``remote_{publish_many,consume_ack}_100_{n}_clients_vs_in_process``: partq serve's
  ``publish_many`` and consume clients beside the same loops in client processes that open the
  directory themselves (``in_process_{publish_many,consume_ack}_100_{n}_clients``, durability
  equal): what the socket costs. Target 0.85 with 1 client; with 4, three of the in-process
  processes are served by the first (peer flows), so that line is context.
* ``local_consume_ack_2_processes``: two processes binding one directory (the second served by
  the first, rule `peer-flows`), beside ``local_consume_ack_1_process``: context, no target.
  Each process commits its own acks, and the directory has one write lock (rule
  `one-write-lock`), so two processes on two cores do about 1.3x what one does.
* ``owner_failover``: SIGKILL of the process that owns delivery to the first message received
  by the surviving consumer process (median of the pairs).

A server that is not installed (redis-server, rabbitmq-server, nats-server, or their Python
clients: the ``bench`` extra) or fails makes its figure ``peer_skipped`` with the reason; partq's
figure is still measured. Every server is started on 127.0.0.1 on free ports in a temp folder
and stopped at the end, also on errors, Ctrl-C and SIGTERM.

Method: every pair runs partq then each peer, slice after slice (``--pairs``, 7 by default), each
side warmed first; the ratio of each pair is reported as the median with its min and max; the
first line, ``load_average_at_start``, carries the load average and CPU count. Client processes
start and connect before a slice, then all start together. A consume slice drains a fresh queue
(stream) pre-filled untimed with ``--prefill`` messages, or stops after ``--seconds``.

    .venv/bin/python bench/remote.py [--quick] [--only sockets]
        [--sides redis,rabbitmq,nats,reference,in_process]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from brokers import die_with_parent  # noqa: E402
from method import DEFAULT_PAIRS, emit, header, line, log, pairs_line  # noqa: E402
from peers import Skip  # noqa: E402
from remote_sides import (  # noqa: E402
    InProcessSide,
    NatsSide,
    RabbitMQSide,
    RedisSide,
    ReferenceSide,
    Side,
    consume_queue,
    run_clients,
    settled,
)

import partq  # noqa: E402

PAYLOAD = b"x" * 256
TOKEN = "bench-token-" + "0" * 32
PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")


# ---------------------------------------------------------------------------- client workers
def _partq_publisher(address: str, ready, go, out, seconds: float, many: bool = False) -> None:
    """``publish_async`` 100 at a time, then waiting for all; with ``many``, ``publish_many`` of
    100 per request, as the reference server's clients publish."""
    client = partq.connect(address, token=TOKEN)
    ready.release()
    go.wait()
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        if many:
            client.publish_many("bench", [(PAYLOAD, f"k{n + i}") for i in range(100)])
        else:
            pending = [client.publish_async("bench", PAYLOAD, key=f"k{n + i}")
                       for i in range(100)]
            for p in pending:
                p.result()
        n += 100
    out.put(n)
    client.close()


def _consume(flow, seconds: float) -> tuple[int, float]:
    """receive(100) + ack_many for ``seconds`` or until the flow's partitions are drained:
    (messages acked, when the last batch was acked)."""
    n, last, end = 0, time.monotonic(), time.monotonic() + seconds
    while time.monotonic() < end:
        msgs = flow.receive(100, timeout=0.2)
        if not msgs:
            if flow.partitions:
                break           # drained
            continue
        try:
            flow.ack_many(msgs)
        except partq.FlowFenced as exc:     # a partition moved meanwhile: count what acked
            n -= len(exc.messages)
        n += len(msgs)
        last = time.monotonic()
    return n, last


def _partq_consumer(address: str, ready, go, out, seconds: float, queue: str) -> None:
    client = partq.connect(address, token=TOKEN)
    flow = client.bind(queue)
    ready.release()
    go.wait()
    out.put(_consume(flow, seconds))
    client.close()


def _local_publisher(data: str, ready, go, out, seconds: float) -> None:
    """``publish_many`` of 100 by a process that opened the directory itself: the in-process
    figure beside partq serve's ``publish_many`` clients."""
    broker = partq.Broker.open(data)
    ready.release()
    go.wait()
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        broker.publish_many("bench", [(PAYLOAD, f"k{n + i}") for i in range(100)])
        n += 100
    out.put(n)
    broker.close()


def _local_consumer(data: str, ready, go, out, seconds: float, queue: str, name: str) -> None:
    broker = partq.Broker.open(data)
    flow = broker.bind(queue, name=name)
    ready.release()
    go.wait()
    out.put(_consume(flow, seconds))
    broker.close()


# ---------------------------------------------------------------------------- the server side
class PartqServe:
    def __init__(self, root: str) -> None:
        self.data = os.path.join(root, "serve-data")
        token = os.path.join(root, "token")
        with open(token, "w") as f:
            f.write(TOKEN + "\n")
        with partq.Broker.open(self.data) as broker:
            broker.create_queue("bench", partitions=8)
        self.proc = subprocess.Popen([PARTQ, "--data", self.data, "serve", "--listen",
                                      "127.0.0.1:0", "--token-file", token, "--json",
                                      "--log-level", "warning"],
                                     stdout=subprocess.PIPE, text=True,
                                     preexec_fn=die_with_parent)    # SIGTERM if the bench dies
        self.address = json.loads(self.proc.stdout.readline())["listen"]
        self._queues = 0

    def fresh_queue(self, prefill: int) -> str:
        """A new queue of 8 partitions holding ``prefill`` messages (untimed)."""
        self._queues += 1
        name = f"consume-{self._queues}"
        consume_queue(self.data, name, prefill)
        return name

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


SIDES = ("redis", "rabbitmq", "nats", "reference", "in_process")


# ---------------------------------------------------------------------------- the benches
def remote_vs_peers(root: str, pairs: int, seconds: float, prefill: int,
                    names: tuple[str, ...] = SIDES) -> None:
    """partq serve beside each side, slice after slice (partq, then every side, publishing;
    then the same consuming), ``pairs`` rounds after a warm-up round, 1 then 4 clients. The
    reference and the in-process side run right after partq: their ratios have the tightest
    targets."""
    every: dict[str, Callable[[], Side]] = {
        "redis": RedisSide, "rabbitmq": RabbitMQSide, "nats": NatsSide,
        "reference": lambda: ReferenceSide(root),
        "in_process": lambda: InProcessSide(root, _local_publisher, _local_consumer)}
    sides = [every[name]() for name in names]
    run_order = sorted(sides, key=lambda s: s.key not in ("reference", "in_process"))
    serve = PartqServe(root)
    failed: dict[str, str] = {}
    try:
        for side in sides:
            try:
                side.start()
            except Skip as exc:
                failed[side.key] = str(exc)
                log("remote", f"{side.key} skipped: {exc}")
        for n in (1, 4):
            pub: dict[str, list[float]] = {s.key: [] for s in sides}
            con: dict[str, list[float]] = {s.key: [] for s in sides}
            pub["partq"], con["partq"] = [], []
            many: list[float] = []      # partq's publish_many, beside the reference's
            for i in range(pairs + 1):            # the first round warms every side
                for kind, into in (("publish", pub), ("consume", con)):
                    if kind == "publish":
                        rate = run_clients(_partq_publisher, [(serve.address,)] * n, seconds)
                    else:
                        queue = serve.fresh_queue(prefill)
                        rate = run_clients(_partq_consumer, [(serve.address, queue)] * n,
                                           seconds, settle=lambda q=queue, k=n:
                                           settled(serve.data, q, k))
                    if i:
                        into["partq"].append(rate)
                    if kind == "publish" and ("reference" in names or "in_process" in names):
                        rate = run_clients(_partq_publisher, [(serve.address, True)] * n, seconds)
                        if i:
                            many.append(rate)
                    for side in run_order:
                        if side.key in failed:
                            continue
                        try:
                            rate = (side.publish(n, seconds) if kind == "publish"
                                    else side.consume(n, seconds, prefill))
                        except Exception as exc:  # a peer's failure is a result to report
                            failed[side.key] = f"failed: {type(exc).__name__}: {exc}"
                            log("remote", f"{side.key} failed in round {i}: {exc!r}")
                            continue
                        if i:
                            into[side.key].append(rate)
            for side in sides:
                target = side.target if n in side.target_clients else None
                for samples, peer, mine in ((pub, side.pub_line, side.partq_pub),
                                            (con, side.con_line, side.partq_con)):
                    peer, mine = peer.format(n=n), mine.format(n=n)
                    theirs = failed.get(side.key) or samples[side.key]
                    ours = many if samples is pub and side.publish_many else samples["partq"]
                    version = "" if isinstance(theirs, str) else side.version
                    if side.own_lines:            # the side's figure is a line of its own
                        emit(line(peer, "msgs/s", theirs, digits=3, durability=side.durability,
                                  version=version))
                    emit(line(mine, "msgs/s", ours, peer, theirs, target=target,
                              digits=3, durability=side.durability, peer_version=version))
                if side.key == "reference":     # like for like: publish_many on both
                    emit(line(f"remote_publish_many_100_{n}_clients_vs_reference", "msgs/s",
                              many, side.pub_line.format(n=n),
                              failed.get(side.key) or pub[side.key], target=target,
                              digits=3, durability=side.durability, peer_version=side.version))
    finally:
        for side in reversed(sides):
            side.stop()
        serve.stop()


def local_processes(root: str, pairs: int, seconds: float, prefill: int) -> None:
    data = os.path.join(root, "local-data")
    two, one = [], []
    for i in range(pairs + 1):
        for procs, into in ((2, two), (1, one)):
            queue = f"local-{i}-{procs}"
            with partq.Broker.open(data) as broker:
                broker.create_queue(queue, partitions=8, rebalance_delay=0.2,
                                    max_handoff_time=0.2)
                for start in range(0, prefill, 1000):
                    broker.publish_many(queue, [(PAYLOAD, f"k{j}") for j in
                                                range(start, min(start + 1000, prefill))])
            rate = run_clients(_local_consumer, [(data, queue, f"c{j}") for j in range(procs)],
                               seconds, settle=lambda q=queue, k=procs: settled(data, q, k))
            if i:
                into.append(rate)
    emit(pairs_line("local_consume_ack_2_processes", "msgs/s", "local_consume_ack_1_process",
                    two, one))


def _survivor(data: str, out, started) -> None:
    broker = partq.Broker.open(data)
    flow = broker.bind("failover", name="survivor")
    started.set()
    while True:
        msgs = flow.receive(100, timeout=0.05)
        if msgs:
            out.put(time.monotonic())
            flow.ack_many(msgs)
            return


def _owner(data: str, started) -> None:
    broker = partq.Broker.open(data)
    flow = broker.bind("failover", name="owner")
    started.set()
    while True:
        msgs = flow.receive(100, timeout=0.5)
        if msgs:
            flow.ack_many(msgs)


def failover(root: str, pairs: int) -> None:
    times = []
    ctx = mp.get_context("spawn")
    for i in range(pairs):
        data = os.path.join(root, f"failover-{i}")
        with partq.Broker.open(data) as broker:
            broker.create_queue("failover", partitions=4, rebalance_delay=0.5,
                                max_handoff_time=0.2, consumer_timeout=2.0)
        owner_up, survivor_up, out = ctx.Event(), ctx.Event(), ctx.Queue()
        owner = ctx.Process(target=_owner, args=(data, owner_up))
        owner.start()
        owner_up.wait(60)
        survivor = ctx.Process(target=_survivor, args=(data, out, survivor_up))
        survivor.start()
        survivor_up.wait(60)
        with partq.Broker.open(data) as broker:       # the survivor holds no partition yet
            deadline = time.monotonic() + 30
            while broker.queue_status("failover").rebalance_status != "Ready":
                if time.monotonic() > deadline:
                    raise RuntimeError("the two consumers did not settle")
                time.sleep(0.02)
            keys = {partq.key_partition(f"k{j}", 4): f"k{j}" for j in range(100)}
            owned = [f.partitions for f in broker.queue_status("failover").flows
                     if f.name == "owner"][0]
            os.kill(owner.pid, signal.SIGKILL)
            t_kill = time.monotonic()
            broker.publish("failover", PAYLOAD, key=keys[owned[0]])   # a partition it held
        t_first = out.get(timeout=60)
        times.append(t_first - t_kill)
        owner.join(10)
        survivor.join(10)
    emit({"name": "owner_failover", "unit": "s", "value": round(statistics.median(times), 3),
          "min": round(min(times), 3), "max": round(max(times), 3), "runs": len(times),
          "note": "SIGKILL of the delivery owner to the first message of one of its partitions "
                  "received by the surviving process (rebalance_delay 0.5 s)"})


def _terminated(signum, _frame) -> None:
    raise SystemExit(128 + signum)      # SIGTERM: unwind, so that every server is stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--pairs", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="seconds per slice")
    parser.add_argument("--prefill", type=int, default=None, help="messages per consume slice")
    parser.add_argument("--only", choices=("all", "sockets"), default="all",
                        help="sockets: only the lines of partq serve beside its peers")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help=f"the peers beside partq serve, of {','.join(SIDES)}")
    args = parser.parse_args(argv)
    names = tuple(s for s in args.sides.split(",") if s)
    if set(names) - set(SIDES):
        parser.error(f"unknown sides {sorted(set(names) - set(SIDES))}")
    pairs = args.pairs or (1 if args.quick else DEFAULT_PAIRS)
    seconds = args.seconds or (0.5 if args.quick else 2.0)
    prefill = args.prefill or (3_000 if args.quick else 100_000)
    signal.signal(signal.SIGTERM, _terminated)
    emit(header("remote", pairs, slice_seconds=seconds))
    root = tempfile.mkdtemp(prefix="partq-bench-remote-")
    try:
        remote_vs_peers(root, pairs, seconds, prefill, names)
        if args.only == "all":
            local_processes(root, pairs, seconds, prefill)
            failover(root, pairs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
