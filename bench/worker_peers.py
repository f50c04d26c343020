"""The peers of bench/worker.py: dramatiq on Redis, Celery on Redis and huey on SQLite, each run
as its own worker command in a child process over tasks enqueued untimed. A peer's figure is
timed from the first task it finished to the last (its process start and imports are not
counted); see bench/worker.py for what each side guarantees."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

from brokers import die_with_parent
from method import Skip
from peers import RedisServer

CONCURRENCY = 8
ENQUEUE_THREADS = 32       # Redis with appendfsync always fsyncs once per event-loop turn


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise Skip(f"{package} is not installed (pip install '.[bench]')") from None


class _Peer:
    name = ""
    durability = ""
    package = ""
    poll = 0.002           # seconds between looks at the queue while the worker drains it

    def __init__(self, root: str) -> None:
        self.root = root
        self.version = ""
        self._redis: RedisServer | None = None
        self.module_dir = ""

    def redis(self) -> RedisServer:
        if self._redis is None:
            server = RedisServer()
            try:
                server.start()
            except Skip:
                server.stop()
                raise
            self._redis = server
        return self._redis

    def url(self) -> str:
        client = self.redis().client
        assert client is not None
        kw = client.connection_pool.connection_kwargs
        return f"redis://{kw['host']}:{kw['port']}/0"

    def folder(self) -> str:
        return tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.root)

    def module(self, source: str, name: str):
        """The tasks module, written once to a folder of its own and imported once here (the
        worker child imports it afresh each run)."""
        if name not in sys.modules:
            folder = tempfile.mkdtemp(prefix=f"{self.name}-module-", dir=self.root)
            with open(os.path.join(folder, f"{name}.py"), "w") as f:
                f.write(textwrap.dedent(source))
            self.module_dir = folder
            sys.path.insert(0, folder)
            importlib.import_module(name)
        return sys.modules[name]

    def child(self, folder: str, argv: list[str], env: dict) -> subprocess.Popen:
        return subprocess.Popen(argv, cwd=folder, env={**os.environ, **env,
                                                       "PYTHONPATH": self.module_dir},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(folder, "worker.log"), "w"),
                                preexec_fn=die_with_parent)

    def run(self, tasks: int, sleep: float) -> float:
        self.version = self.version or _version(self.package)
        folder = self.folder()
        try:
            return self._run(folder, tasks, sleep)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run(self, folder: str, tasks: int, sleep: float) -> float:
        raise NotImplementedError

    def server_version(self) -> str:
        """The version of the redis-server this peer started ("" before or without one)."""
        return "" if self._redis is None else self._redis.version.split(" sha")[0]

    def stop(self) -> None:
        if self._redis is not None:
            self._redis.stop()
            self._redis = None


def enqueue(send, tasks: int) -> None:
    with ThreadPoolExecutor(ENQUEUE_THREADS) as pool:
        list(pool.map(lambda _: send(), range(tasks)))


def time_drain(proc: subprocess.Popen, remaining, tasks: int, folder: str,
               timeout: float = 600, poll: float = 0.002) -> float:
    """Tasks per second from the first task done to the last, as ``remaining()`` counts them
    every ``poll`` seconds."""
    deadline = time.monotonic() + timeout
    first = None
    while True:
        left = remaining()
        now = time.perf_counter()
        if first is None and left < tasks:
            first = (now, left)
        if left == 0 and first is not None:
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            with open(os.path.join(folder, "worker.log")) as f:
                tail = f.read()[-400:]
            raise RuntimeError(f"the worker ended or stalled with {left} tasks left: {tail}")
        time.sleep(poll)
    assert first is not None
    t0, n0 = first
    return n0 / max(now - t0, 1e-6)


def stop_child(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class Dramatiq(_Peer):
    name = "dramatiq_redis"
    package = "dramatiq"
    durability = "Redis appendfsync always: every enqueue and ack fsynced before Redis answers"
    MODULE = '''
        import os, time
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker
        dramatiq.set_broker(RedisBroker(url=os.environ["BENCH_REDIS_URL"]))
        SLEEP = float(os.environ["BENCH_SLEEP"])

        @dramatiq.actor(max_retries=0)
        def task():
            if SLEEP:
                time.sleep(SLEEP)
    '''

    def _run(self, folder: str, tasks: int, sleep: float) -> float:
        url = self.url()
        client = self.redis().client
        client.flushall()
        env = {"BENCH_REDIS_URL": url, "BENCH_SLEEP": str(sleep)}
        os.environ.update(env)
        enqueue(self.module(self.MODULE, "dtasks").task.send, tasks)
        proc = self.child(folder, [sys.executable, "-m", "dramatiq", "dtasks", "--processes",
                                   "1", "--threads", str(CONCURRENCY)], env)
        try:
            return time_drain(proc, lambda: client.hlen("dramatiq:default.msgs"), tasks, folder)
        finally:
            stop_child(proc)


class Celery(_Peer):
    name = "celery_redis"
    package = "celery"
    durability = ("Redis appendfsync always; acks_late (a task is acked after it ran), prefetch "
                  "multiplier 1")
    MODULE = '''
        import os, time
        from celery import Celery
        app = Celery("ctasks", broker=os.environ["BENCH_REDIS_URL"])
        app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                        task_ignore_result=True, broker_connection_retry_on_startup=True)
        SLEEP = float(os.environ["BENCH_SLEEP"])

        @app.task
        def task():
            if SLEEP:
                time.sleep(SLEEP)
    '''

    def _run(self, folder: str, tasks: int, sleep: float) -> float:
        url = self.url()
        client = self.redis().client
        client.flushall()
        env = {"BENCH_REDIS_URL": url, "BENCH_SLEEP": str(sleep)}
        os.environ.update(env)
        enqueue(self.module(self.MODULE, "ctasks").task.delay, tasks)
        proc = self.child(folder, [sys.executable, "-m", "celery", "-A", "ctasks", "worker",
                                   "--pool", "threads", "-c", str(CONCURRENCY),
                                   "--without-gossip", "--without-mingle", "--without-heartbeat",
                                   "-l", "warning"], env)
        try:
            return time_drain(proc, lambda: client.llen("celery") + client.hlen("unacked"),
                              tasks, folder, poll=self.poll)
        finally:
            stop_child(proc)


class Huey(_Peer):
    name = "huey_sqlite"
    package = "huey"
    durability = "SQLite WAL, synchronous NORMAL: commits not fsynced (weaker than the others)"
    MODULE = '''
        import os, time
        from huey import SqliteHuey
        huey = SqliteHuey(filename=os.environ["BENCH_HUEY_DB"], results=False)
        SLEEP = float(os.environ["BENCH_SLEEP"])

        @huey.task()
        def task():
            if SLEEP:
                time.sleep(SLEEP)
    '''

    def _run(self, folder: str, tasks: int, sleep: float) -> float:
        env = {"BENCH_HUEY_DB": os.path.join(self.root, "huey.db"), "BENCH_SLEEP": str(sleep)}
        os.environ.update(env)
        htasks = self.module(self.MODULE, "htasks")
        htasks.huey.flush()
        enqueue(htasks.task, tasks)
        consumer = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
        proc = self.child(folder, [consumer, "htasks.huey", "-w", str(CONCURRENCY), "-k",
                                   "thread", "-l", os.path.join(folder, "huey.log")], env)
        try:
            return time_drain(proc, htasks.huey.pending_count, tasks, folder)
        finally:
            stop_child(proc)


PEERS = {"dramatiq_redis": Dramatiq, "celery_redis": Celery, "huey_sqlite": Huey}
