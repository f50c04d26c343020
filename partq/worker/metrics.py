"""The worker's Prometheus metrics, per handler (labels ``queue`` and ``handler``):
``partq_worker_handled_total``, ``partq_worker_failed_total``, ``partq_worker_retried_total``,
``partq_worker_dead_total`` (counters of this process), ``partq_worker_running`` and
``partq_worker_slow`` (handlers running now, and those of them past ``warn_after``),
``partq_worker_buffered`` (received ahead, not done) and the histogram
``partq_worker_handler_duration_seconds``. On a directory they are served beside the broker's
on its metrics endpoint; through ``partq serve`` on an endpoint of their own."""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from partq.metrics import MetricsServer

LABELS = ["queue", "handler"]
COUNTERS = (("handled", "Messages whose handler returned, acked"),
            ("failed", "Handler runs that raised"),
            ("retried", "Failed messages given back for a retry after a backoff"),
            ("dead", "Failed messages out of retries, moved to the dead message queue"))


class WorkerCollector(Collector):
    def __init__(self, runners, clock) -> None:
        self.runners, self.clock = runners, clock

    def collect(self) -> Iterator[Metric]:
        counters = {name: CounterMetricFamily(f"partq_worker_{name}", text, labels=LABELS)
                    for name, text in COUNTERS}
        running = GaugeMetricFamily("partq_worker_running", "Handlers running now", labels=LABELS)
        slow = GaugeMetricFamily("partq_worker_slow", "Handlers running past their warn_after "
                                 "now", labels=LABELS)
        buffered = GaugeMetricFamily("partq_worker_buffered", "Messages received ahead and not "
                                     "done", labels=LABELS)
        latency = HistogramMetricFamily("partq_worker_handler_duration_seconds", "Handler runs, "
                                        "from start to return or raise", labels=LABELS)
        now = self.clock.now()
        for runner in self.runners:
            status = runner.status(now)
            labels = [status["queue"], status["handler"]]
            for name, family in counters.items():
                family.add_metric(labels, status[name])
            running.add_metric(labels, status["running"])
            slow.add_metric(labels, len(status["slow"]))
            buffered.add_metric(labels, status["buffered"])
            buckets, total = runner.stats.histogram()
            latency.add_metric(labels, buckets, total)
        yield from counters.values()
        yield from (running, slow, buffered, latency)


class WorkerMetrics:
    """Where the worker's metrics are served: ``address``, ``close()``."""

    def __init__(self, address: str | None, close) -> None:
        self.address = address
        self.close = close


def serve_metrics(broker, client_listen: str | None, runners, clock) -> WorkerMetrics:
    """On ``broker``'s endpoint (a directory opened with ``metrics_listen``), else on an
    endpoint of their own at ``client_listen``."""
    collector = WorkerCollector(runners, clock)
    if broker is not None and broker.add_metrics(collector):
        return WorkerMetrics(broker.metrics_address, lambda: None)
    server = MetricsServer(None, client_listen or "127.0.0.1:0")
    server.add(collector)
    return WorkerMetrics(server.address, server.close)
