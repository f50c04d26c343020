"""The ``dramatiq`` command's worker processes on partq (tests/frameworks/dramatiq_app.py): a
worker killed with SIGKILL loses no message, and the messages of one ``partq_key`` never run
at once and start in order, across the threads of two worker processes and the handoff of
partitions from one to the other."""
from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_until

pytest.importorskip("dramatiq")
import partq

HERE = Path(__file__).resolve().parent


@pytest.fixture
def app(tmp_path, monkeypatch):
    """The application module, imported here on a fresh directory, and ``start()`` running
    ``dramatiq dramatiq_app`` (one process, four threads) in a process group of its own."""
    monkeypatch.setenv("PARTQ_DRAMATIQ_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PARTQ_DRAMATIQ_LOG", str(tmp_path / "log"))
    sys.modules.pop("dramatiq_app", None)
    module = importlib.import_module("dramatiq_app")
    workers: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "dramatiq", "dramatiq_app", "--processes", "1",
                                 "--threads", "4", "--path", str(HERE)], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.err", "ab"))
        workers.append(proc)
        return proc
    yield module, start, tmp_path / "log"
    for proc in workers:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    module.broker.close()
    sys.modules.pop("dramatiq_app", None)


def lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def ended(log: Path) -> set[int]:
    return {int(i) for event, _, i, _ in lines(log) if event == "end"}


def test_a_worker_killed_with_sigkill_loses_no_message(app):
    module, start, log = app
    for i in range(200):
        module.step.send("-", i, 0.01)
    first = start()
    wait_until(lambda: len(ended(log)) >= 40, 60, "the first worker to run 40 messages")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    done_before = ended(log)
    assert len(done_before) < 200
    start()
    wait_until(lambda: ended(log) == set(range(200)), 120, "every message run after the kill")
    wait_until(lambda: module.broker.connection.queue_status("default").depth == 0, 30,
               "every message acked")


def test_one_keys_messages_never_overlap_across_two_worker_processes(app):
    module, start, log = app
    keys: list[str] = []
    for n in range(1000):       # two keys in each of the four partitions
        key = f"key-{n}"
        if sum(partq.key_partition(k, 4) == partq.key_partition(key, 4) for k in keys) < 2:
            keys.append(key)
        if len(keys) == 8:
            break
    for i in range(40):
        for key in keys:
            module.step.send_with_options(args=(key, i, 0.02), partq_key=key)
    start()
    wait_until(lambda: len(lines(log)) >= 10, 60, "the first worker to start")
    start()          # binds: half the partitions move to it while the first runs their keys
    wait_until(lambda: sum(e[0] == "end" for e in lines(log)) >= 320, 120, "every message to run")
    events = lines(log)
    for key in keys:
        mine = [(event, int(i)) for event, k, i, _ in events if k == key]
        assert mine == [(e, i) for i in range(40) for e in ("start", "end")], key
    assert len({pid for *_, pid in events}) == 2, "both worker processes ran messages"
