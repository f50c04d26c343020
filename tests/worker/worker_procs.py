"""Real ``partq worker`` processes for the worker's tests: a handler module written to the
test's folder that records every run to a file (appended and fsynced, so a SIGKILL loses no
line), a queue to work on, and reading the record back."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import partq

HANDLERS = '''
import os, random, time
import partq

worker = partq.Worker()
LOG = os.environ["WORKER_LOG"]
SLOW = float(os.environ.get("WORKER_SLOW", "0.003"))
rng = random.Random()


def record(line):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@worker.handler("jobs", concurrency=8, retries=2, backoff=(0.02, 0.05))
def handle(msg):
    payload = msg.payload.decode()
    record(f"start {msg.key} {payload} {time.monotonic()}")
    time.sleep(SLOW * (0.5 + rng.random() / 2))
    if payload.startswith("poison"):
        raise RuntimeError(f"cannot do {payload}")
    record(f"end {msg.key} {payload} {time.monotonic()}")
'''


def write_module(folder: Path) -> None:
    (folder / "tasks.py").write_text(textwrap.dedent(HANDLERS))


def make_queue(data: Path, partitions: int = 8, **options) -> None:
    with partq.Broker.open(data) as b:
        b.create_queue("jobs", partitions=partitions, ordering="key", rebalance_delay=0.2,
                       **options)


def publish(data: Path, items) -> None:
    with partq.Broker.open(data) as b:
        b.publish_many("jobs", items)


def start_worker(folder: Path, data: Path | None, log: Path, *args: str,
                 slow: float = 0.003) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"},
           "WORKER_LOG": str(log), "WORKER_SLOW": str(slow)}
    where = ["--data", str(data)] if data is not None else []
    err = open(folder / "worker.err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "partq", *where, "worker", "tasks:worker",
                             "--json", *args], cwd=folder, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=err)
    err.close()
    proc.err_path = folder / "worker.err"       # type: ignore[attr-defined]
    STARTED.append(proc)
    return proc


STARTED: list[subprocess.Popen] = []     # killed at each test's end if still running (conftest)


def kill_left() -> None:
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def stderr_of(proc: subprocess.Popen) -> str:
    return proc.err_path.read_text()            # type: ignore[attr-defined]


def stop(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 60) -> tuple[int, list, str]:
    """Signal ``proc`` and wait: (exit status, its --json events, its stderr)."""
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=timeout)
    return (proc.returncode, [json.loads(line) for line in out.splitlines() if line],
            stderr_of(proc))


class Runs:
    """The record read back: runs per payload, and per key the (start, end, payload) runs."""

    def __init__(self, log: Path) -> None:
        self.starts: dict[str, int] = defaultdict(int)
        self.ends: dict[str, int] = defaultdict(int)
        self.by_key: dict[str, list] = defaultdict(list)
        open_runs: dict[tuple, float] = {}
        text = log.read_text() if log.exists() else ""
        lines = text.split("\n")[:-1]      # a line still being written is not whole yet
        for line in lines:
            what, key, payload, at = line.split(" ")
            if what == "start":
                self.starts[payload] += 1
                open_runs[(key, payload)] = float(at)
                self.by_key[key].append([float(at), None, payload])
            else:
                self.ends[payload] += 1
                for run in reversed(self.by_key[key]):
                    if run[2] == payload and run[1] is None:
                        run[1] = float(at)
                        break

    def overlaps(self) -> list:
        """Runs of one key that overlapped (a run that raised has no end: it ended before the
        key's next start, which the order check covers)."""
        bad = []
        for key, runs in self.by_key.items():
            for (_, e1, p1), (s2, _, p2) in zip(runs, runs[1:], strict=False):
                if e1 is not None and s2 < e1:
                    bad.append((key, p1, p2))
        return bad

    def start_order(self, key: str) -> list[int]:
        """The key's payload numbers in the order their first runs started."""
        seen, out = set(), []
        for _, _, payload in self.by_key[key]:
            if payload not in seen:
                seen.add(payload)
                out.append(int(payload.split("-")[-1]))
        return out
