"""The metrics endpoint of an embedded broker (rule `metrics`), scraped over real HTTP on 127.0.0.1 after a
scripted scenario driven by a ManualClock: publish, bind two flows, a holddown, a rebalance with
one handoff that is acked and one that times out, redelivery, a nack, acks, a discard. Every
value is checked against what the scenario did; then the broker is reopened and the durable
counters are what they were."""
from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.request

import pytest
from helpers import wait_until
from metrics_helpers import scrape

import partq
from partq.metrics import MetricsServer
from partq.metrics.backlog import BacklogBytes


def _scenario(data_dir, clock) -> dict:
    """Run the scenario on a broker with a metrics endpoint; return what a test checks."""
    seen: dict = {}
    broker = partq.Broker.open(data_dir, clock=clock, metrics_listen="127.0.0.1:0")
    try:
        address = broker.metrics_address
        assert address.startswith("127.0.0.1:")
        broker.create_queue("orders", partitions=4, rebalance_delay=5.0, max_handoff_time=3.0,
                            redelivery_delay=0)         # the nack below: back at once
        results = broker.publish_many("orders", [(b"x" * 200, f"k{i}") for i in range(40)])
        per_partition = {p: sum(1 for r in results if r.partition == p) for p in range(4)}
        seen["per_partition"] = per_partition

        s = scrape(address)
        assert s.value("partq_published_messages_total", queue="orders") == 40
        assert s.value("partq_acked_messages_total", queue="orders") == 0
        assert s.value("partq_queue_depth", queue="orders") == 40
        for p, n in per_partition.items():
            assert s.value("partq_partition_depth", queue="orders", partition=p) == n
            assert s.value("partq_partition_published_messages_total", queue="orders",
                           partition=p) == n
            # 200-byte payloads, framed: more than the payloads alone
            assert s.value("partq_partition_backlog_bytes", queue="orders", partition=p) > 200 * n
            assert s.value("partq_partition_status", queue="orders", partition=p,
                           status="Unassigned") == 1
        assert s.value("partq_commit_messages_count") >= 1
        assert s.value("partq_commit_messages_sum") == 40

        a = broker.bind("orders", name="a")
        got_a = a.receive(100, timeout=0)
        assert len(got_a) == 40
        c = broker.bind("orders", name="c")          # a second consumer: holddown (rule `rebalance-delay`)
        s = scrape(address)
        assert s.value("partq_queue_rebalance_status", queue="orders", status="Holddown") == 1
        assert s.value("partq_flows", queue="orders", status="active") == 1
        assert s.value("partq_flows", queue="orders", status="standby") == 1
        assert s.value("partq_flow_unacked", queue="orders", flow="a") == 40
        assert s.value("partq_flow_partitions", queue="orders", flow="a") == 4
        assert s.value("partq_rebalances_total", queue="orders") == 1   # a's first assignment

        clock.advance(5.0)
        broker.tick()                                # the delay ends: 2 and 3 hand off to c
        st = broker.queue_status("orders")
        moving = sorted(p.partition for p in st.partitions if p.status == "Paused")
        assert moving == [2, 3]
        s = scrape(address)
        assert s.value("partq_queue_rebalance_status", queue="orders", status="Rebalancing") == 1
        for p in moving:
            assert s.value("partq_partition_status", queue="orders", partition=p,
                           status="Paused") == 1
            assert s.value("partq_partition_unacked", queue="orders", partition=p) == \
                per_partition[p]

        a.ack_many([m for m in got_a if m.partition != 2])   # partition 3's handoff completes
        clock.advance(3.0)
        broker.tick()                                # partition 2's handoff times out
        again = c.receive(100, timeout=0)
        assert len(again) == per_partition[2] and all(m.redelivered for m in again)
        c.nack(again[0])                             # all of them come back once more
        again2 = c.receive(100, timeout=0)
        assert [m.seq for m in again2] == [m.seq for m in again]
        c.ack_many(again2)

        broker.update_queue("orders", ingress_enabled=False, reject_msg_to_sender=False)
        assert broker.publish("orders", b"dropped").discarded
        broker.update_queue("orders", ingress_enabled=True)

        s = scrape(address)
        n2 = per_partition[2]
        assert s.value("partq_published_messages_total", queue="orders") == 40
        assert s.value("partq_acked_messages_total", queue="orders") == 40
        assert s.value("partq_discarded_messages_total", queue="orders") == 1
        assert s.value("partq_queue_depth", queue="orders") == 0
        assert s.value("partq_rebalances_total", queue="orders") == 2
        assert s.value("partq_handoffs_total", queue="orders", outcome="acked") == 1
        assert s.value("partq_handoffs_total", queue="orders", outcome="timed_out") == 1
        assert s.value("partq_handoffs_total", queue="orders", outcome="source_left") == 0
        # the acked handoff ended at once, the timed-out one after max_handoff_time (3 s)
        assert s.value("partq_handoff_duration_seconds_count", queue="orders") == 2
        assert s.value("partq_handoff_duration_seconds_sum", queue="orders") == 3.0
        assert s.value("partq_handoff_duration_seconds_bucket", queue="orders", le="0.001") == 1
        assert s.value("partq_rebalance_duration_seconds_count", queue="orders") == 2
        assert s.value("partq_rebalance_duration_seconds_sum", queue="orders") == 3.0
        assert s.value("partq_delivered_messages_total", queue="orders") == 40 + 2 * n2
        assert s.value("partq_redelivered_messages_total", queue="orders") == 2 * n2
        assert s.value("partq_nacked_messages_total", queue="orders") == 1
        assert s.value("partq_queue_rebalance_status", queue="orders", status="Ready") == 1
        assert s.value("partq_flows", queue="orders", status="active") == 2
        assert s.value("partq_flow_partitions", queue="orders", flow="c") == 2
        assert s.value("partq_consumer_processes", queue="orders") == 1
        for p in range(4):
            assert s.value("partq_partition_backlog_bytes", queue="orders", partition=p) == 0
            assert s.value("partq_partition_status", queue="orders", partition=p,
                           status="Ready") == 1
        assert s.value("partq_commit_duration_seconds_count") > 0
        assert s.value("partq_replication_role", role="primary") == 1
        assert 0 < s.value("partq_store_live_bytes") <= s.value("partq_store_high_water_bytes")
        assert s.value("partq_store_max_map_bytes") == broker.store.max_map_size
        seen["address"] = address
    finally:
        broker.close()
    return seen


def test_scraped_values_follow_the_scenario_and_durable_counts_survive_a_restart(data_dir, clock):
    seen = _scenario(data_dir, clock)
    with pytest.raises(urllib.error.URLError):      # the endpoint closed with the broker
        urllib.request.urlopen(f"http://{seen['address']}/metrics", timeout=5)

    with partq.Broker.open(data_dir, clock=clock, metrics_listen="127.0.0.1:0") as broker:
        s = scrape(broker.metrics_address)
        assert s.value("partq_published_messages_total", queue="orders") == 40
        assert s.value("partq_acked_messages_total", queue="orders") == 40
        assert s.value("partq_discarded_messages_total", queue="orders") == 1
        assert s.value("partq_rebalances_total", queue="orders") == 2
        assert s.value("partq_handoffs_total", queue="orders", outcome="acked") == 1
        assert s.value("partq_handoffs_total", queue="orders", outcome="timed_out") == 1
        for p, n in seen["per_partition"].items():
            assert s.value("partq_partition_published_messages_total", queue="orders",
                           partition=p) == n
        # process counters start again with the process; the previous flows are ghosts
        assert not s.has("partq_delivered_messages_total", queue="orders")
        assert s.value("partq_flows", queue="orders", status="unbound") == 2

        # a scale-down deletes unacked messages: they are removed, never counted as acked
        broker.publish_many("orders", [(b"y", f"k{i}") for i in range(40)])
        doomed = sum(p.depth for p in broker.queue_status("orders").partitions
                     if p.partition >= 2)
        broker.scale("orders", 2)
        s = scrape(broker.metrics_address)
        assert s.value("partq_published_messages_total", queue="orders") == 80
        assert s.value("partq_removed_messages_total", queue="orders") == doomed
        assert s.value("partq_acked_messages_total", queue="orders") == 40
        assert s.value("partq_queue_depth", queue="orders") == 40 - doomed
        assert not s.has("partq_partition_depth", queue="orders", partition=3)


def test_the_endpoint_binds_loopback_by_default_and_answers_only_metrics_paths(data_dir, clock):
    with partq.Broker.open(data_dir, clock=clock, metrics_listen=":0") as broker:
        host, port = broker.metrics_address.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert "partq_info" in scrape(broker.metrics_address, "/").names()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{broker.metrics_address}/other", timeout=5)
        assert err.value.code == 404
        with socket.socket() as taken:               # a port in use is a clear error
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            with pytest.raises(partq.InvalidConfig, match="cannot serve metrics"):
                partq.Broker.open(data_dir.parent / "other", clock=clock,
                                  metrics_listen=f"127.0.0.1:{taken.getsockname()[1]}")


def test_an_exclusive_queue_reports_its_parent_log(data_dir, clock):
    with partq.Broker.open(data_dir, clock=clock, metrics_listen="127.0.0.1:0") as broker:
        broker.create_queue("solo", partitions=2, access_type="exclusive")
        broker.publish_many("solo", [b"a", b"b", b"c"])
        s = scrape(broker.metrics_address)
        assert s.value("partq_partition_depth", queue="solo", partition="parent") == 3
        assert s.value("partq_published_messages_total", queue="solo") == 3
        assert s.value("partq_queue_partitions", queue="solo") == 0


def test_backlog_bytes_reads_only_new_chunks_and_forgets_truncated_ones(data_dir, clock):
    with partq.Broker.open(data_dir, clock=clock) as broker:
        broker.create_queue("q", partitions=1)
        store = broker.store
        backlog = BacklogBytes()

        def measure() -> int:
            with store.read() as r:
                return backlog.measure(r, 1, 0, r.ack_state(1, 0).floor)
        assert measure() == 0
        broker.publish_many("q", [b"x" * 100] * 10)
        first = measure()
        broker.publish_many("q", [b"x" * 100] * 10)
        assert measure() == 2 * first               # two chunks of the same size
        flow = broker.bind("q")
        flow.ack_many(flow.receive(10, timeout=0))  # the first chunk goes
        assert measure() == first
        flow.ack_many(flow.receive(10, timeout=0))
        assert measure() == 0


def test_the_endpoint_bounds_connections_and_idle_peers(data_dir, clock):
    with partq.Broker.open(data_dir, clock=clock) as broker:
        server = MetricsServer(broker, "127.0.0.1:0", timeout=0.2)
        try:
            host, port = server.address.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as idle:
                idle.settimeout(30)
                assert idle.recv(1) == b""      # a peer that sends nothing is cut
        finally:
            server.close()
        server = MetricsServer(broker, "127.0.0.1:0", max_connections=2, timeout=60)
        try:
            host, port = server.address.rsplit(":", 1)
            with socket.create_connection((host, int(port))) as oldest, \
                    socket.create_connection((host, int(port))):
                wait_until(lambda: server.connections_waiting() == 2, 30, "both slots taken")
                # both slots held by silent peers: a scrape still gets in, and the oldest
                # silent peer gives way
                assert "partq_info" in scrape(server.address).names()
                oldest.settimeout(30)
                assert _closed(oldest)
        finally:
            server.close()


def test_trickling_peers_never_keep_a_scrape_out(data_dir, clock):
    """Sixteen peers that each send a byte now and then, as a slowloris does, hold every
    slot; scrapes still succeed, every time."""
    with partq.Broker.open(data_dir, clock=clock) as broker:
        server = MetricsServer(broker, "127.0.0.1:0", max_connections=16, timeout=5)
        host, port = server.address.rsplit(":", 1)
        slow = [socket.create_connection((host, int(port))) for _ in range(16)]
        try:
            for sock in slow:
                sock.sendall(b"G")
            for _ in range(5):
                for sock in slow:
                    try:
                        sock.sendall(b"E")
                    except OSError:
                        pass                 # cut off already: that is the point
                assert "partq_info" in scrape(server.address).names()
        finally:
            for sock in slow:
                sock.close()
            server.close()


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _answers(address: str) -> bool:
    """Whether a scrape succeeds (False while the closed peers' slots are not yet free)."""
    try:
        return "partq_info" in scrape(address).names()
    except (OSError, http.client.HTTPException):
        return False


def test_replication_lag_per_standby_on_both_sides(tmp_path):
    with partq.Broker.open(tmp_path / "primary", replication_listen="127.0.0.1:0",
                           metrics_listen="127.0.0.1:0") as primary:
        primary.create_queue("q", partitions=1)
        standby = partq.Broker.open(tmp_path / "standby", standby_of=primary.replication_address,
                                    metrics_listen="127.0.0.1:0")
        try:
            linked = wait_until(lambda: (lambda s: s if s.value(
                "partq_standby_connected") == 1 else None)(scrape(standby.metrics_address)),
                30, "the standby's metrics to show its link")
            assert linked.value("partq_replication_role", role="standby") == 1
            (sid,) = [link.standby_id for link in primary.replication_status().standbys]
            s = wait_until(lambda: (lambda s: s if s.value(
                "partq_replication_standby_connected", standby=sid) == 1 else None)(
                scrape(primary.metrics_address)), 30, "the primary's metrics to show the link")
            assert s.value("partq_replication_lag_messages", standby=sid) == 0
        finally:
            standby.close()
        primary.publish_many("q", [b"a", b"b", b"c"])      # the standby is gone: 3 behind
        s = wait_until(lambda: (lambda s: s if s.value(
            "partq_replication_standby_connected", standby=sid) == 0 else None)(
            scrape(primary.metrics_address)), 30, "the link to show down")
        assert s.value("partq_replication_lag_messages", standby=sid) == 3
        assert s.value("partq_replication_lag_seconds", standby=sid) >= 0
