"""RabbitMQ and NATS JetStream as peers of ``partq serve`` (bench/remote.py): their servers, started
by the bench on 127.0.0.1 and stopped at the end, and the client loops of its slices.

* RabbitMQ (Debian's ``rabbitmq-server``): a node of its own (``bench-<pid>@localhost``) on free
  ports, its mnesia, logs, config and (empty) plugins file in a temp folder, AMQP, distribution
  and epmd on 127.0.0.1 only; the epmd is started here (not as a daemon) and stopped with the
  node. Durable quorum queues (``x-queue-type: quorum``), publisher confirms, manual acks.
* NATS (Debian's ``nats-server``): ``-js -sd <tmp> -a 127.0.0.1 -p <free port>``, file-storage
  streams, a durable pull consumer with explicit acks.

Both servers are started in a session of their own (a Ctrl-C of the bench reaches the bench, whose
``finally`` stops them), get SIGTERM if the bench dies (``PR_SET_PDEATHSIG``), and are stopped by
an ``atexit`` hook too. A missing server or client library raises ``Skip`` with the reason.
"""
from __future__ import annotations

import asyncio
import atexit
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from method import Skip, log

PAYLOAD = b"x" * 256
PR_SET_PDEATHSIG = 1


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now (all bound at once, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def die_with_parent() -> None:              # preexec_fn: SIGTERM when the bench dies
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def wait_until(ready, what: str, proc: subprocess.Popen, seconds: float, log_file: Path) -> None:
    """Poll ``ready()`` until it is true; Skip if ``proc`` exits or ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while not ready():
        if proc.poll() is not None:
            raise Skip(f"{what} exited with {proc.returncode} at start: {_tail(log_file)}")
        if time.monotonic() > deadline:
            raise Skip(f"{what} did not come up within {seconds:.0f} s: {_tail(log_file)}")
        time.sleep(0.05)


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _tail(path: Path) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-3:])
    except OSError:
        return "no log"


def _stop(proc: subprocess.Popen | None, seconds: float = 30) -> None:
    """SIGTERM, wait, then SIGKILL to the process group it leads (its session)."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # whatever it left in its session
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(5)


class _Server:
    def __init__(self) -> None:
        self.dir: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.port = self.pid = 0
        self.version = ""
        atexit.register(self.stop)

    def _spawn(self, argv: list[str], env: dict | None = None, log_name: str = "out.log"):
        assert self.dir is not None
        with open(os.path.join(self.dir, log_name), "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=die_with_parent)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        while self.procs:
            _stop(self.procs.pop())             # the server first, then its epmd
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# ---------------------------------------------------------------------------- RabbitMQ
class RabbitMQServer(_Server):
    def start(self) -> None:
        try:
            import pika  # noqa: F401
        except ImportError as exc:
            raise Skip(f"the pika client is not installed ({exc}); pip install pika") from None
        script = "/usr/lib/rabbitmq/bin/rabbitmq-server"
        if not os.path.exists(script) or shutil.which("epmd") is None:
            raise Skip("rabbitmq-server is not installed (Debian: apt-get install -y "
                       "rabbitmq-server)")
        self.dir = d = tempfile.mkdtemp(prefix="partq-bench-rabbitmq-")
        self.port, dist, epmd = free_ports(3)
        Path(d, "enabled_plugins").write_text("")
        Path(d, "rabbitmq.conf").write_text("")
        env = {**os.environ, "HOME": d, "RABBITMQ_CONF_ENV_FILE": f"{d}/rabbitmq-env.conf",
               "RABBITMQ_CONFIG_FILE": f"{d}/rabbitmq.conf",
               "RABBITMQ_ADVANCED_CONFIG_FILE": f"{d}/advanced.config",
               "RABBITMQ_MNESIA_BASE": f"{d}/mnesia", "RABBITMQ_LOG_BASE": f"{d}/log",
               "RABBITMQ_ENABLED_PLUGINS_FILE": f"{d}/enabled_plugins",
               "RABBITMQ_PID_FILE": f"{d}/rabbitmq.pid",
               "RABBITMQ_NODENAME": f"bench-{os.getpid()}@localhost",
               "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(self.port),
               "RABBITMQ_DIST_PORT": str(dist), "ERL_EPMD_PORT": str(epmd),
               "ERL_EPMD_ADDRESS": "127.0.0.1",
               "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
                   "-kernel inet_dist_use_interface {127,0,0,1} -start_epmd false"}
        epmd_proc = self._spawn(["epmd", "-port", str(epmd), "-address", "127.0.0.1"], env,
                                "epmd.log")
        wait_until(lambda: port_open(epmd), "epmd", epmd_proc, 10, Path(d, "epmd.log"))
        proc = self._spawn([script], env, "rabbitmq.log")
        wait_until(lambda: port_open(self.port), "rabbitmq-server", proc, 60,
                   Path(d, "rabbitmq.log"))
        banner = Path(d, "rabbitmq.log").read_text(errors="replace")    # its start banner
        found = [re.search(rf"{word}\s+(\d[\w.-]*)", banner) for word in ("RabbitMQ", "Erlang:")]
        self.version = "RabbitMQ {} on Erlang {}".format(*(m[1] if m else "?" for m in found))
        log("remote", f"started rabbitmq-server pid {proc.pid} on 127.0.0.1:{self.port} "
                      f"(epmd {epmd}, distribution {dist})")

    def params(self):
        import pika
        return pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0)

    def declare(self, queue: str) -> None:
        import pika
        with pika.BlockingConnection(self.params()) as conn:
            conn.channel().queue_declare(queue, durable=True,
                                         arguments={"x-queue-type": "quorum"})

    def delete(self, queue: str) -> None:
        import pika
        with pika.BlockingConnection(self.params()) as conn:
            conn.channel().queue_delete(queue)


class _ConfirmedPublisher:
    """pika's SelectConnection driven by callbacks: publish a batch, wait for all its confirms
    (``multiple`` or one by one), publish the next, until ``total`` or the deadline."""

    def __init__(self, port: int, queue: str, batch: int, total: int | None,
                 seconds: float | None, ready, go) -> None:
        import pika
        self.pika, self.queue, self.batch, self.total = pika, queue, batch, total
        self.seconds, self.ready, self.go = seconds or 0.0, ready, go
        self.props = pika.BasicProperties(delivery_mode=2)
        self.n, self.tag, self.end, self.done = 0, 1, 0.0, False
        self.open: set[int] = set()
        self.error: str | None = None
        self.ch: Any = None
        self.conn = pika.SelectConnection(
            pika.ConnectionParameters("127.0.0.1", port, heartbeat=0),
            on_open_callback=lambda c: c.channel(on_open_callback=self.on_channel),
            on_open_error_callback=self.on_open_error, on_close_callback=self.on_close)

    def run(self) -> int:
        self.conn.ioloop.start()
        if self.error:
            raise RuntimeError(self.error)
        return self.n

    def on_open_error(self, _conn, exc) -> None:
        self.error = f"could not connect to RabbitMQ: {exc}"
        self.conn.ioloop.stop()

    def on_close(self, _conn, exc) -> None:
        if not self.done and self.error is None:
            self.error = f"the connection closed: {exc}"
        self.conn.ioloop.stop()

    def on_channel(self, ch) -> None:
        self.ch = ch
        ch.confirm_delivery(self.on_confirm, callback=self.on_confirm_mode)

    def on_confirm_mode(self, _frame) -> None:
        if self.ready is not None:
            self.ready.release()
            self.go.wait()
        self.end = time.monotonic() + self.seconds
        self.send()

    def send(self) -> None:
        if (self.n >= self.total) if self.total is not None else time.monotonic() >= self.end:
            self.done = True
            self.conn.close()
            return
        k = self.batch if self.total is None else min(self.batch, self.total - self.n)
        self.open = set(range(self.tag, self.tag + k))
        self.tag += k
        for _ in range(k):
            self.ch.basic_publish("", self.queue, PAYLOAD, self.props)

    def on_confirm(self, frame) -> None:
        m = frame.method
        if isinstance(m, self.pika.spec.Basic.Nack):
            self.error = f"the broker nacked publish {m.delivery_tag}"
            self.conn.close()
            return
        waiting = bool(self.open)
        self.open = ({t for t in self.open if t > m.delivery_tag} if m.multiple
                     else self.open - {m.delivery_tag})
        if waiting and not self.open:           # the whole batch is confirmed
            self.n = self.tag - 1
            self.send()


def rabbit_publish(port: int, queue: str, batch: int = 100, total: int | None = None,
                   seconds: float | None = None, ready=None, go=None) -> int:
    """Publish ``batch`` messages, wait until the broker confirmed all of them, again, until
    ``total`` were confirmed or ``seconds`` passed; returns how many were confirmed. With a
    quorum queue a confirm means the message is in the queue's fsynced log."""
    return _ConfirmedPublisher(port, queue, batch, total, seconds, ready, go).run()


def rabbit_publisher(port: int, ready, go, out, seconds: float, queue: str) -> None:
    out.put(rabbit_publish(port, queue, 100, seconds=seconds, ready=ready, go=go))


def rabbit_consumer(port: int, ready, go, out, seconds: float, queue: str) -> None:
    """Prefetch 100, manual acks: take 100 deliveries, ack them with one ``multiple=True`` ack
    (which lets the broker send the next 100), until drained or ``seconds``."""
    import pika
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=100)
    ready.release()
    go.wait()
    n, pending, tag, arrived = 0, 0, 0, time.monotonic()
    last, end = arrived, arrived + seconds
    for method, _props, _body in ch.consume(queue, inactivity_timeout=0.2):
        if method is None:
            break                               # none within 0.2 s: drained
        pending, tag, arrived = pending + 1, method.delivery_tag, time.monotonic()
        if pending == 100 or arrived >= end:
            ch.basic_ack(tag, multiple=True)
            n, pending, last = n + pending, 0, arrived
            if arrived >= end:
                break
    if pending:                                 # the drained tail, acked when it arrived
        ch.basic_ack(tag, multiple=True)
        n, last = n + pending, arrived
    ch.cancel()
    conn.close()
    out.put((n, last))


# ---------------------------------------------------------------------------- NATS
class NatsServer(_Server):
    def start(self) -> None:
        try:
            import nats  # noqa: F401
        except ImportError as exc:
            raise Skip(f"the nats-py client is not installed ({exc}); pip install nats-py") \
                from None
        binary = shutil.which("nats-server")
        if binary is None:
            raise Skip("nats-server is not on PATH (Debian: apt-get install -y nats-server)")
        self.version = subprocess.run([binary, "--version"], capture_output=True, text=True,
                                      timeout=10).stdout.strip()
        self.dir = tempfile.mkdtemp(prefix="partq-bench-nats-")
        self.port = free_ports(1)[0]
        proc = self._spawn([binary, "-js", "-sd", os.path.join(self.dir, "js"), "-a",
                            "127.0.0.1", "-p", str(self.port)], log_name="nats.log")
        wait_until(lambda: port_open(self.port), "nats-server", proc, 30,
                   Path(self.dir, "nats.log"))
        self.run(lambda js: js.account_info())         # JetStream is on
        self.pid = proc.pid
        log("remote", f"started {self.version} pid {proc.pid} on 127.0.0.1:{self.port}")

    def run(self, coro_fn, *args):
        """Run ``coro_fn(js, *args)`` on a fresh connection (setup and cleanup of a slice). Not
        ``asyncio.run``: it turns Ctrl-C into a cancellation, which nats-py may swallow."""
        async def go():
            nc = await nats_connect(self.port)
            try:
                return await coro_fn(nc.jetstream(), *args)
            finally:
                await nc.close()
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(go())
        finally:
            loop.close()


async def nats_connect(port: int):
    import nats
    return await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=5,
                              max_reconnect_attempts=0, allow_reconnect=False)


async def nats_add_stream(js, name: str, prefill: int, consumer: bool) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
    await js.add_stream(StreamConfig(name=name, subjects=[name], storage=StorageType.FILE))
    for start in range(0, prefill, 1000):
        await asyncio.gather(*(js.publish(name, PAYLOAD)
                               for _ in range(min(1000, prefill - start))))
    if consumer:
        await js.add_consumer(name, ConsumerConfig(durable_name="c",
                                                   ack_policy=AckPolicy.EXPLICIT,
                                                   max_ack_pending=10_000))


async def nats_delete_stream(js, name: str) -> None:
    await js.delete_stream(name)


async def _nats_publish(port: int, ready, go, seconds: float, subject: str) -> int:
    nc = await nats_connect(port)
    js = nc.jetstream()
    ready.release()
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        acks = [await js.publish_async(subject, PAYLOAD) for _ in range(100)]
        await asyncio.gather(*acks)             # raises if the stream refused one
        n += 100
    await nc.close()
    return n


def nats_publisher(port: int, ready, go, out, seconds: float, subject: str) -> None:
    """100 ``js.publish_async`` (the same request as ``js.publish``, without a coroutine and
    inbox per message: 1.4x its rate here), then gather their 100 acks, again."""
    out.put(asyncio.run(_nats_publish(port, ready, go, seconds, subject)))


async def _nats_consume(port: int, ready, go, seconds: float, stream: str):
    nc = await nats_connect(port)
    js = nc.jetstream()
    sub = await js.pull_subscribe_bind("c", stream)
    ready.release()
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    n, last, end = 0, time.monotonic(), time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            msgs = await sub.fetch(100, timeout=0.2)
        except TimeoutError:                    # nats.errors.TimeoutError is one too
            break                               # none within 0.2 s: drained
        for m in msgs:
            await m.ack()
        await nc.flush()                        # one round trip: the server has the acks
        n, last = n + len(msgs), time.monotonic()
    await nc.close()
    return n, last


def nats_consumer(port: int, ready, go, out, seconds: float, stream: str) -> None:
    """fetch(100) from the stream's durable pull consumer, ``ack()`` each, one flush."""
    out.put(asyncio.run(_nats_consume(port, ready, go, seconds, stream)))
