"""Prometheus metrics of an open broker (rule `metrics`): ``Broker.open(..., metrics_listen="HOST:PORT")``
or ``partq serve --metrics-listen HOST:PORT``. ``collector`` reads state and durable counts at
each scrape, ``instruments`` holds the histograms fed as commits, rebalances and handoffs
happen, ``endpoint`` serves them over HTTP; ``docs/operations.md`` lists the names."""
from partq.metrics.collector import BrokerCollector
from partq.metrics.durable import QueueCounts, queue_counts
from partq.metrics.endpoint import MetricsServer

__all__ = ["BrokerCollector", "MetricsServer", "QueueCounts", "queue_counts"]
