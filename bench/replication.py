"""Replication benchmark (rule `replication`): publish throughput with no standby, an async standby and a sync
standby, side by side in one run, and the standby's lag under load.

    python bench/replication.py [--quick] [--seconds S] [--pairs N]

Prints one JSON object per line (``bench/method.py``): first the machine's load, then lines with
``name``, ``unit``, ``value``, and beside a peer ``peer``, ``peer_value``, ``ratio`` (the median
of the pairs' ratios) with ``ratio_min``, ``ratio_max`` and ``pairs``.

* ``publish_many_b100.<mode>``: msgs/s publishing batches of 100 messages of 256 bytes (keyed)
  from one thread;
* ``publish_single_8t.<mode>``: msgs/s of single ``publish`` calls from 8 threads (group commit);

Every configuration is opened once, with its standby process linked, and the workloads run in
slices interleaved across configurations (``bench/method.py``: one warm-up round, then
``--pairs`` rounds, 7 by default; a slice is ``--seconds`` / pairs, 8 s by default): a ratio is
the median of the rounds' ratios with its min and max, so the disk's drift and a shared
machine's load fall on both sides of every pair. After each slice the standby catches up before
the next configuration runs.

where ``<mode>`` is ``no_standby``, ``async_standby`` or ``sync_standby``; the standby runs in a
separate process (this script with ``--standby``) on 127.0.0.1, its directory on the same disk.
Every broker uses durability="sync" (fsync per commit, the default). Rows with a standby have
the no-standby figure of the same workload as their peer.

* ``replication_lag.<mode>.{messages,seconds}_{max,mean}``: the standby's lag as the primary
  reports it (``replication_status()``), sampled every 10 ms during both publish workloads (per
  round: the max or mean of that round's slices); the async figures have the sync ones as
  their peer.
* ``publish_many_b100.<async|sync>_standby_token`` and ``..._standby_tls``: the cost of
  authentication (a token proven at connect: it should cost nothing once linked) and of TLS
  (the token and TLS 1.3 from the standard ``ssl`` module, a certificate made for the run with
  ``trustme``), each with the plaintext figure of the same mode as its peer. Without ``trustme``
  the TLS lines are not printed (a line on stderr says so).
"""
from __future__ import annotations

import argparse
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from method import DEFAULT_PAIRS, emit, header, interleave, line, log  # noqa: E402

PAYLOAD = b"p" * 256
TOKEN = "bench-replication-token-0123456789"
# mode -> (replication mode, security): "plain" (protected mode, loopback), "token", "tls"
MODES = {"none": (None, "plain"), "async": ("async", "plain"), "sync": ("sync", "plain"),
         "async_token": ("async", "token"), "sync_token": ("sync", "token"),
         "async_tls": ("async", "tls"), "sync_tls": ("sync", "tls")}


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


class Setup:
    """One configuration, open for the whole run: a primary and (but for "none") its standby
    process, linked and caught up, with the two queues of the workloads."""

    def __init__(self, mode: str, workdir: str, certs: Certificates) -> None:
        self.mode = mode
        repl_mode, security = MODES[mode]
        kwargs: dict = {}
        if repl_mode is not None:
            kwargs = {"replication_listen": "127.0.0.1:0", "replication_mode": repl_mode,
                      "replication_token": None if security == "plain" else TOKEN,
                      "replication_ssl": certs.server if security == "tls" else None}
        self.broker = partq.Broker.open(os.path.join(workdir, mode, "primary"), **kwargs)
        self.standby: subprocess.Popen | None = None
        self.lag: dict[str, list[float]] = {}    # "messages_max" etc. -> one figure per slice
        try:
            if repl_mode is not None:     # linked first: a sync primary holds commits for it
                self.standby = start_standby(os.path.join(workdir, mode, "standby"),
                                             str(self.broker.replication_address), security,
                                             certs.ca_file)
                wait_linked(self.broker, self.standby)
            self.broker.create_queue("bm", partitions=8)
            self.broker.create_queue("bs", partitions=8)
            if repl_mode is not None:
                self.broker.update_queue("bm", rebalance_delay=5.0)   # an LSN to ack
                wait_caught_up(self.broker)
        except BaseException:
            self.close()
            raise

    def run(self, workload, seconds: float) -> float:
        """One slice of ``workload``; the lag sampled meanwhile; then the standby catches up."""
        sampler = LagSampler(self.broker) if self.standby is not None else None
        rate = workload(self.broker, seconds)
        if sampler is not None:
            sampler.stop()
            for series, samples in (("messages", sampler.messages or [0]),
                                    ("seconds", sampler.seconds or [0.0])):
                self.lag.setdefault(f"{series}_max", []).append(float(max(samples)))
                self.lag.setdefault(f"{series}_mean", []).append(statistics.fmean(samples))
            wait_caught_up(self.broker)
        return rate

    def close(self) -> None:
        self.broker.close()
        if self.standby is not None:
            self.standby.send_signal(signal.SIGTERM)
            try:
                self.standby.wait(30)
            except subprocess.TimeoutExpired:
                self.standby.kill()
                self.standby.wait()


WORKLOADS = {"publish_many_b100": publish_many_b100, "publish_single_8t": publish_single_8t}
SHOWN = {"none": "no_standby", "async": "async_standby", "sync": "sync_standby"}


def shown(mode: str) -> str:
    repl, _, security = mode.partition("_")
    return SHOWN[mode] if mode in SHOWN else f"{SHOWN[repl]}_{security}"


def per_round(values: list[float], stat: str) -> list[float]:
    """Lag figures of one configuration, one per slice, merged to one per round: a round ran
    a slice of each workload (``stat``: "max" or "mean" of them)."""
    n = len(WORKLOADS)
    merge = max if stat == "max" else statistics.fmean
    return [float(merge(values[i:i + n])) for i in range(0, len(values), n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    ap.add_argument("--seconds", type=float,
                    help="measuring time per workload and configuration, over all its slices "
                         "(default 8, or 0.5 with --quick)")
    ap.add_argument("--pairs", "--rounds", type=int, dest="pairs",
                    help=f"interleaved rounds after the warm-up (default {DEFAULT_PAIRS}, or 1 "
                         f"with --quick)")
    ap.add_argument("--standby", nargs=4, metavar=("DIR", "PRIMARY", "SECURITY", "CA"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.standby:
        return run_standby(*args.standby)
    pairs = max(1, args.pairs or (1 if args.quick else DEFAULT_PAIRS))
    seconds = args.seconds or (0.5 if args.quick else 8.0)
    t = seconds / pairs
    emit(header("replication", pairs, slice_seconds=round(t, 3)))
    workdir = tempfile.mkdtemp(prefix="partq-bench-repl-")
    certs = Certificates(workdir)
    modes = [m for m in MODES if MODES[m][1] != "tls" or certs.server is not None]
    if certs.server is None:
        log("replication", "trustme is not installed: no TLS lines (pip install trustme)")
    setups: dict[str, Setup] = {}
    try:
        for mode in modes:
            setups[mode] = Setup(mode, workdir, certs)
        jobs = [(f"{workload}.{shown(mode)}",
                 lambda s=setups[mode], w=WORKLOADS[workload]: s.run(w, t))
                for workload in WORKLOADS for mode in modes
                if workload == "publish_many_b100" or MODES[mode][1] == "plain"]
        m = interleave(jobs, pairs, warm=not args.quick, script="replication")
    finally:
        for setup in setups.values():
            setup.close()
        shutil.rmtree(workdir, ignore_errors=True)
    for workload in WORKLOADS:
        base = f"{workload}.no_standby"
        emit(line(base, "msgs/s", m[base]))
        for mode in ("async", "sync"):
            name = f"{workload}.{shown(mode)}"
            emit(line(name, "msgs/s", m[name], base, m[base]))
        for mode in modes:
            name = f"{workload}.{shown(mode)}"
            if MODES[mode][1] != "plain" and name in m:
                peer = f"{workload}.{shown(MODES[mode][0])}"
                emit(line(name, "msgs/s", m[name], peer, m[peer], digits=1))
    for series, unit in (("messages", "messages"), ("seconds", "s")):
        for stat in ("max", "mean"):
            key = f"{series}_{stat}"          # the warm-up round's slices are dropped
            a = per_round(setups["async"].lag[key], stat)[-pairs:]
            s = per_round(setups["sync"].lag[key], stat)[-pairs:]
            emit(line(f"replication_lag.async.{key}", unit, a, f"replication_lag.sync.{key}", s,
                      digits=4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
