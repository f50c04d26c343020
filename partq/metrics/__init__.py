"""Prometheus metrics of an open broker (rule `metrics`): ``Broker.open(..., metrics_listen="HOST:PORT")``
or ``partq serve --metrics-listen HOST:PORT``. ``collector`` reads state and durable counts at
each scrape, ``instruments`` holds the histograms fed as commits, rebalances and handoffs
happen, ``endpoint`` serves them over HTTP; ``docs/operations.md`` lists the names.

The names below load on first use (``partq.lazy``): importing one module of this room does
not import the others."""
from typing import TYPE_CHECKING

from partq.lazy import lazy_names

_NAMES = {"BrokerCollector": "collector", "QueueCounts": "durable", "queue_counts": "durable",
          "MetricsServer": "endpoint"}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
    from partq.metrics.collector import BrokerCollector as BrokerCollector
    from partq.metrics.durable import QueueCounts as QueueCounts
    from partq.metrics.durable import queue_counts as queue_counts
    from partq.metrics.endpoint import MetricsServer as MetricsServer
