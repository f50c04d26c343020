"""bench/remote.py's socket lines (``--only sockets``) print well-formed JSON (no timing is asserted).

The reference-server lines run in the suite. RabbitMQ's boot alone takes 5 s or more here, and a
run beside both brokers about 30 s, so the RabbitMQ and NATS lines run only with
``PARTQ_BENCH_PEERS=1`` (and skip, saying why, when rabbitmq-server, nats-server or their Python
clients are not installed). A server that is missing must give lines that say why, never a
figure: the suite checks that with a PATH without nats-server. Every server is on 127.0.0.1.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bench_env, check_bench_lines

REPO = Path(__file__).resolve().parents[2]
CLIENTS = (1, 4)


def names(side: str) -> set[str]:
    """The lines of one side: partq serve beside it, and the figures of the reference and the
    in-process side as lines of their own."""
    if side == "in_process":
        return {template.format(n=n) for n in CLIENTS for template in (
            "in_process_publish_many_100_{n}_clients", "in_process_consume_ack_100_{n}_clients",
            "remote_publish_many_100_{n}_clients_vs_in_process",
            "remote_consume_ack_100_{n}_clients_vs_in_process")}
    own = {"reference": ("reference_publish_pipelined_100_{n}_clients",
                         "reference_consume_ack_100_{n}_clients",
                         "remote_publish_many_100_{n}_clients_vs_reference")}.get(side, ())
    return {template.format(n=n) for n in CLIENTS for template in (
        f"remote_publish_pipelined_100_{{n}}_clients_vs_{side}",
        f"remote_consume_ack_100_{{n}}_clients_vs_{side}", *own)}


def leftovers(scratch: Path) -> list[str]:
    """Processes still running that the bench started (they inherited TMPDIR=scratch)."""
    mark = f"TMPDIR={scratch}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                             .decode(errors="replace"))
        except OSError:
            continue
    return found


def run_sockets(tmp: Path, sides: str, path_env: str | None = None, timeout: float = 150):
    scratch = tmp / "scratch"
    scratch.mkdir()
    env = bench_env(REPO, scratch, path_env)
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "remote.py"), "--quick",
                           "--only", "sockets", "--sides", sides, "--seconds", "0.2",
                           "--prefill", "500"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert leftovers(scratch) == [], "the bench left server processes running"
    assert list(scratch.iterdir()) == [], "the bench left scratch directories behind"
    # a peer's figure is a line of its own only for the reference (checked equal when it is)
    lines = check_bench_lines(proc.stdout.splitlines(), skips=True, peers_in_run=False,
                              ratio_from="measured")
    assert next(iter(lines)) == "load_average_at_start"
    return lines


@pytest.mark.timeout(180)
def test_reference_lines_and_a_missing_server_says_why(tmp_path):
    python_dir = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in [python_dir, "/usr/local/bin", "/usr/bin", "/bin"]
                           if not (Path(p) / "nats-server").exists())
    lines = run_sockets(tmp_path, "reference,nats,in_process", path_env=path)
    assert set(lines) == ({"load_average_at_start"} | names("reference") | names("nats")
                          | names("in_process"))
    for name in names("reference"):
        row = lines[name]
        assert row.get("skipped") is None and row["value"] > 0, row
        assert row["durability"].startswith("equal"), row
        if name.startswith("remote_"):
            assert row["peer"] == name.replace("remote_", "reference_").replace(
                "_vs_reference", "").replace("publish_many", "publish_pipelined")
            assert row["target"] == 0.95 and row["ratio"] > 0 and row["pairs"] == 1, row
    for name in names("nats"):
        row = lines[name]
        assert row["value"] > 0, row              # partq's figure is measured all the same
        assert row["peer_value"] is None and row["ratio"] is None, row
        assert "nats" in row["peer_skipped"], row
        assert row["durability"].startswith("no fsync per publish: not equal durability"), row
    for n in CLIENTS:                             # one set of partq slices for every peer
        assert (lines[f"remote_publish_pipelined_100_{n}_clients_vs_reference"]["value"]
                == lines[f"remote_publish_pipelined_100_{n}_clients_vs_nats"]["value"])
        for kind in ("publish_many", "consume_ack"):   # the socket beside the same loop in-process
            row = lines[f"remote_{kind}_100_{n}_clients_vs_in_process"]
            assert row["peer"] == f"in_process_{kind}_100_{n}_clients", row
            assert row["value"] > 0 and row["peer_value"] > 0 and row["ratio"] > 0, row
            assert row.get("target") == (0.85 if n == 1 else None), row
            assert row["durability"].startswith("equal"), row
        assert (lines[f"remote_publish_many_100_{n}_clients_vs_in_process"]["value"]
                == lines[f"remote_publish_many_100_{n}_clients_vs_reference"]["value"])


def _missing_brokers() -> str | None:
    if os.environ.get("PARTQ_BENCH_PEERS") != "1":
        return ("RabbitMQ boots in 5 s or more: set PARTQ_BENCH_PEERS=1 to run the RabbitMQ and "
                "NATS lines")
    if not Path("/usr/lib/rabbitmq/bin/rabbitmq-server").exists():
        return "rabbitmq-server is not installed (apt-get install -y rabbitmq-server)"
    if shutil.which("nats-server") is None:
        return "nats-server is not installed (apt-get install -y nats-server)"
    for module, dist in (("pika", "pika"), ("nats", "nats-py")):
        if importlib.util.find_spec(module) is None:
            return f"the {dist} client is not installed (pip install {dist})"
    return None


@pytest.mark.timeout(240)
def test_rabbitmq_and_nats_lines(tmp_path):
    reason = _missing_brokers()
    if reason:
        pytest.skip(reason)
    lines = run_sockets(tmp_path, "rabbitmq,nats", timeout=220)
    assert set(lines) == {"load_average_at_start"} | names("rabbitmq") | names("nats")
    for name in names("rabbitmq") | names("nats"):
        row = lines[name]
        assert row.get("skipped") is None and row.get("peer_skipped") is None, row
        assert row["value"] > 0 and row["peer_value"] > 0 and row["ratio"] > 0, row
    for n in CLIENTS:
        row = lines[f"remote_publish_pipelined_100_{n}_clients_vs_rabbitmq"]
        assert row["peer"] == f"rabbitmq_quorum_publish_confirm_100_{n}_clients", row
        assert row["durability"].startswith("equal for publishes") and "RabbitMQ 3." in row["peer_version"]
        row = lines[f"remote_consume_ack_100_{n}_clients_vs_nats"]
        assert row["peer"] == f"nats_jetstream_fetch_ack_100_{n}_clients", row
        assert row["durability"].startswith("no fsync per publish: not equal durability"), row
        assert "nats-server" in row["peer_version"], row
