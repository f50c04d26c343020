"""``partq serve --metrics-listen`` in a real subprocess: its metrics scraped over HTTP while a
client of ``partq.connect`` publishes, consumes and acks; ``partq top --address`` reading the
same server; and ``--log-format json`` writing one JSON object per log line."""
from __future__ import annotations

import json
import subprocess

from helpers import drain, wait_until
from metrics_helpers import scrape
from tools_helpers import PARTQ_SCRIPT

import partq


def test_serve_exposes_metrics_and_logs_json(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0.5)
    proc = subprocess.Popen([PARTQ_SCRIPT, "--data", str(data), "serve", "--listen", "127.0.0.1:0",
                             "--metrics-listen", "127.0.0.1:0", "--log-format", "json", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = json.loads(proc.stdout.readline())
        metrics = started["metrics"]
        assert metrics.startswith("127.0.0.1:")
        with partq.connect(started["listen"]) as client:
            client.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(6)])
            flow = client.bind("q", name="remote")
            assert len(drain(flow, timeout=0.5, at_least=6)) == 6

            def acked():
                s = scrape(metrics)
                return s if s.value("partq_acked_messages_total", queue="q") == 6 else None
            s = wait_until(acked, 30, "the acks in the server's metrics")
            assert s.value("partq_published_messages_total", queue="q") == 6
            assert s.value("partq_delivered_messages_total", queue="q") == 6
            assert s.value("partq_connections", listener="serve") == 1
            assert s.value("partq_flows", queue="q", status="active") == 1
            assert s.value("partq_flow_partitions", queue="q", flow="remote") == 2

            top = subprocess.run([PARTQ_SCRIPT, "top", "--address", started["listen"], "--json",
                                  "--count", "2", "--interval", "0.1"],
                                 capture_output=True, text=True, timeout=60)
            assert top.returncode == 0, top.stderr
            docs = [json.loads(line) for line in top.stdout.splitlines()]
            assert len(docs) == 2 and docs[0]["source"] == started["listen"]
            (queue,) = docs[1]["queues"]
            assert queue["name"] == "q" and queue["depth"] == 0
            assert [f["name"] for f in queue["flows"]] == ["remote"]
            assert docs[1]["replication"]["role"] == "primary"
        proc.send_signal(15)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    logged = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(doc) for doc in logged)
    messages = [d["message"] for d in logged]
    assert any("serving Prometheus metrics on http://" + metrics in m for m in messages)
    assert any("rebalance after flow remote bound" in m for m in messages)
    assert any("disconnected" in m for m in messages)
