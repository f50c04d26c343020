"""The worker's metrics per handler on the metrics endpoint: beside the store's on a directory,
on an endpoint of their own through partq serve."""
from __future__ import annotations

import urllib.request

from helpers import wait_until

import partq


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        return r.read().decode()


def value(text: str, name: str, queue: str = "jobs") -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'queue="{queue}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} of {queue} not in the scrape")


def test_handled_failed_retried_dead_running_and_latency_are_scraped_beside_the_stores(tmp_path):
    with partq.Broker.open(tmp_path) as b:
        b.create_queue("jobs", partitions=1, ordering="key")
        b.publish_many("jobs", [(b"bad", "x")] + [(b"ok", f"k{i}") for i in range(5)])
    w = partq.Worker(tmp_path, metrics_listen="127.0.0.1:0")

    @w.handler("jobs", retries=1, backoff=(0.01, 0.01))
    def handle(msg):
        if msg.payload == b"bad":
            raise KeyError("bad")

    w.start()
    try:
        wait_until(lambda: w.status()[0]["dead"] == 1 and w.status()[0]["handled"] == 5, 30,
                   "5 handled, 1 dead")
        text = scrape(w.metrics_address)
    finally:
        w.stop()
    assert value(text, "partq_worker_handled_total") == 5
    assert value(text, "partq_worker_failed_total") == 2
    assert value(text, "partq_worker_retried_total") == 1
    assert value(text, "partq_worker_dead_total") == 1
    assert value(text, "partq_worker_running") == 0
    assert value(text, "partq_worker_handler_duration_seconds_count") == 7
    assert "partq_queue_depth" in text              # the store's, on the same endpoint


def test_through_partq_serve_the_worker_serves_its_own_endpoint(tmp_path):
    token = "a-test-token-of-32-bytes-or-so!!"
    with partq.Broker.open(tmp_path / "data") as b:
        b.create_queue("jobs", partitions=1)
        b.publish("jobs", b"x")
    from partq.remote.server import Server
    with partq.Broker.open(tmp_path / "data") as b:
        server = Server(b, "127.0.0.1:0", token=token.encode())
        try:
            w = partq.Worker(address=server.address, token=token, metrics_listen="127.0.0.1:0")
            w.handler("jobs")(lambda msg: None)
            w.start()
            try:
                wait_until(lambda: w.status()[0]["handled"] == 1, 30, "1 handled")
                text = scrape(w.metrics_address)
            finally:
                w.stop()
        finally:
            server.close()
    assert value(text, "partq_worker_handled_total") == 1
    assert "partq_queue_depth" not in text
