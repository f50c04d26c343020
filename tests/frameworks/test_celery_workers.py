"""Real `celery worker` processes on partq: a worker killed with SIGKILL mid-run loses no task
(task_acks_late: what it held comes back to the next worker, at once, with no visibility timeout),
and a task's retry(countdown=...) runs it again; through a directory and through partq serve."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("celery", reason="the celery extra (pip install 'partq[celery]') brings Celery")

from helpers import wait_until

import partq
from partq.remote.server import Server

TOKEN = "a-test-token-of-32-bytes-or-so!!"
APP = '''
import os, time
import partq.kombu  # noqa: F401
from celery import Celery

app = Celery("capp", broker=os.environ["PQ_BROKER"], backend="file://" + os.environ["PQ_RESULTS"])
app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1,
                broker_transport_options={"polling_interval": 0.02},
                worker_enable_remote_control=os.environ.get("PQ_CONTROL") == "1")
LOG = os.environ["PQ_LOG"]

def note(line):
    with open(LOG, "a") as f:
        f.write(line + "\\n")

@app.task
def work(i):
    note(f"start {i}")
    time.sleep(0.05)
    note(f"done {i}")
    return i

@app.task(bind=True)
def flaky(self):
    note(f"attempt {self.request.retries}")
    if self.request.retries == 0:
        raise self.retry(countdown=1)
    return "ok"
'''


@pytest.fixture
def app_dir(tmp_path, monkeypatch):
    (tmp_path / "capp.py").write_text(APP)
    (tmp_path / "results").mkdir()
    env = {"PQ_RESULTS": str(tmp_path / "results"), "PQ_LOG": str(tmp_path / "log")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def start_worker(app_dir, pool: str = "threads") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(app_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "capp", "worker", "-P", pool,
                             "-c", "2", "--without-mingle", "--without-gossip",
                             "--without-heartbeat", "-l", "WARNING"],
                            cwd=app_dir, env=env, stdout=subprocess.DEVNULL,
                            stderr=open(app_dir / f"worker-{pool}.err", "ab"))


def log_lines(app_dir) -> list[str]:
    path = app_dir / "log"
    return path.read_text().splitlines() if path.exists() else []


def import_app(broker_url: str):
    os.environ["PQ_BROKER"] = broker_url
    sys.modules.pop("capp", None)
    import capp
    return capp


def kill_mid_run_loses_nothing(app_dir, broker_url: str, n: int = 40) -> None:
    capp = import_app(broker_url)
    results = [capp.work.delay(i) for i in range(n)]
    worker = start_worker(app_dir)
    try:
        wait_until(lambda: sum(line.startswith("done") for line in log_lines(app_dir)) >= 5, 60,
                   "the first worker to finish some tasks")
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        first_done = {line for line in log_lines(app_dir) if line.startswith("done")}
        assert len(first_done) < n, "the worker finished everything before it was killed"
        worker = start_worker(app_dir)
        done = wait_until(lambda: {int(line.split()[1]) for line in log_lines(app_dir)
                                   if line.startswith("done")} >= set(range(n)) or None, 90,
                          "every task done after the kill")
        assert done
        assert sorted(r.get(timeout=30) for r in results) == list(range(n))
    finally:
        worker.kill()
        worker.wait(30)


def test_a_killed_worker_loses_no_task_through_a_directory(app_dir):
    os.environ["PQ_CONTROL"] = "1"
    kill_mid_run_loses_nothing(app_dir, f"partq://{app_dir / 'broker'}")


def test_a_retry_with_a_countdown_runs_the_task_again(app_dir):
    os.environ["PQ_CONTROL"] = "1"
    capp = import_app(f"partq://{app_dir / 'broker'}")
    result = capp.flaky.delay()
    worker = start_worker(app_dir, pool="solo")
    try:
        assert result.get(timeout=60) == "ok"
        assert log_lines(app_dir) == ["attempt 0", "attempt 1"]
    finally:
        worker.kill()
        worker.wait(30)


def test_a_killed_worker_loses_no_task_through_partq_serve(app_dir):
    broker = partq.Broker.open(app_dir / "data")
    # a partq serve client creates no queue: the one Celery uses is made beforehand (remote
    # control, which needs a queue per worker, is off)
    broker.create_queue("celery", ordering="key", rebalance_delay=0.0, max_poll_interval=0.0)
    server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
    os.environ["PQ_CONTROL"] = "0"
    try:
        kill_mid_run_loses_nothing(app_dir, f"partq://:{TOKEN}@{server.address}")
        assert broker.queue_status("celery").depth == 0
    finally:
        server.close()
        broker.close()
