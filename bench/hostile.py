"""``partq serve`` under hostile and careless clients (the listeners issue): its resident memory
and a legitimate publisher's worst latency, with the attackers and without them, in one run.

Each round starts a fresh ``partq serve`` (a process of its own, on 127.0.0.1) on a fresh
directory with a 30 MB backlog in one queue, runs a legitimate publisher (``publish_many`` of
100) and consumer (``receive(100)`` + ``ack_many``) for a fixed time, and samples the server's
RSS every 0.2 s. The attacked round adds every attack of ``tests/remote/hostile.py`` at once:
128 connections trickling their handshake, a client pipelining requests it never reads the
answers of, publishes of three million empty items in one frame, a flow that never reads its
deliveries of the backlog, and a client binding flows past the per-connection limit. RSS counts
the pages of the store's memory map the server touched, so both rounds include the data they
wrote; the attacked round also touched the backlog's 30 MB. ``serve_rss_after_clients_left``:
3 s after every client of the round closed its connection.

    .venv/bin/python bench/hostile.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "remote"))

from hostile import TOKEN, Attacks, Legit, rss_bytes, start_serve  # noqa: E402

import partq  # noqa: E402


def partq_command() -> str:
    return str(Path(sys.executable).with_name("partq"))


def round_(seconds: float, attacked: bool) -> dict:
    root = tempfile.mkdtemp(prefix="partq-hostile-")
    try:
        data = os.path.join(root, "data")
        with partq.Broker.open(data) as broker:
            broker.create_queue("q", partitions=4, rebalance_delay=0.2, max_handoff_time=0.5)
            broker.create_queue("other", partitions=8)
            broker.create_queue("backlog", partitions=1)
            broker.publish_many("backlog", [(b"b" * 100_000, None) for _ in range(300)])
        token_file = os.path.join(root, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN)
        os.chmod(token_file, 0o600)
        proc, address = start_serve(partq_command(), data, token_file)
        try:
            stop = threading.Event()
            legit = Legit(address, stop)
            attacks = Attacks(address, stop) if attacked else None
            if attacks is not None:
                attacks.start()
            legit.start()
            peak = 0
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                peak = max(peak, rss_bytes(proc.pid))
                time.sleep(0.2)
            legit.join()
            if attacks is not None:
                attacks.join()
            time.sleep(3.0)          # the server notices the closed connections and lets go
            return {"rss_peak_mib": peak / 2**20, "rss_after_mib": rss_bytes(proc.pid) / 2**20,
                    "worst_publish_s": max(legit.latencies or [float("nan")]),
                    "published": legit.published, "consumed": legit.consumed,
                    "errors": len(legit.errors),
                    "attacks": dict(attacks.seen) if attacks is not None else {}}
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    seconds = 3.0 if args.quick else 20.0
    calm = round_(seconds, attacked=False)
    attacked = round_(seconds, attacked=True)
    load = os.getloadavg()[0]
    for name, unit, key in (("serve_rss_peak_under_attack", "MiB", "rss_peak_mib"),
                            ("serve_rss_after_clients_left", "MiB", "rss_after_mib"),
                            ("legit_worst_publish_latency_under_attack", "s", "worst_publish_s")):
        print(json.dumps({"name": name, "unit": unit, "value": round(attacked[key], 4),
                          "peer": "the same without attackers", "peer_value": round(calm[key], 4),
                          "ratio": round(attacked[key] / calm[key], 3) if calm[key] else None,
                          "seconds": seconds, "load_average": round(load, 2),
                          "attacked_round": attacked, "calm_round": calm}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
