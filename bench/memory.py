#!/usr/bin/env python3
"""Resident memory (RSS) of a broker with a deep backlog, and of ``partq serve`` with many idle
clients (issue 18). Target: under 200 MiB each.

* ``memory_broker_backlog``: a fresh process opens a directory holding ``--messages`` (1M by
  default) 256-byte keyed messages over 64 partitions (written beforehand by another process, so
  the writer's touched pages are not counted), binds ``--flows`` (100) flows to the queue, waits
  until the rebalance is Ready, has every flow receive once (up to 10 messages, not acked), and
  reads its own ``VmRSS`` from ``/proc/self/status``. The line also carries the anonymous and
  file-backed parts (``rss_anon_mib``, ``rss_file_mib``: LMDB's map is file-backed, pages the
  broker read) and the RSS after ``import partq`` alone (``baseline_mib``).
* ``memory_serve_idle_clients``: ``partq serve --listen 127.0.0.1:0`` (loopback only, no token)
  with ``--max-connections`` above the client count (its default is 256), and ``--clients``
  (1,000) clients connected with ``partq.connect`` from ``--client-processes`` (4) processes,
  sending only their heartbeats; the server's ``VmRSS`` (``/proc/PID/status``) once all are
  connected, beside its RSS before the first client (``baseline_mib``) and the cost per client.

Each line: ``name``, ``unit`` (MiB), ``value``, ``target`` (200) and ``target_is: "max"``
(the value passes below it). The first line, ``load_average_at_start``, carries the load
average and CPU count. Linux only (``/proc``).

    .venv/bin/python bench/memory.py [--quick] [--messages N] [--flows N] [--clients N]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from method import emit, header  # noqa: E402

import partq  # noqa: E402

TARGET_MIB = 200.0
PARTITIONS = 64
PAYLOAD = bytes(range(256))
PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")


def status_kib(pid: int | str = "self") -> dict[str, int]:
    """``VmRSS``, ``RssAnon``, ``RssFile``... of a process, in KiB, from /proc/PID/status."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for text in f:
            key, _, rest = text.partition(":")
            if rest.strip().endswith("kB") or key == "Threads":
                out[key] = int(rest.split()[0])
    return out


def mib(kib: int) -> float:
    return round(kib / 1024, 1)


# ---------------------------------------------------------------------------- the broker
def fill(data: str, messages: int) -> None:
    """The backlog, written by this (parent) process; the measured process only reads it."""
    with partq.Broker.open(data, durability="async") as broker:
        broker.create_queue("q", partitions=PARTITIONS, rebalance_delay=0.0,
                            max_handoff_time=0.0)
        keys = [f"customer-{i}" for i in range(4096)]
        batch = 10_000
        for start in range(0, messages, batch):
            n = min(batch, messages - start)
            broker.publish_many("q", [(PAYLOAD, keys[(start + i) % 4096]) for i in range(n)])


def broker_child(data: str, flows: int) -> int:
    """Run in a fresh interpreter: open, bind, settle, receive once each, report RSS."""
    baseline = status_kib()["VmRSS"]
    with partq.Broker.open(data) as broker:
        bound = [broker.bind("q", name=f"consumer-{i}") for i in range(flows)]
        deadline = time.monotonic() + 120
        while True:
            st = broker.queue_status("q")
            if st.rebalance_status == "Ready" and \
                    sum(len(f.partitions) for f in bound) == PARTITIONS:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{flows} flows did not settle on {PARTITIONS} partitions")
            time.sleep(0.02)
        received = sum(len(f.receive(10, timeout=0)) for f in bound)
        kib = status_kib()
        print(json.dumps({"rss": kib["VmRSS"], "anon": kib.get("RssAnon", 0),
                          "file": kib.get("RssFile", 0), "baseline": baseline,
                          "depth": broker.queue_status("q").depth, "received": received}),
              flush=True)
    return 0


def broker_memory(root: str, messages: int, flows: int) -> dict:
    data = os.path.join(root, "backlog")
    t0 = time.monotonic()
    fill(data, messages)
    filled = time.monotonic() - t0
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-broker", data,
                          str(flows)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"the broker process failed: {out.stderr[-2000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return {"name": "memory_broker_backlog", "unit": "MiB", "value": mib(got["rss"]),
            "target": TARGET_MIB, "target_is": "max", "messages": messages,
            "partitions": PARTITIONS, "flows": flows, "depth": got["depth"],
            "rss_anon_mib": mib(got["anon"]), "rss_file_mib": mib(got["file"]),
            "baseline_mib": mib(got["baseline"]), "fill_seconds": round(filled, 1),
            "note": f"{messages:,} messages, {PARTITIONS} partitions, {flows} flows; a fresh "
                    "process opens, binds, settles, each flow receives once; VmRSS (the "
                    "file-backed part is LMDB's map)"}


# ---------------------------------------------------------------------------- partq serve
def clients_child(address: str, count: int) -> int:
    """Run in a client process: connect ``count`` idle clients, say so, hold them until stdin
    closes."""
    clients = []
    for _ in range(count):
        clients.append(partq.connect(address, timeout=30))
    print("ready", flush=True)
    sys.stdin.read()
    for c in clients:
        c.close()
    return 0


def serve_memory(root: str, clients: int, processes: int) -> dict:
    data = os.path.join(root, "serve")
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=8)
    limit = clients + 64
    serve = subprocess.Popen([PARTQ, "--data", data, "serve", "--listen", "127.0.0.1:0",
                              "--max-connections", str(limit), "--json", "--log-level",
                              "warning"], stdout=subprocess.PIPE, text=True)
    holders: list[subprocess.Popen] = []
    try:
        assert serve.stdout is not None
        address = json.loads(serve.stdout.readline())["listen"]
        time.sleep(0.5)                              # its threads started
        baseline = status_kib(serve.pid)["VmRSS"]
        per = [clients // processes + (1 if i < clients % processes else 0)
               for i in range(processes)]
        for n in per:
            holders.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--child-clients", address, str(n)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for h in holders:
            assert h.stdout is not None
            if h.stdout.readline().strip() != "ready":
                raise RuntimeError("a client process did not connect its clients")
        time.sleep(1.0)                              # every connection's thread is up
        st = status_kib(serve.pid)
        return {"name": "memory_serve_idle_clients", "unit": "MiB", "value": mib(st["VmRSS"]),
                "target": TARGET_MIB, "target_is": "max", "clients": clients,
                "client_processes": processes, "max_connections": limit,
                "baseline_mib": mib(baseline),
                "per_client_kib": round((st["VmRSS"] - baseline) / max(clients, 1), 1),
                "threads": st.get("Threads"),
                "note": f"{clients:,} idle clients (heartbeats only) from {processes} "
                        f"processes over loopback, no token; partq serve --max-connections "
                        f"{limit} (default 256)"}
    finally:
        for h in holders:
            try:
                if h.stdin is not None:
                    h.stdin.close()
            except OSError:
                pass
        for h in holders:
            try:
                h.wait(timeout=30)
            except subprocess.TimeoutExpired:
                h.kill()
                h.wait()
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20k messages, 50 clients")
    parser.add_argument("--messages", type=int, default=None, help="backlog (default 1,000,000)")
    parser.add_argument("--flows", type=int, default=100)
    parser.add_argument("--clients", type=int, default=None, help="idle clients (default 1,000)")
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--child-broker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--child-clients", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_broker:
        return broker_child(args.child_broker[0], int(args.child_broker[1]))
    if args.child_clients:
        return clients_child(args.child_clients[0], int(args.child_clients[1]))
    messages = args.messages or (20_000 if args.quick else 1_000_000)
    clients = args.clients or (50 if args.quick else 1_000)
    emit(header("memory"))
    root = tempfile.mkdtemp(prefix="partq-bench-memory-")
    try:
        emit(broker_memory(root, messages, args.flows))
        emit(serve_memory(root, clients, max(1, min(args.client_processes, clients))))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
