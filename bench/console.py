"""What the web console costs (``partq console``, ``partq serve --console-listen``).

* ``console_overview_N_queues``: the time from sending ``GET /api/overview`` to the last byte of
  its answer (the JSON the overview page needs: every queue's row, the store, replication, the
  chart), over real HTTP, for a store of N queues of 16 partitions with messages in some of
  them; each round builds it anew (the console's cache is invalidated). Target: under 1 s for
  1,000 queues. Peer: building the same store's ``partq stats --json`` document (every queue's
  row and the store's sizes: ``partq.ops.stats.stats`` and ``json.dumps``) in the same process,
  in interleaved rounds (bench/method.py).
* ``console_open_cpu_N_queues``: the CPU time of a ``partq serve --console-listen`` process
  (``/proc/PID/stat``) while a client polls the overview as the page does (again as soon as the
  answer's ``refresh`` seconds have passed), minus the same process's CPU time for as long with
  nobody polling, in percent of one core. Target: under 1%. The serving process delivers every
  queue meanwhile, so its own CPU (the baseline) is noise around the figure;
  ``..._partq_console`` measures the same for a ``partq console`` process, whose baseline is
  near 0.

    .venv/bin/python bench/console.py [--quick]
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from method import emit, header, interleave, line, log

import partq
from partq.console import ConsoleServer
from partq.ops.stats import stats

SCRIPT = "console"
PARTITIONS = 16
PARTQ = str(Path(sys.executable).with_name("partq"))


def make_store(path: str, queues: int) -> None:
    with partq.Broker.open(path, durability="async") as broker:
        for i in range(queues):
            broker.create_queue(f"queue-{i:04d}", partitions=PARTITIONS,
                                dead_message_queue="dead" if i % 10 else "")
        broker.create_queue("dead")
        for i in range(0, queues, 10):      # every tenth queue holds messages
            broker.publish_many(f"queue-{i:04d}", [(b"x" * 200, f"k{j}") for j in range(200)])


def fetch(address: str, path: str) -> bytes:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"GET {path}: {answer.status} {body[:200]!r}")
        return body
    finally:
        conn.close()


def overview_times(path: str, queues: int, pairs: int) -> None:
    with partq.Broker.open(path) as broker:
        server = ConsoleServer(broker, "127.0.0.1:0")
        try:
            started = time.perf_counter()
            first = fetch(server.address, "/api/overview")
            cold = time.perf_counter() - started
            assert len(json.loads(first)["queues"]) == queues + 1

            def console_round() -> float:
                server.console.views.invalidate()
                t0 = time.perf_counter()
                fetch(server.address, "/api/overview")
                return (time.perf_counter() - t0) * 1000

            def stats_round() -> float:
                t0 = time.perf_counter()
                json.dumps(stats(broker))
                return (time.perf_counter() - t0) * 1000
            peer_name = f"partq_stats_json_{queues}_queues"
            got = interleave([(peer_name, stats_round), ("console", console_round)], pairs,
                             script=SCRIPT)
            emit(line(peer_name, "ms", got[peer_name], digits=1, queues=queues,
                      partitions=PARTITIONS))
            emit(line(f"console_overview_{queues}_queues", "ms", got["console"], peer_name,
                      got[peer_name], target=1000.0, target_is="max", digits=1, queues=queues,
                      partitions=PARTITIONS, first_request_ms=round(cold * 1000, 1),
                      answer_bytes=len(first)))
        finally:
            server.close()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_console_cpu(path: str, queues: int, window: float, serve: bool,
                     quick: bool = False) -> None:
    """``serve``: the console of ``partq serve --console-listen`` (it also delivers every
    queue: its own CPU is the baseline); else of ``partq console``."""
    command = (["serve", "--console-listen", "127.0.0.1:0"] if serve
               else ["console", "--listen", "127.0.0.1:0"])
    proc = subprocess.Popen([PARTQ, "--data", path, *command, "--json", "--log-level", "warning"],
                            stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
        address = started["console"].split("//", 1)[1].rstrip("/")
        refresh = json.loads(fetch(address, "/api/overview"))["refresh"]   # the first build
        time.sleep(1.0)                                     # settle: the serve's start-up
        t0, c0 = time.monotonic(), cpu_seconds(proc.pid)
        time.sleep(window)
        idle = cpu_seconds(proc.pid) - c0
        idle_wall = time.monotonic() - t0
        if not quick:                        # several builds, as a page left open makes them
            window = max(window, min(3 * refresh, 180.0))
        polls, t0, c0 = 0, time.monotonic(), cpu_seconds(proc.pid)
        while time.monotonic() - t0 < window:
            fetch(address, "/")                      # (the page reloads nothing; one file)
            refresh = json.loads(fetch(address, "/api/overview"))["refresh"]
            polls += 1
            time.sleep(min(refresh, max(0.0, window - (time.monotonic() - t0))))
        polled = cpu_seconds(proc.pid) - c0
        polled_wall = time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    idle_pct = idle / idle_wall * 100
    value = max(0.0, polled / polled_wall * 100 - idle_pct)
    emit({"name": f"console_open_cpu_{queues}_queues" + ("" if serve else "_partq_console"),
          "unit": "% of a core",
          "value": round(value, 3), "target": 1.0, "target_is": "max",
          "serve_idle_cpu_percent": round(idle_pct, 3), "polls": polls,
          "seconds": round(polled_wall, 1), "refresh_seconds": refresh, "queues": queues,
          "partitions": PARTITIONS})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    queues, pairs, window = (30, 2, 2.0) if args.quick else (1000, 7, 30.0)
    emit(header(SCRIPT, pairs))
    root = tempfile.mkdtemp(prefix="partq-console-")
    try:
        path = os.path.join(root, "data")
        log(SCRIPT, f"making {queues} queues of {PARTITIONS} partitions")
        make_store(path, queues)
        overview_times(path, queues, pairs)
        open_console_cpu(path, queues, window, serve=True, quick=args.quick)
        open_console_cpu(path, queues, window, serve=False, quick=args.quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
