"""The Prometheus collector of one open broker: at every scrape it reads what the store and the
delivery owner say now and turns it into ``partq_*`` metric families (``docs/operations.md``
lists them). Nothing here runs between scrapes.

Three kinds of numbers, told apart in the docs:
* state, from the store and the delivery view of any process: depths, backlog bytes, statuses,
  flows, unacked counts, replication lag, store sizes;
* durable counters, from the store (``durable``): published, acked, discarded, rebalances,
  handoffs, dead messages, quota refusals and discards. They survive restarts and agree in
  every process that reads the directory;
* process counters, from this process's ``Tally``: messages its flows received, redeliveries
  among them, nacks (Prometheus treats their reset at a restart as counters do).

A queue whose status cannot be read (a damaged record) still gets ``partq_queue_up 0``; the
others are reported as usual.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import partq
from partq.delivery.dead_letter import REASONS as DEAD_REASONS
from partq.errors import PartqError
from partq.metrics.backlog import BacklogBytes, stored_bytes
from partq.metrics.durable import queue_counts
from partq.states import PartitionState, RebalanceState, ScalingState
from partq.storage.encoding import PARENT

log = logging.getLogger("partq.metrics")

PARTITION_STATES = tuple(s.value for s in PartitionState)
REBALANCE_STATES = tuple(s.value for s in RebalanceState)
SCALING_STATES = tuple(s.value for s in ScalingState)
FLOW_STATES = ("active", "standby", "unbound")


def partition_label(p: int) -> str:
    return "parent" if p == PARENT else str(p)


def flow_label(name: str | None, flow_id: str) -> str:
    """A flow's ``flow`` label: its name (stable across rebinds and restarts), else its id."""
    return name or flow_id


class _Families:
    """The families of one scrape, created on first use, yielded in creation order."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
        fam = self._by_name.get(name)
        if fam is None:
            fam = self._by_name[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        assert isinstance(fam, GaugeMetricFamily)
        return fam

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
        fam = self._by_name.get(name)
        if fam is None:
            fam = self._by_name[name] = CounterMetricFamily(name, doc, labels=list(labels))
        assert isinstance(fam, CounterMetricFamily)
        return fam

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._by_name.values())


class BrokerCollector(Collector):
    def __init__(self, broker, connections: Callable[[], dict[str, int]] | None = None) -> None:
        """``connections()``: open connections per listener, for a server that has listeners
        the broker does not know (``partq serve``)."""
        self.broker = broker
        self.connections = connections
        self._backlog = BacklogBytes()
        self._lock = threading.Lock()       # one scrape at a time: the backlog cache is shared

    def describe(self) -> list[Metric]:
        return []     # names depend on the store's contents; never collected at registration

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            fams = _Families()
            self._info(fams)
            seen: set[tuple[int, int]] = set()
            for config in sorted(self.broker.queues(), key=lambda c: c.name):
                try:
                    self._queue(fams, config, seen)
                except PartqError as exc:
                    log.warning("metrics: queue %r cannot be read: %s", config.name, exc)
                    fams.gauge("partq_queue_up", "1 when the queue's status could be read",
                               ("queue",)).add_metric([config.name], 0)
            self._backlog.keep_only(seen)
            self._process(fams)
            self._replication(fams)
            self._store(fams)
        yield from fams

    # ------------------------------------------------------------------ per queue
    def _queue(self, fams: _Families, config, seen: set[tuple[int, int]]) -> None:
        st = self.broker.queue_status(config.name)
        q = [config.name]
        with self.broker.store.read() as r:
            counts = queue_counts(r, config)
            backlog = {p.partition: self._backlog.measure(r, config.qid, p.partition, p.ack_floor)
                       for p in st.partitions}
            stored = stored_bytes(r, config.qid, backlog)
        seen.update((config.qid, p) for p in backlog)
        g, c = fams.gauge, fams.counter
        g("partq_queue_up", "1 when the queue's status could be read", ("queue",)).add_metric(q, 1)
        g("partq_queue_depth", "Messages published and not yet acked", ("queue",)) \
            .add_metric(q, st.depth)
        g("partq_queue_parent_depth", "Messages left in the parent queue's log of a partitioned "
          "queue by a change of access type (copy them out)", ("queue",)).add_metric(q, st.parent_depth)
        g("partq_queue_partitions", "Operating partition count (0 while exclusive)", ("queue",)) \
            .add_metric(q, st.partition_count)
        g("partq_queue_ingress_enabled", "1 when publishes are accepted", ("queue",)) \
            .add_metric(q, int(st.ingress_enabled))
        g("partq_queue_egress_enabled", "1 when messages are delivered", ("queue",)) \
            .add_metric(q, int(st.egress_enabled))
        states = g("partq_queue_rebalance_status",
                   "1 for the queue's rebalancing status (rule `rebalance-status`)", ("queue", "status"))
        for s in REBALANCE_STATES:
            states.add_metric([config.name, s], int(st.rebalance_status == s))
        states = g("partq_queue_scaling_status", "1 for the queue's scaling status (rule `scaling`)",
                   ("queue", "status"))
        for s in SCALING_STATES:
            states.add_metric([config.name, s], int(st.scaling_status == s))
        c("partq_published_messages", "Messages published (durable: from the store)",
          ("queue",)).add_metric(q, counts.published)
        c("partq_acked_messages", "Messages acked (durable: from the store)", ("queue",)) \
            .add_metric(q, counts.acked)
        c("partq_removed_messages", "Messages deleted unacked with their partition by a "
          "scale-down or a change to exclusive (durable)", ("queue",)).add_metric(q, counts.removed)
        c("partq_discarded_messages", "Publishes discarded while ingress was off (durable)",
          ("queue",)).add_metric(q, counts.discarded)
        c("partq_rebalances", "Rebalance decisions that moved or assigned partitions (durable)",
          ("queue",)).add_metric(q, counts.rebalances)
        handoffs = c("partq_handoffs", "Handoffs ended, by outcome: acked, timed_out "
                     "(max_handoff_time), source_left, cancelled (durable)", ("queue", "outcome"))
        for outcome, n in counts.handoffs.items():
            handoffs.add_metric([config.name, outcome], n)
        self._lifecycle(fams, config, st, stored)
        self._partitions(fams, config.name, st, counts, backlog)
        self._flows(fams, config.name, st)

    def _lifecycle(self, fams: _Families, config, st, stored: int) -> None:
        """Dead messages, quotas and nack delays (rules `dead-messages`, `quota`,
        `retry-delay`): from the queue's status and config, read for the rest of the scrape
        anyway, and ``stored`` (``stored_bytes``)."""
        g, c = fams.gauge, fams.counter
        q = [config.name]
        dead = c("partq_dead_messages", "Dead messages by reason: max_redelivery, expired, "
                 "rejected (durable)", ("queue", "reason"))
        for reason in DEAD_REASONS:
            dead.add_metric([config.name, reason], st.dead.get(reason, 0))
        c("partq_dead_messages_discarded", "Dead messages discarded for want of a dead message "
          "queue (durable)", ("queue",)).add_metric(q, st.dead.get("discarded", 0))
        c("partq_quota_refused", "Messages whose publish the queue's quota refused with QueueFull "
          "(durable)", ("queue",)).add_metric(q, st.quota_refused)
        c("partq_quota_discarded", "Messages the queue's quota discarded (reject_msg_to_sender "
          "off; durable)", ("queue",)).add_metric(q, st.quota_discarded)
        g("partq_delayed_partitions", "Partitions waiting out a nack's delay now (the delivery "
          "owner's)", ("queue",)).add_metric(q, st.delayed)
        g("partq_partitions_stuck", "Partitions stuck on a message that came back unacked "
          "(a poison message: `partq queue show` names it)", ("queue",)).add_metric(
            q, st.stuck_partitions)
        g("partq_oldest_unacked_age_seconds", "Seconds since the queue's oldest unacked message "
          "was published (0: nothing unacked)", ("queue",)).add_metric(
            q, 0.0 if st.oldest_unacked_ns is None
            else max(0.0, (self.broker.clock.wall_ns() - st.oldest_unacked_ns) / 1e9))
        g("partq_queue_max_depth", "The queue's max_depth quota: messages published and not "
          "acked (0: none)", ("queue",)).add_metric(q, config.max_depth)
        g("partq_queue_max_bytes", "The queue's max_bytes quota: bytes of its stored log (0: "
          "none)", ("queue",)).add_metric(q, config.max_bytes)
        g("partq_queue_stored_bytes", "Bytes of the queue's stored log, as max_bytes counts them",
          ("queue",)).add_metric(q, stored)

    def _partitions(self, fams: _Families, queue: str, st, counts, backlog: dict[int, int]) -> None:
        g = fams.gauge
        labels = ("queue", "partition")
        depth = g("partq_partition_depth", "Messages published to the partition and not yet acked",
                  labels)
        size = g("partq_partition_backlog_bytes", "Bytes the partition's log stores (unacked "
                 "records and acked ones sharing a chunk with them)", labels)
        unacked = g("partq_partition_unacked", "Messages delivered from the partition and not yet "
                    "acked", labels)
        published = fams.counter("partq_partition_published_messages", "Messages published to "
                                 "the partition (its next sequence; durable)", labels)
        status = g("partq_partition_status", "1 for the partition's status (rule `partition-status`)",
                   (*labels, "status"))
        held_keys = g("partq_held_keys", "Keys of the partition held back now (ordering=\"key\": "
                      "a nack, its delay, a handoff's draining keys, an online scaling's "
                      "cut-over)", labels)
        held = g("partq_held_messages", "Messages the partition's held keys hold back now",
                 labels)
        for p in st.partitions:
            held_keys.add_metric([queue, partition_label(p.partition)], p.held_keys)
            held.add_metric([queue, partition_label(p.partition)], p.held_messages)
            pl = [queue, partition_label(p.partition)]
            depth.add_metric(pl, p.depth)
            size.add_metric(pl, backlog.get(p.partition, 0))
            unacked.add_metric(pl, p.unacked)
            published.add_metric(pl, counts.partition_published.get(p.partition, p.next_seq))
            for s in PARTITION_STATES:
                status.add_metric([*pl, s], int(p.status == s))

    def _flows(self, fams: _Families, queue: str, st) -> None:
        g = fams.gauge
        by_status = dict.fromkeys(FLOW_STATES, 0)
        unacked: dict[str, int] = {}
        for p in st.partitions:
            if p.flow is not None:
                unacked[p.flow] = unacked.get(p.flow, 0) + p.unacked
        held: dict[str, int] = {}
        flow_unacked: dict[str, int] = {}
        for f in st.flows:      # a label names one flow; were two alike, their sums are shown
            by_status["unbound" if not f.bound else "active" if f.active else "standby"] += 1
            label = flow_label(f.name, f.flow)
            held[label] = held.get(label, 0) + len(f.partitions)
            flow_unacked[label] = flow_unacked.get(label, 0) + unacked.get(f.flow, 0)
        fam = g("partq_flow_partitions", "Partitions the flow holds", ("queue", "flow"))
        for label, n in held.items():
            fam.add_metric([queue, label], n)
        fam = g("partq_flow_unacked", "Messages delivered to the flow and not yet acked",
                ("queue", "flow"))
        for label, n in flow_unacked.items():
            fam.add_metric([queue, label], n)
        flows = g("partq_flows", "Flows by status: active (holds partitions), standby (bound, "
                  "holds none), unbound (gone, its partitions kept for the rebalance delay)",
                  ("queue", "status"))
        for s, n in by_status.items():
            flows.add_metric([queue, s], n)
        g("partq_consumer_processes", "Processes with flows bound to the queue", ("queue",)) \
            .add_metric([queue], len({f.client for f in st.flows if f.bound and f.client}))

    # ------------------------------------------------------------------ the process, the store
    def _info(self, fams: _Families) -> None:
        fams.gauge("partq_info", "partq's version", ("version",)).add_metric([partq.__version__], 1)

    def _process(self, fams: _Families) -> None:
        counts = self.broker.dispatcher.tally.counts()
        docs = {"delivered": "Messages handed to flows of this process (redeliveries included)",
                "redelivered": "Messages handed to flows of this process marked redelivered",
                "nacked": "Nacks by flows of this process"}
        for what, doc in docs.items():
            fam = fams.counter(f"partq_{what}_messages", doc + " since it opened the store",
                               ("queue",))
            for queue, n in sorted(counts[what].items()):
                fam.add_metric([queue], n)
        if self.connections is not None:
            conns = fams.gauge("partq_connections", "Open connections per listener", ("listener",))
            for listener, n in sorted(self.connections().items()):
                conns.add_metric([listener], n)

    def _replication(self, fams: _Families) -> None:
        try:
            st = self.broker.replication_status()
        except PartqError as exc:
            log.warning("metrics: replication status cannot be read: %s", exc)
            return
        g = fams.gauge
        g("partq_replication_role", "1 for this directory's role", ("role",)) \
            .add_metric([st.role], 1)
        if st.role == "standby":
            g("partq_standby_connected", "1 while this DR-standby is linked to its primary") \
                .add_metric([], int(st.connected))
            g("partq_standby_lag_messages", "Messages the primary has that this standby has not "
              "applied").add_metric([], st.lag_messages)
            g("partq_standby_lag_seconds", "Age of the oldest commit not applied here") \
                .add_metric([], st.lag_seconds)
            return
        connected = g("partq_replication_standby_connected", "1 while the standby is linked",
                      ("standby",))
        lag_msgs = g("partq_replication_lag_messages", "Messages committed here that the standby "
                     "has not confirmed", ("standby",))
        lag_s = g("partq_replication_lag_seconds", "Age of the oldest commit the standby has not "
                  "confirmed", ("standby",))
        for link in st.standbys:
            sl = [link.standby_id]
            connected.add_metric(sl, int(link.connected))
            lag_msgs.add_metric(sl, link.lag_messages)
            lag_s.add_metric(sl, link.lag_seconds)

    def _store(self, fams: _Families) -> None:
        store = self.broker.store
        usage = store.usage()
        g = fams.gauge
        g("partq_store_live_bytes", "Bytes of pages the data needs now").add_metric([], usage["live"])
        g("partq_store_high_water_bytes", "Bytes of the data file ever used (the file never "
          "shrinks; freed pages are reused)").add_metric([], usage["high_water"])
        g("partq_store_file_bytes", "Size of data.mdb").add_metric([], usage["file_size"])
        g("partq_store_map_bytes", "Current LMDB map size").add_metric([], usage["map_size"])
        g("partq_store_max_map_bytes", "The largest map the broker may grow to (writes fail "
          "with StorageFull past it)").add_metric([], store.max_map_size)
        g("partq_store_readers", "LMDB reader slots in use").add_metric([], usage["readers"])
        g("partq_store_disk_full", "1 while publishes fail with StorageFull because the disk "
          "cannot give data.mdb its reserve for acks (acks still run)").add_metric(
            [], int(usage["disk_full"]))
        g("partq_store_writer_stopped_pid", "The pid of a process stopped (SIGSTOP, a debugger) "
          "while it holds the store's write lock: every publish and ack of every process waits "
          "for it; 0 when none").add_metric([], usage["writer_stopped_pid"] or 0)
