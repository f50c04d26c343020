"""The console's JSON API over real HTTP, served from this process over a real store: what the
overview, a queue and its messages say, who may read (loopback, token, host name), who may act
(--allow-actions, the CSRF token, the origin), and the limits every listener keeps."""
from __future__ import annotations

import logging
import socket
import time

import pytest
from console_helpers import act, get, request
from helpers import wait_until

import partq
from partq.console import ConsoleServer
from partq.console.history import History

TOKEN = b"a-console-token-of-32-bytes-long"


@pytest.fixture
def broker(tmp_path):
    b = partq.Broker.open(tmp_path / "data")
    b.create_queue("dmq")
    b.create_queue("jobs", partitions=4, rebalance_delay=0, dead_message_queue="dmq",
                   max_depth=100)
    yield b
    b.close()


@pytest.fixture
def console(broker):
    servers = []

    def start(**options) -> str:
        server = ConsoleServer(broker, "127.0.0.1:0", **options)
        servers.append(server)
        return server.url
    yield start
    for server in servers:
        server.close()


def _stuck(broker, queue: str = "jobs"):
    """A message nacked twice with a long delay: it blocks its partition."""
    poison = broker.publish(queue, b"poison", key="k")
    with broker.bind(queue) as flow:
        (m,) = flow.receive(1, timeout=5)
        flow.nack(m, delay=0)
        (m,) = flow.receive(1, timeout=5)
        flow.nack(m, delay=60)
    return poison


def test_the_overview_lists_every_queue_with_its_depth_bytes_flows_and_quota(broker, console):
    url = console()
    broker.publish_many("jobs", [(b"x" * 100, f"k{i}") for i in range(10)])
    flow = broker.bind("jobs", name="worker-1")
    try:
        status, doc = get(url, "/api/overview")
        assert status == 200
        rows = {q["name"]: q for q in doc["queues"]}
        assert sorted(rows) == ["dmq", "jobs"]
        jobs = rows["jobs"]
        assert (jobs["depth"], jobs["published"], jobs["flows"], jobs["partitions"]) == (10, 10, 1, 4)
        assert jobs["bytes"] >= 1000 and jobs["depth_use"] == pytest.approx(0.1)
        assert (jobs["ordering"], jobs["ingress_enabled"], jobs["egress_enabled"]) == \
            ("partition", True, True)
        assert jobs["dead_message_queue"] == "dmq" and jobs["dead"] == 0
        assert doc["totals"]["depth"] == 10 and doc["store"]["file_size"] > 0
        assert doc["replication"]["role"] == "primary"
        assert doc["refresh"] >= 1.0 and doc["actions"] is False and doc["csrf"]
    finally:
        flow.unbind()


def test_a_queue_shows_partitions_flows_what_blocks_and_the_dry_run(broker, console):
    url = console()
    poison = _stuck(broker)
    flow = broker.bind("jobs", name="worker-1")
    try:
        status, doc = get(url, "/api/queue?name=jobs")
        assert status == 200
        parts = {p["partition"]: p for p in doc["status"]["partitions"]}
        assert len(parts) == 4 and all(p["flow"] == flow.flow_id for p in parts.values())
        blocked = parts[poison.partition]["blocked"]
        assert (blocked["seq"], blocked["key"], blocked["delivery_count"]) == (poison.seq, "k", 3)
        assert blocked["next_retry"] > time.time() + 30
        assert doc["status"]["stuck_partitions"] == 1
        (f,) = [f for f in doc["status"]["flows"] if f["bound"]]
        assert (f["name"], sorted(f["partitions"])) == ("worker-1", [0, 1, 2, 3])
        assert "assignments" in doc["rebalance"] or "error" not in doc["rebalance"]
        assert doc["config"]["dead_message_queue"] == "dmq"
    finally:
        flow.unbind()
    status, doc = get(url, "/api/queue?name=nope")
    assert status == 404 and "nope" in doc["error"]


def test_messages_browse_a_partition_a_key_and_dead_messages_with_reasons(broker, console):
    url = console()
    broker.update_queue("jobs", max_redelivery=0)
    results = broker.publish_many("jobs", [(b"a", "k1"), (b"b", "k2"), (b"c", "k1")])
    status, doc = get(url, "/api/messages?name=jobs&key=k1")
    assert status == 200
    assert [m["payload"] for m in doc["messages"]] == ["a", "c"]
    p = results[1].partition
    status, doc = get(url, f"/api/messages?name=jobs&partition={p}")
    assert "b" in [m["payload"] for m in doc["messages"]]
    broker.kill_message("jobs", results[1].partition, results[1].seq)
    status, doc = get(url, "/api/messages?name=dmq&dead=1")
    (dead,) = doc["messages"]
    assert (dead["payload"], dead["dead_reason"], dead["origin_queue"]) == ("b", "rejected", "jobs")
    status, doc = get(url, "/api/messages?name=jobs&partition=99")
    assert status == 404


def test_actions_are_refused_without_allow_actions(broker, console):
    url = console()
    poison = _stuck(broker)
    status, doc = act(url, "kill", {"queue": "jobs", "partition": poison.partition,
                                    "seq": poison.seq})
    assert status == 403 and "--allow-actions" in doc["error"]
    assert broker.queue_status("jobs").stuck_partitions == 1


def test_an_action_needs_the_csrf_token_and_the_console_origin(broker, console):
    url = console(allow_actions=True)
    poison = _stuck(broker)
    body = {"queue": "jobs", "partition": poison.partition, "seq": poison.seq}
    status, doc = act(url, "kill", body, csrf="forged")
    assert status == 403 and "X-Partq-Csrf" in doc["error"]
    status, doc = act(url, "kill", body, headers={"Origin": "http://evil.example"})
    assert status == 403 and "evil.example" in doc["error"]
    assert broker.queue_status("jobs").stuck_partitions == 1


def test_actions_kill_requeue_pause_and_scale_and_each_is_logged(broker, console, caplog):
    caplog.set_level(logging.INFO, logger="partq.console")
    url = console(allow_actions=True)
    poison = _stuck(broker)
    status, doc = act(url, "kill", {"queue": "jobs", "partition": poison.partition,
                                    "seq": poison.seq})
    assert status == 200 and doc["result"]["outcome"] == "killed", doc
    assert doc["command"] == f"partq message kill jobs {poison.partition} {poison.seq}"
    assert broker.queue_status("jobs").stuck_partitions == 0
    assert broker.queue_status("dmq").depth == 1
    status, doc = act(url, "requeue", {"queue": "dmq"})
    assert status == 200 and doc["result"]["requeued"] == 1
    assert broker.queue_status("dmq").depth == 0
    assert any(m["payload"] == "poison" and not m["acked"]
               for m in get(url, "/api/messages?name=jobs&key=k")[1]["messages"])
    status, doc = act(url, "ingress", {"queue": "jobs", "enabled": False})
    assert status == 200 and broker.queue_config("jobs").ingress_enabled is False
    status, doc = act(url, "egress", {"queue": "jobs", "enabled": False})
    assert status == 200 and broker.queue_config("jobs").egress_enabled is False
    status, doc = act(url, "scale", {"queue": "jobs", "partitions": 6})
    assert status == 200 and broker.queue_config("jobs").partitions == 6
    status, doc = act(url, "scale", {"queue": "jobs", "partitions": "many"})
    assert status == 400 and "partitions" in doc["error"]
    status, doc = act(url, "ack", {"queue": "nope", "partition": 0, "seq": 0})
    assert status == 404
    logged = [r.getMessage() for r in caplog.records if r.name == "partq.console"]
    for command in ("partq message kill jobs", "partq dead requeue dmq",
                    "partq queue update jobs --ingress off", "partq queue update jobs --egress off",
                    "partq scale jobs --partitions 6"):
        assert any(command in line for line in logged), (command, logged)
    assert any("refused" in line for line in logged)


def test_a_token_is_asked_of_every_api_request_but_not_of_the_page(broker, console):
    url = console(token=TOKEN)
    assert get(url, "/api/overview")[0] == 401
    assert get(url, "/api/overview", {"Authorization": "Bearer wrong-token"})[0] == 401
    status, doc = get(url, "/api/overview", {"Authorization": "Bearer " + TOKEN.decode()})
    assert status == 200 and [q["name"] for q in doc["queues"]] == ["dmq", "jobs"]
    conn = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/"))))
    conn.sendall(b"GET / HTTP/1.0\r\nHost: console.example\r\n\r\n")
    assert b"200 OK" in conn.recv(100)      # with a token any host name may be used
    conn.close()


def test_without_a_token_only_loopback_host_names_are_answered(console):
    url = console()
    status, doc = get(url, "/api/overview", {"Host": "rebound.example:80"})
    assert status == 403 and "loopback host name" in doc["error"]
    assert get(url, "/api/overview", {"Host": "localhost"})[0] == 200


def test_the_limits_of_a_listener(broker, console):
    url = console(allow_actions=True, max_connections=2, timeout=0.5)
    port = int(url.rsplit(":", 1)[1].strip("/"))
    status, doc = act(url, "ingress", b"x" * 20_000, headers={"Content-Length": "20000"})
    assert status == 413
    silent = socket.create_connection(("127.0.0.1", port))
    silent.settimeout(5)
    assert silent.recv(1) == b""            # cut off at its deadline: nothing was asked
    hogs = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    assert get(url, "/api/overview")[0] == 200      # the oldest silent ones gave way
    for hog in hogs:
        hog.close()
    silent.close()


def test_the_history_charts_rates_between_samples_and_forgets_old_queues():
    h = History(window=10, spacing=1)
    for t, published, acked in [(0, 0, 0), (1, 10, 0), (1.2, 12, 1), (2, 30, 10)]:
        h.record("q", t, published, acked)
    chart = h.chart("q", now=2)
    assert chart["t"] == [-1.0, 0.0]       # (2 replaced 1.2: closer than the spacing to 1)
    assert chart["in"] == [10.0, 20.0] and chart["out"] == [0.0, 10.0]
    assert h.rates("q") == (20.0, 10.0)
    h.record("q", 20, 40, 40)               # the earlier samples left the window
    assert h.chart("q", now=20)["t"] == []
    h.forget_others(set(), now=40)
    assert h.rates("q") == (0.0, 0.0)


def test_the_overview_is_built_once_per_refresh_whatever_the_pages_open(broker, console):
    url = console()
    first = get(url, "/api/overview")[1]
    broker.publish("jobs", b"new")
    assert get(url, "/api/overview")[1]["generated_at"] == first["generated_at"]
    wait_until(lambda: get(url, "/api/overview")[1]["totals"]["depth"] == 1, 10,
               "the next overview")


def test_a_request_of_another_method_or_path_gets_a_json_error(console):
    url = console()
    assert request(url, "GET", "/nothing")[0] == 404
    assert request(url, "POST", "/api/overview", {})[0] == 404
