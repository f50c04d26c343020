"""A soak of ``partq serve`` over TLS beside the same over plain TCP: dropped connections and
rounds per second.

Two client processes, one of ``partq.connect`` and one of ``partq.aio``, each loop for
``--seconds`` (60 by default): receive up to 10, ack each, publish one (1 KiB, keyed), so reads
and writes of one connection cross all the time. A ``partq serve`` process per side (``--tls-cert``
with a certificate made here, or none) serves them. Each client counts the connections it lost
(the client's "lost the connection" log lines) and the requests that failed; the target over TLS
is 0, as over TCP. Sides run one after the other, TLS first, ``--pairs`` rounds.

Lines: ``tls_soak_lost_connections`` (value: TLS, peer: TCP; a count in all), and
``tls_soak_rounds_per_s`` (ratio TLS / TCP: what TLS costs this loop).

    .venv/bin/python bench/tls_soak.py [--quick] [--seconds 60] [--pairs 1]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from brokers import die_with_parent
from method import emit, header, line, log

import partq
import partq.aio

TOKEN = "bench-token-" + "0" * 32
PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")
PAYLOAD = b"x" * 1024


class Lost(logging.Handler):
    """Counts the client's "lost the connection" lines."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "lost the connection" in record.getMessage():
            self.count += 1


def _context(ca: str | None) -> ssl.SSLContext | None:
    if ca is None:
        return None
    context = ssl.create_default_context(cafile=ca)
    return context


def _sync_client(address: str, ca: str | None, queue: str, seconds: float, out) -> None:
    lost = Lost()
    logging.getLogger("partq.client").addHandler(lost)
    rounds = failed = 0
    with partq.connect(address, token=TOKEN, ssl=_context(ca)) as client:
        flow = client.bind(queue)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                for msg in flow.receive(max_messages=10, timeout=0.01):
                    flow.ack(msg)
                client.publish(queue, PAYLOAD, key=str(rounds % 64))
                rounds += 1
            except partq.PartqError:
                failed += 1
    out.put((rounds, lost.count, failed))


def _aio_client(address: str, ca: str | None, queue: str, seconds: float, out) -> None:
    lost = Lost()
    logging.getLogger("partq.client").addHandler(lost)

    async def main() -> tuple[int, int]:
        rounds = failed = 0
        async with await partq.aio.connect(address, token=TOKEN, ssl=_context(ca)) as client:
            flow = await client.bind(queue)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    for msg in await flow.receive(max_messages=10, timeout=0.01):
                        await flow.ack(msg)
                    await client.publish(queue, PAYLOAD, key=str(rounds % 64))
                    rounds += 1
                except partq.PartqError:
                    failed += 1
        return rounds, failed
    rounds, failed = asyncio.run(main())
    out.put((rounds, lost.count, failed))


class Serve:
    """``partq serve`` on 127.0.0.1, with TLS when given a certificate."""

    def __init__(self, root: str, name: str, cert: tuple[str, str] | None) -> None:
        self.data = os.path.join(root, f"{name}-data")
        token = os.path.join(root, "token")
        with open(token, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(token, 0o600)
        with partq.Broker.open(self.data) as broker:
            for queue in ("sync", "aio"):
                broker.create_queue(queue, partitions=4)
        tls = ["--tls-cert", cert[0], "--tls-key", cert[1]] if cert else []
        self.proc = subprocess.Popen([PARTQ, "--data", self.data, "serve", "--listen",
                                      "127.0.0.1:0", "--token-file", token, *tls, "--json",
                                      "--log-level", "warning"],
                                     stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
        self.address = json.loads(self.proc.stdout.readline())["listen"]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def soak(serve: Serve, ca: str | None, seconds: float) -> tuple[float, int, int]:
    """Rounds per second of both clients together, connections lost, requests failed."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_sync_client, args=(serve.address, ca, "sync", seconds, out)),
             ctx.Process(target=_aio_client, args=(serve.address, ca, "aio", seconds, out))]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return (sum(r[0] for r in results) / seconds, sum(r[1] for r in results),
            sum(r[2] for r in results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 s slices, 1 pair: a smoke run")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    emit(header("tls_soak", args.pairs, seconds=seconds))
    import trustme
    root = tempfile.mkdtemp(prefix="partq-bench-tls-")
    try:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        paths = {name: os.path.join(root, name) for name in ("ca.pem", "cert.pem", "key.pem")}
        ca.cert_pem.write_to_path(paths["ca.pem"])
        cert.cert_chain_pems[0].write_to_path(paths["cert.pem"])
        cert.private_key_pem.write_to_path(paths["key.pem"])
        tls = Serve(root, "tls", (paths["cert.pem"], paths["key.pem"]))
        tcp = Serve(root, "tcp", None)
        rates: dict[str, list[float]] = {"tls": [], "tcp": []}
        lost = {"tls": 0, "tcp": 0}
        failed = {"tls": 0, "tcp": 0}
        try:
            for r in range(args.pairs):
                for side, serve, ca_path in (("tls", tls, paths["ca.pem"]), ("tcp", tcp, None)):
                    rate, dropped, errors = soak(serve, ca_path, seconds)
                    rates[side].append(rate)
                    lost[side] += dropped
                    failed[side] += errors
                    log("tls_soak", f"round {r + 1}: {side} {rate:.0f} rounds/s, {dropped} "
                                    f"connections lost, {errors} requests failed")
        finally:
            tls.stop()
            tcp.stop()
        emit(line("tls_soak_lost_connections", "connections", [lost["tls"]], "tcp_soak_lost_"
                  "connections", [lost["tcp"]], target=0, digits=0,
                  requests_failed=failed["tls"], peer_requests_failed=failed["tcp"],
                  seconds=seconds * args.pairs, clients="partq.connect + partq.aio"))
        emit(line("tls_soak_rounds_per_s", "rounds/s", rates["tls"], "tcp_soak_rounds_per_s",
                  rates["tcp"], note="receive(10) + ack each + publish 1 KiB, 2 clients"))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
