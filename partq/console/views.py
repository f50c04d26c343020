"""The console's JSON views, built from the Broker's own reports: ``overview`` (every queue, the
store, replication, a chart of the whole store's rates), ``queue`` (partitions, flows, what
blocks a partition, scaling and the rebalance dry-run, a chart of its rates) and ``messages``
(a partition or a key browsed as ``partq inspect`` does, or the dead messages of a dead message
queue with their reasons). The page is a thin client of these; scripts may read them too.

The overview is built at most once per ``refresh`` seconds whatever the number of pages open,
and ``refresh`` grows with what a build costs (``COST_SHARE``): a console left open costs the
process that serves it under 1% of a core, however many queues the store holds (1,000 queues of
16 partitions: an overview every few seconds; bench/console.py measures both).
"""
from __future__ import annotations

import base64
import json
import threading
import time
from typing import TYPE_CHECKING

from partq.console.history import TOTAL, History
from partq.errors import PartqError
from partq.metrics.backlog import BacklogBytes, stored_bytes
from partq.metrics.durable import published_acked
from partq.ops.browse import browse
from partq.ops.formatting import one_line
from partq.ops.stats import dead_total, store_usage

if TYPE_CHECKING:
    from partq.broker import Broker
    from partq.config import QueueConfig
    from partq.status import QueueStatus

MIN_REFRESH = 1.0       # seconds between overview builds, at least
# the share of a core the overview's builds may cost while a console is open: refresh >= cost /
# this (half of the 1% a console may cost, the rest left for HTTP and the page's other requests)
COST_SHARE = 0.005
MAX_BROWSE = 500        # messages one request of the messages view returns, at most
PREVIEW = 240           # characters of a payload shown


class Views:
    """The views of one broker. Thread-safe: requests of several pages build them at once."""

    def __init__(self, broker: Broker, clock=time.monotonic) -> None:
        self.broker = broker
        self.history = History()
        self._clock = clock
        self._backlog = BacklogBytes()
        self._backlog_lock = threading.Lock()
        self._overview_lock = threading.Lock()
        self._overview: bytes | None = None
        self._built_at = 0.0
        self.refresh = MIN_REFRESH

    # ------------------------------------------------------------------ overview
    def overview_json(self) -> bytes:
        """The overview as JSON bytes, built anew when the last one is ``refresh`` old."""
        with self._overview_lock:
            now = self._clock()
            if self._overview is None or now - self._built_at >= self.refresh * 0.9:
                started = time.thread_time()        # (the build runs in this thread)
                doc = self.overview()
                # the page waits this long before asking again (its JSON encoding, about a
                # tenth of the build, counted in)
                self.refresh = max(MIN_REFRESH, 1.1 * (time.thread_time() - started) / COST_SHARE)
                doc["refresh"] = round(self.refresh, 2)
                self._overview = json.dumps(doc, separators=(",", ":")).encode()
                self._built_at = now
            return self._overview

    def invalidate(self) -> None:
        """Build the next overview anew (an action changed something)."""
        with self._overview_lock:
            self._overview = None

    def overview(self) -> dict:
        """Every queue's row (``queue_row``), the store's sizes, replication, and the chart of
        the whole store's rates."""
        now = self._clock()
        rows = [self.queue_row(config, now)
                for config in sorted(self.broker.queues(), key=lambda c: c.name)]
        published = sum(r["published"] or 0 for r in rows)
        acked = sum(r["acked"] or 0 for r in rows)
        self.history.record(TOTAL, now, published, acked)
        self.history.forget_others({TOTAL, *(r["name"] for r in rows)}, now)
        rate_in, rate_out = self.history.rates(TOTAL)
        return {"path": self.broker.path, "queues": rows,
                "totals": {"queues": len(rows), "depth": sum(r["depth"] or 0 for r in rows),
                           "bytes": sum(r["bytes"] or 0 for r in rows),
                           "dead": sum(r["dead"] or 0 for r in rows),
                           "in_rate": rate_in, "out_rate": rate_out},
                "chart": self.history.chart(TOTAL, now), "store": self._store(),
                "replication": self._replication(), "refresh": round(self.refresh, 2),
                "generated_at": time.time()}

    def queue_row(self, config: QueueConfig, now: float) -> dict:
        """One queue of the overview: its settings (ordering, ingress, egress, quotas), its
        depth, stored bytes, durable published and acked counts and their rates, dead messages,
        quota use, flows and statuses; ``error`` when its status cannot be read."""
        row: dict = {"name": config.name, "access_type": config.access_type,
                     "ordering": config.ordering, "partitions": config.operating_partitions,
                     "ingress_enabled": config.ingress_enabled,
                     "egress_enabled": config.egress_enabled,
                     "dead_message_queue": config.dead_message_queue or None,
                     "max_depth": config.max_depth, "max_bytes": config.max_bytes,
                     "error": None}
        try:
            st = self.broker.queue_status(config.name)
            published, acked, size = self._counts(config, st)
        except PartqError as exc:
            row.update(depth=None, bytes=None, published=None, acked=None, in_rate=0.0,
                       out_rate=0.0, dead=None, error=one_line(str(exc)))
            return row
        self.history.record(config.name, now, published, acked)
        rate_in, rate_out = self.history.rates(config.name)
        row.update(
            partitions=st.partition_count, depth=st.depth, bytes=size,
            published=published, acked=acked, in_rate=rate_in, out_rate=rate_out,
            dead=dead_total(st.dead), dead_by_reason=st.dead, quota_refused=st.quota_refused,
            quota_discarded=st.quota_discarded, discarded=st.discarded,
            depth_use=st.depth / config.max_depth if config.max_depth else None,
            bytes_use=size / config.max_bytes if config.max_bytes else None,
            flows=sum(1 for f in st.flows if f.bound),
            active_flows=sum(1 for f in st.flows if f.bound and f.active),
            rebalance_status=st.rebalance_status, scaling_status=st.scaling_status,
            stuck_partitions=st.stuck_partitions, delivery_owner=st.delivery_owner,
            oldest_unacked_ns=st.oldest_unacked_ns, warnings=st.warnings)
        return row

    def _counts(self, config: QueueConfig, st: QueueStatus) -> tuple[int, int, int]:
        """Messages published and acked (durable counts) and bytes stored, with ``st``'s
        backlog (read moments before: a rate between two samples may be a message off)."""
        with self.broker.store.read() as r, self._backlog_lock:
            published, acked = published_acked(r, config.qid, st.depth + st.parent_depth)
            backlog = {p.partition: self._backlog.measure(r, config.qid, p.partition, p.ack_floor)
                       for p in st.partitions}
            return published, acked, stored_bytes(r, config.qid, backlog)

    def _store(self) -> dict:
        try:
            return store_usage(self.broker.store)
        except PartqError as exc:
            return {"error": one_line(str(exc))}

    def _replication(self) -> dict:
        try:
            return self.broker.replication_status().as_dict()
        except PartqError as exc:
            return {"error": one_line(str(exc))}

    # ------------------------------------------------------------------ one queue
    def queue(self, name: str) -> dict:
        """One queue: ``config``, ``status`` (partitions with status, owner flow, depth, ack
        floor, held keys and ``blocked``; flows with process, age and heartbeat), ``row`` (its
        overview row: rates, bytes, quota use), ``rebalance`` (the dry-run plan of the current
        consumers, or ``{"error"}``) and ``chart``. Raises ``QueueNotFound``."""
        config = self.broker.queue_config(name)
        now = self._clock()
        row = self.queue_row(config, now)
        st = self.broker.queue_status(name)
        status = st.as_dict()
        wall = time.time()
        for flow in status["flows"]:
            at = flow.get("connected_at")
            flow["age"] = None if at is None else max(0.0, wall - at)
        try:
            plan = self.broker.rebalance_plan(name)
        except PartqError as exc:
            plan = {"error": one_line(str(exc))}
        return {"name": name, "config": config.to_dict(), "status": status, "row": row,
                "rebalance": plan, "chart": self.history.chart(name, now),
                "refresh": round(self.refresh, 2)}

    # ------------------------------------------------------------------ messages
    def messages(self, name: str, partition: int | None = None, key: str | None = None,
                 from_seq: int = 0, limit: int = 100, dead: bool = False) -> dict:
        """Stored messages of queue ``name`` as ``partq inspect`` browses them (``partition``,
        ``key``, ``from_seq``, at most ``limit``, at most ``MAX_BROWSE``); ``dead``: only the
        unacked ones, for a dead message queue, each with its ``dead_reason`` and origin."""
        limit = max(1, min(limit or MAX_BROWSE, MAX_BROWSE))
        rows: list[dict] = []
        more = False
        for row in browse(self.broker.store, name, partition=partition, from_seq=from_seq,
                          key=key, limit=0 if dead else limit + 1):
            if dead and row["acked"]:
                continue
            if len(rows) == limit:
                more = True
                break
            rows.append(_message(row))
        return {"queue": name, "partition": partition, "key": key, "from_seq": from_seq,
                "dead": dead, "messages": rows, "more": more}


def _message(row: dict) -> dict:
    """A browsed message as JSON: the payload as text when it is UTF-8 (else base64), cut to
    ``PREVIEW`` characters; headers made JSON-safe."""
    if row.get("corrupt"):
        return {k: row[k] for k in ("partition", "seq", "corrupt", "error", "acked", "size")}
    payload: bytes = row["payload"]
    try:
        text, encoding = payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(payload[:PREVIEW]).decode("ascii"), "base64"
    headers = _json_safe(row["headers"] or {})
    return {"partition": row["partition"], "seq": row["seq"], "key": row["key"],
            "publish_time_ns": row["publish_time_ns"], "size": row["size"],
            "acked": row["acked"], "payload": text[:PREVIEW], "payload_encoding": encoding,
            "truncated": len(text) > PREVIEW, "headers": headers,
            "delivery_count": row.get("delivery_count"), "redelivered": row.get("redelivered"),
            "next_retry": row.get("next_retry"), "dead_reason": row.get("dead_reason"),
            "origin_queue": headers.get("origin_queue")}


def _json_safe(value):
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
