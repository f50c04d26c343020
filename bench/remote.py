"""partq reached over a socket, beside Redis Streams reached over a socket (consumers issue).

Lines (JSON, one per result; ``ratio`` is the median of interleaved pairs, with its min-max):

* ``remote_publish_pipelined_100_{1,4}_clients``: client processes publishing through
  ``partq serve`` (``publish_async`` 100 at a time, then waiting for all: durable on return)
  beside ``redis_xadd_pipeline_100_{n}_clients`` (a pipeline of 100 XADD per round trip, Redis
  with ``appendfsync always``), the same number of client processes.
* ``remote_consume_ack_100_{1,4}_clients``: ``receive(100)`` + ``ack_many`` through the server
  beside ``redis_xreadgroup_xack_100_{n}_clients`` (XREADGROUP COUNT 100 + XACK), the same
  number of client processes, each with its own consumer name.
* ``local_consume_ack_2_processes``: two processes binding one directory (the second served by
  the first, rule `peer-flows`), beside ``local_consume_ack_1_process``. Target: 1.6x.
* ``owner_failover``: SIGKILL of the process that owns delivery to the first message received
  by the surviving consumer process (median of the pairs).

Method: every pair runs partq then its peer, slice after slice (``--pairs``, 7 by default), each
side warmed first; the ratio of each pair is reported as the median with its min and max; the
first line, ``load_average_at_start``, carries the load average and CPU count. Client processes
start and connect before a slice, then all start together.

    .venv/bin/python bench/remote.py [--quick]
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from method import DEFAULT_PAIRS, emit, header, pairs_line  # noqa: E402
from peers import RedisServer, Skip  # noqa: E402

import partq  # noqa: E402

PAYLOAD = b"x" * 256
TOKEN = "bench-token-" + "0" * 32
PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")


# ---------------------------------------------------------------------------- client workers
def _partq_publisher(address: str, ready, go, out, seconds: float) -> None:
    client = partq.connect(address, token=TOKEN)
    ready.release()
    go.wait()
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        pending = [client.publish_async("bench", PAYLOAD, key=f"k{n + i}") for i in range(100)]
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


def _redis_publisher(port: int, ready, go, out, seconds: float, stream: str) -> None:
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


def _redis_consumer(port: int, ready, go, out, seconds: float, stream: str, me: str) -> None:
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


def _local_consumer(data: str, ready, go, out, seconds: float, queue: str, name: str) -> None:
    broker = partq.Broker.open(data)
    flow = broker.bind(queue, name=name)
    ready.release()
    go.wait()
    out.put(_consume(flow, seconds))
    broker.close()


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
    for _ in procs:
        if not ready.acquire(timeout=60):
            raise RuntimeError("a client process did not get ready within 60 s")
    if settle is not None:
        settle()
    t0 = time.monotonic()
    go.set()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    elapsed = time.monotonic() - t0
    for p in procs:
        p.join(timeout=30)
    if results and isinstance(results[0], tuple):
        return sum(n for n, _ in results) / max(max(t for _, t in results) - t0, 1e-9)
    return sum(results) / elapsed


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
                                     stdout=subprocess.PIPE, text=True)
        self.address = json.loads(self.proc.stdout.readline())["listen"]
        self._queues = 0

    def fresh_queue(self, prefill: int) -> str:
        """A new queue of 8 partitions holding ``prefill`` messages (untimed)."""
        self._queues += 1
        name = f"consume-{self._queues}"
        with partq.Broker.open(self.data) as broker:
            broker.create_queue(name, partitions=8, rebalance_delay=0.2, max_handoff_time=0.2)
            for start in range(0, prefill, 1000):
                broker.publish_many(name, [(PAYLOAD, f"k{i}")
                                           for i in range(start, min(start + 1000, prefill))])
        return name

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


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


# ---------------------------------------------------------------------------- the benches
def remote_vs_redis(root: str, pairs: int, seconds: float, prefill: int) -> None:
    serve = PartqServe(root)
    redis_server = RedisServer()
    try:
        try:
            redis_server.start()
        except Skip as exc:
            for n in (1, 4):
                for name in (f"remote_publish_pipelined_100_{n}_clients",
                             f"remote_consume_ack_100_{n}_clients"):
                    emit({"name": name, "unit": "msgs/s", "value": None, "skipped": str(exc)})
            return
        port = redis_server.client.connection_pool.connection_kwargs["port"]
        for n in (1, 4):
            pub, rpub, con, rcon = [], [], [], []
            for i in range(pairs + 1):            # the first pair warms both sides
                a = run_clients(_partq_publisher, [(serve.address,)] * n, seconds)
                stream = fresh_stream(redis_server, 0, "pub")
                b = run_clients(_redis_publisher, [(port, stream)] * n, seconds)
                queue = serve.fresh_queue(prefill)
                c = run_clients(_partq_consumer, [(serve.address, queue)] * n, seconds,
                                settle=lambda q=queue, k=n: settled(serve.data, q, k))
                stream = fresh_stream(redis_server, prefill, "con")
                d = run_clients(_redis_consumer, [(port, stream, f"c{j}") for j in range(n)],
                                seconds)
                if i:
                    pub.append(a)
                    rpub.append(b)
                    con.append(c)
                    rcon.append(d)
            emit(pairs_line(f"remote_publish_pipelined_100_{n}_clients", "msgs/s",
                            f"redis_xadd_pipeline_100_{n}_clients", pub, rpub, 2.0))
            emit(pairs_line(f"remote_consume_ack_100_{n}_clients", "msgs/s",
                            f"redis_xreadgroup_xack_100_{n}_clients", con, rcon, 2.0))
    finally:
        redis_server.stop()
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
                    two, one, 1.6))


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--pairs", type=int, default=None)
    args = parser.parse_args(argv)
    pairs = args.pairs or (1 if args.quick else DEFAULT_PAIRS)
    seconds = 0.5 if args.quick else 2.0
    prefill = 3_000 if args.quick else 100_000
    emit(header("remote", pairs, slice_seconds=seconds))
    root = tempfile.mkdtemp(prefix="partq-bench-remote-")
    try:
        remote_vs_redis(root, pairs, seconds, prefill)
        local_processes(root, pairs, seconds, prefill)
        failover(root, pairs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
