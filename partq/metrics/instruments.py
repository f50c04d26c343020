"""The histograms fed as things happen in this process, not read at a scrape: group commits
(their duration, fsync included, and the messages each appended) from the store's commit hook,
and the durations of rebalances and handoffs from the dispatcher's ``Tally``. They exist only
while a metrics endpoint does: a broker that exposes nothing pays nothing for them.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

COMMIT_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
COMMIT_MESSAGES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
MOVE_SECONDS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Instruments:
    def __init__(self, registry: CollectorRegistry, store, tally) -> None:
        self.store, self.tally = store, tally
        self.commit_seconds = Histogram(
            "partq_commit_duration_seconds", "Group commits of this process: transaction and "
            "fsync", buckets=COMMIT_SECONDS, registry=registry)
        self.commit_messages = Histogram(
            "partq_commit_messages", "Messages appended per group commit of this process (commits "
            "that appended)", buckets=COMMIT_MESSAGES, registry=registry)
        self.durations = {
            "handoff": Histogram("partq_handoff_duration_seconds", "Handoffs this process carried "
                                 "out, from pause to reassignment (broker clock)", ["queue"],
                                 buckets=MOVE_SECONDS, registry=registry),
            "rebalance": Histogram("partq_rebalance_duration_seconds", "Rebalances this process "
                                   "decided, until the last handoff each started ended (broker "
                                   "clock)", ["queue"], buckets=MOVE_SECONDS, registry=registry),
        }
        store.on_commit_stats(self._committed)
        tally.add_observer(self._observed)

    def _committed(self, seconds: float, operations: int, appended: int) -> None:
        self.commit_seconds.observe(seconds)
        if appended:
            self.commit_messages.observe(appended)

    def _observed(self, what: str, queue: str, seconds: float) -> None:
        histogram = self.durations.get(what)
        if histogram is not None:
            histogram.labels(queue=queue).observe(seconds)

    def close(self) -> None:
        self.store.remove_commit_stats_hook(self._committed)
        self.tally.remove_observer(self._observed)
