"""Replication benchmark (S27): publish throughput with no standby, an async standby and a sync
standby, side by side in one run, and the standby's lag under load.

    python bench/replication.py [--quick] [--seconds S] [--rounds R]

Prints one JSON object per line: ``name``, ``unit``, ``value``, ``peer``, ``peer_value``, ``ratio``
(value / peer_value, null without a peer or when the peer is 0).

* ``publish_many_b100.<mode>``: msgs/s publishing batches of 100 messages of 256 bytes (keyed)
  from one thread;
* ``publish_single_8t.<mode>``: msgs/s of single ``publish`` calls from 8 threads (group commit);

each workload runs for a fixed time (``--seconds``, 6 by default, 0.5 with ``--quick``) and the
modes take turns, ``--rounds`` times (2 by default; after one unreported warm-up run), every other
round in the reverse order: a figure is the median of its rounds, so disk noise, warm-up and the
load of a shared machine do not favour the modes that run last.

where ``<mode>`` is ``no_standby``, ``async_standby`` or ``sync_standby``; the standby runs in a
separate process (this script with ``--standby``) on 127.0.0.1, its directory on the same disk.
Every broker uses durability="sync" (fsync per commit, the default). Rows with a standby have
the no-standby figure of the same workload as their peer.

* ``replication_lag.<mode>.{messages,seconds}_{max,mean}``: the standby's lag as the primary
  reports it (``replication_status()``), sampled every 10 ms during both publish workloads;
  the async figures have the sync ones as their peer.
* ``publish_many_b100.<async|sync>_standby_token`` and ``..._standby_tls``: the cost of
  authentication (a token proven at connect: it should cost nothing once linked) and of TLS
  (the token and TLS 1.3 from the standard ``ssl`` module, a certificate made for the run with
  ``trustme``), each with the plaintext figure of the same mode as its peer. Without ``trustme``
  the TLS lines are not printed (a line on stderr says so).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import partq

PAYLOAD = b"p" * 256
TOKEN = "bench-replication-token-0123456789"
# mode -> (replication mode, security): "plain" (protected mode, loopback), "token", "tls"
MODES = {"none": (None, "plain"), "async": ("async", "plain"), "sync": ("sync", "plain"),
         "async_token": ("async", "token"), "sync_token": ("sync", "token"),
         "async_tls": ("async", "tls"), "sync_tls": ("sync", "tls")}


def emit(name: str, unit: str, value: float, peer: str | None = None,
         peer_value: float | None = None) -> None:
    ratio = value / peer_value if peer_value else None
    print(json.dumps({"name": name, "unit": unit, "value": round(value, 4), "peer": peer,
                      "peer_value": None if peer_value is None else round(peer_value, 4),
                      "ratio": None if ratio is None else round(ratio, 4)}), flush=True)


# ---------------------------------------------------------------------- standby process
def run_standby(path: str, primary: str, security: str, ca: str) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    context = None
    if security == "tls":
        context = ssl.create_default_context(cafile=ca)
    broker = partq.Broker.open(path, standby_of=primary,
                               replication_token=None if security == "plain" else TOKEN,
                               replication_ssl=context)
    try:
        stop.wait()
    finally:
        broker.close()
    return 0


def start_standby(path: str, primary: str, security: str, ca: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--standby", path, primary,
                             security, ca])


class Certificates:
    """A CA and a server certificate for 127.0.0.1, made for this run (None without trustme)."""

    def __init__(self, workdir: str) -> None:
        try:
            import trustme
        except ImportError:
            self.ca_file = ""
            self.server = None
            return
        ca = trustme.CA()
        self.ca_file = os.path.join(workdir, "ca.pem")
        ca.cert_pem.write_to_path(self.ca_file)
        self.server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(self.server)


# ---------------------------------------------------------------------- workloads
def publish_many_b100(broker: partq.Broker, seconds: float) -> float:
    items = [(PAYLOAD, f"k{i}") for i in range(100)]
    started = time.perf_counter()
    deadline = started + seconds
    sent = 0
    while time.perf_counter() < deadline:
        broker.publish_many("bm", items)
        sent += 100
    return sent / (time.perf_counter() - started)


def publish_single_8t(broker: partq.Broker, seconds: float) -> float:
    counts = [0] * 8
    deadline = time.perf_counter() + seconds

    def worker(n: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            broker.publish("bs", PAYLOAD, key=f"k{n}-{i % 50}")
            i += 1
        counts[n] = i

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


class LagSampler:
    """Samples the primary's view of the standby's lag every 10 ms."""

    def __init__(self, broker: partq.Broker) -> None:
        self.broker = broker
        self.messages: list[int] = []
        self.seconds: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            st = self.broker.replication_status()
            self.messages.append(st.lag_messages)
            self.seconds.append(st.lag_seconds)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_caught_up(broker: partq.Broker, timeout: float = 120) -> None:
    """Until the standby acked the primary's head. (Not ``connected``: a link thread of an older
    connection of the same standby can clear that flag after the standby reconnected.)"""
    deadline = time.monotonic() + timeout
    while True:
        st = broker.replication_status()
        if st.standbys and st.applied_lsn >= st.head_lsn:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the standby did not catch up within {timeout} s: {st}")
        time.sleep(0.01)


def wait_linked(broker: partq.Broker, standby: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not broker.replication_status().connected:
        if standby.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the standby did not connect (exit status {standby.poll()})")
        time.sleep(0.01)


def run_mode(mode: str, seconds: float, workdir: str, certs: Certificates) -> dict:
    """One broker (and standby) per mode; both workloads on the plain modes, publish_many_b100
    alone on the token and TLS ones. Returns rates and lag samples."""
    path = os.path.join(workdir, mode, "primary")
    repl_mode, security = MODES[mode]
    kwargs: dict = {}
    if repl_mode is not None:
        kwargs = {"replication_listen": "127.0.0.1:0", "replication_mode": repl_mode,
                  "replication_token": None if security == "plain" else TOKEN,
                  "replication_ssl": certs.server if security == "tls" else None}
    broker = partq.Broker.open(path, **kwargs)
    standby = None
    try:
        sampler = None
        if repl_mode is not None:     # linked first: a sync primary holds commits for it
            standby = start_standby(os.path.join(workdir, mode, "standby"),
                                    str(broker.replication_address), security, certs.ca_file)
            wait_linked(broker, standby)
        broker.create_queue("bm", partitions=8)
        broker.create_queue("bs", partitions=8)
        if repl_mode is not None:
            broker.update_queue("bm", rebalance_delay=5.0)   # one LSN the standby must ack
            wait_caught_up(broker)
            sampler = LagSampler(broker)
        result = {"publish_many_b100": publish_many_b100(broker, seconds)}
        if security == "plain":
            result["publish_single_8t"] = publish_single_8t(broker, seconds)
        if sampler is not None:
            sampler.stop()
            result["lag_messages"] = sampler.messages or [0]
            result["lag_seconds"] = sampler.seconds or [0.0]
            wait_caught_up(broker)
        return result
    finally:
        broker.close()
        if standby is not None:
            standby.send_signal(signal.SIGTERM)
            try:
                standby.wait(30)
            except subprocess.TimeoutExpired:
                standby.kill()
                standby.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    ap.add_argument("--seconds", type=float, help="time per workload and mode (default 6)")
    ap.add_argument("--rounds", type=int, help="turns of the three modes (default 2)")
    ap.add_argument("--standby", nargs=4, metavar=("DIR", "PRIMARY", "SECURITY", "CA"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.standby:
        return run_standby(*args.standby)
    seconds = args.seconds or (0.5 if args.quick else 6.0)
    rounds = args.rounds or (1 if args.quick else 2)
    workdir = tempfile.mkdtemp(prefix="partq-bench-repl-")
    certs = Certificates(workdir)
    modes = [m for m in MODES if MODES[m][1] != "tls" or certs.server is not None]
    if certs.server is None:
        print("trustme is not installed: no TLS lines (pip install trustme)", file=sys.stderr)
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    try:
        if not args.quick:
            run_mode("none", seconds / 2, os.path.join(workdir, "warmup"), certs)
        for r in range(rounds):       # every other round backwards: no mode always runs late
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                runs[mode].append(run_mode(mode, seconds, os.path.join(workdir, f"{r}"), certs))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for workload in ("publish_many_b100", "publish_single_8t"):
        rate = {mode: statistics.median(run[workload] for run in runs[mode]) for mode in modes
                if workload in runs[mode][0]}
        emit(f"{workload}.no_standby", "msgs/s", rate["none"])
        for mode in ("async", "sync"):
            emit(f"{workload}.{mode}_standby", "msgs/s", rate[mode],
                 f"{workload}.no_standby", rate["none"])
        for mode in ("async", "sync"):
            for security in ("token", "tls"):
                if f"{mode}_{security}" in rate:
                    emit(f"{workload}.{mode}_standby_{security}", "msgs/s",
                         rate[f"{mode}_{security}"], f"{workload}.{mode}_standby", rate[mode])
    for series, unit in (("messages", "messages"), ("seconds", "s")):
        for stat, fn in (("max", max), ("mean", statistics.fmean)):
            values = {mode: float(fn([v for run in runs[mode] for v in run[f"lag_{series}"]]))
                      for mode in ("async", "sync")}
            emit(f"replication_lag.async.{series}_{stat}", unit, values["async"],
                 f"replication_lag.sync.{series}_{stat}", values["sync"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
