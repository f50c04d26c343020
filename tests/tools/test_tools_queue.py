"""init, queue create|list|show|update|delete, stats, demo: happy paths, human and --json."""
from __future__ import annotations

import json
import os
import time

from tools_helpers import invoke, ok, user_error

import partq
from partq.tools import common


def test_init_creates_then_reports_existing(tmp_path):
    path = str(tmp_path / "s")
    first = ok(invoke("--data", path, "init"))
    assert "created a partq store" in first.stdout
    assert os.path.exists(os.path.join(path, "data.mdb"))
    again = json.loads(ok(invoke("--data", path, "init", "--json")).stdout)
    assert again == {"path": os.path.abspath(path), "created": False, "stale_readers_cleared": 0}
    assert "already holds a partq store" in ok(invoke("--data", path, "init")).stdout


def test_init_json_on_a_new_store(tmp_path):
    doc = json.loads(ok(invoke("--data", tmp_path / "n", "init", "--json")).stdout)
    assert doc["created"] is True and doc["stale_readers_cleared"] == 0


def test_queue_create_with_every_option(run, broker):
    doc = json.loads(ok(run("queue", "create", "orders", "--partitions", "3", "--rebalance-delay",
                            "1.5", "--max-handoff-time", "2", "--max-unacked", "50",
                            "--partitioner", "sticky", "--sticky-batch-size", "4096",
                            "--no-adaptive", "--availability-timeout", "0.5",
                            "--max-message-size", "1000", "--max-key-size", "64",
                            "--egress", "off", "--reject-when-shutdown", "on", "--json")).stdout)
    config = broker.queue_config("orders")
    assert doc == {**config.to_dict(), "configured_partitions": 3, "created": True}
    assert (config.partitions, config.rebalance_delay, config.max_handoff_time) == (3, 1.5, 2.0)
    assert config.max_delivered_unacked_per_flow == 50 and config.partitioner == "sticky"
    assert config.sticky_batch_size == 4096 and config.adaptive is False
    assert config.partition_availability_timeout == 0.5
    assert (config.max_message_size, config.max_key_size) == (1000, 64)
    assert config.egress_enabled is False and config.ingress_enabled is True
    assert config.reject_msg_to_sender_when_shutdown is True


def test_queue_create_defaults_and_human_output(run, broker):
    assert ok(run("queue", "create", "q")).stdout.strip() == "created queue 'q' with 1 partition"
    assert broker.queue_config("q") == partq.QueueConfig(name="q", qid=broker.queue_config("q").qid)


def test_queue_list(run, broker):
    assert "no queues" in ok(run("queue", "list")).stdout
    assert json.loads(ok(run("queue", "list", "--json")).stdout) == {"queues": []}
    ok(run("queue", "create", "b", "-p", "2"))
    ok(run("queue", "create", "a", "-p", "3"))
    broker.publish_many("a", [b"x"] * 5)
    rows = json.loads(ok(run("queue", "list", "--json")).stdout)["queues"]
    assert [r["name"] for r in rows] == ["a", "b"]
    assert rows[0]["partitions"] == 3 and rows[0]["depth"] == 5
    assert rows[0]["rebalance_status"] == "Ready" and rows[0]["delivery_owner"] is None
    lines = ok(run("queue", "list")).stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "PARTITIONS", "DEPTH"]
    assert lines[1].split()[:3] == ["a", "3", "5"]
    # aligned columns: every row has its DEPTH column ending where the header's does
    end = lines[0].index("DEPTH") + len("DEPTH")
    assert all(line[end - 1].isdigit() and line[end] == " " for line in lines[1:])


def test_queue_show(run, broker):
    ok(run("queue", "create", "orders", "-p", "2", "--rebalance-delay", "0"))
    broker.publish_many("orders", [(b"m%d" % i, f"k{i}") for i in range(10)])
    flow = broker.bind("orders", name="svc-a")
    msgs = flow.receive(max_messages=3, timeout=1.0)
    flow.ack(msgs[0])
    doc = json.loads(ok(run("queue", "show", "orders", "--json")).stdout)
    assert doc["config"]["name"] == "orders" and doc["config"]["partitions"] == 2
    st = doc["status"]
    assert st["partition_count"] == 2 and st["depth"] == 9
    assert st["delivery_owner"] and f"pid {os.getpid()}" in st["delivery_owner"]
    assert [p["partition"] for p in st["partitions"]] == [0, 1]
    assert all(p["flow_name"] == "svc-a" and p["status"] == "Ready" for p in st["partitions"])
    assert sum(p["next_seq"] for p in st["partitions"]) == 10
    assert st["flows"][0]["name"] == "svc-a" and st["flows"][0]["partitions"] == [0, 1]
    text = ok(run("queue", "show", "orders")).stdout
    assert "delivery owner: pid" in text
    for header in ("PARTITION", "STATUS", "FLOW", "DEPTH", "UNACKED", "NEXT SEQ", "ACK FLOOR"):
        assert header in text
    assert "svc-a" in text and "rebalance_delay" in text
    flow.unbind()


def test_queue_update(run, broker):
    ok(run("queue", "create", "orders", "-p", "2"))
    doc = json.loads(ok(run("queue", "update", "orders", "--ingress", "off", "--egress", "off",
                            "--reject-msg-to-sender", "off", "--reject-when-shutdown", "on",
                            "--rebalance-delay", "7", "--partitioner", "sticky", "--adaptive",
                            "--json")).stdout)
    assert doc["changed"]["ingress_enabled"] == [True, False]
    assert doc["changed"]["rebalance_delay"] == [5.0, 7.0]
    assert "adaptive" not in doc["changed"]           # already on: not a change
    config = broker.queue_config("orders")
    assert not config.ingress_enabled and not config.egress_enabled
    assert not config.reject_msg_to_sender and config.reject_msg_to_sender_when_shutdown
    assert config.partitioner == "sticky" and config.rebalance_delay == 7.0
    text = ok(run("queue", "update", "orders", "--ingress", "on")).stdout
    assert "ingress_enabled" in text and "off" in text and "on" in text
    assert "nothing changed" in ok(run("queue", "update", "orders", "--ingress", "yes")).stdout


def test_queue_update_cannot_change_partitions(run):
    ok(run("queue", "create", "orders"))
    result = run("queue", "update", "orders", "--partitions", "3")
    assert result.exit_code == 2 and "partq scale orders --partitions 3" in result.stderr


def test_queue_delete(run, broker):
    ok(run("queue", "create", "orders", "-p", "2"))
    broker.publish_many("orders", [b"x"] * 3)
    user_error(run("queue", "delete", "orders"), "pass --yes")
    assert [c.name for c in broker.queues()] == ["orders"]
    doc = json.loads(ok(run("queue", "delete", "orders", "--yes", "--json")).stdout)
    assert doc == {"queue": "orders", "deleted": True, "partitions": 2}
    assert broker.queues() == []


def test_queue_delete_asks_on_a_terminal(run, broker, monkeypatch):
    monkeypatch.setattr(common, "interactive", lambda: True)
    ok(run("queue", "create", "orders"))
    answered_no = run("queue", "delete", "orders", input="n\n")
    assert answered_no.exit_code == 1          # the prompt itself is on stderr too
    assert answered_no.stderr.splitlines()[-1] == "Error: cancelled; nothing was changed"
    assert [c.name for c in broker.queues()] == ["orders"]
    assert "deleted queue 'orders'" in ok(run("queue", "delete", "orders", input="y\n")).stdout
    assert broker.queues() == []


def test_queue_delete_refused_while_another_process_delivers(run, broker):
    ok(run("queue", "create", "orders"))
    flow = broker.bind("orders")  # this Broker now owns delivery; the CLI's Broker is another
    line = user_error(run("queue", "delete", "orders", "--yes"), "cannot be deleted while",
                      f"pid {os.getpid()} on", "runs its delivery", "stop that process")
    assert "bind in that process" not in line        # the advice of a bind, not of a delete
    flow.unbind()
    # unbinding its consumers does not end the owner's delivery: still refused, still named
    user_error(run("queue", "delete", "orders", "--yes"), f"pid {os.getpid()} on")
    broker.close()                                    # closing the owner's Broker does
    ok(run("queue", "delete", "orders", "--yes"))


def test_stats(run, broker):
    ok(run("queue", "create", "orders", "-p", "3"))
    ok(run("queue", "create", "other"))
    broker.publish_many("orders", [b"x" * 100] * 30)
    ok(run("queue", "update", "orders", "--ingress", "off"))
    broker.publish_many("orders", [b"dropped"] * 4)         # discarded and counted (rule `ingress-egress`)
    doc = json.loads(ok(run("stats", "--json")).stdout)
    assert doc["store"]["file_size"] > 0 and doc["store"]["map_size"] >= doc["store"]["used_bytes"]
    orders = next(q for q in doc["queues"] if q["name"] == "orders")
    assert orders.pop("oldest_unacked_publish_time_ns") <= time.time_ns()
    assert orders == {"name": "orders", "access_type": "non-exclusive", "partitions": 3,
                      "discarded": 4, "scaling_status": "Ready", "parent_depth": 0,
                      "ingress_enabled": False, "egress_enabled": True, "depth": 30,
                      "rebalance_status": "Ready", "flows": 0, "active_flows": 0,
                      "delivery_owner": None, "dead": 0, "quota_refused": 0, "quota_discarded": 0,
                      "stuck_partitions": 0, "error": None,
                      "warnings": []}
    one = json.loads(ok(run("stats", "other", "--json")).stdout)
    assert [q["name"] for q in one["queues"]] == ["other"]
    text = ok(run("stats")).stdout
    assert "map" in text and "DISCARDED" in text and "orders" in text


def test_demo_runs_and_reruns(tmp_path, monkeypatch):
    path = tmp_path / "demo"
    doc = json.loads(ok(invoke("demo", "--data", path, "--json")).stdout)
    assert doc["path"] == str(path)
    assert any("2/2/2/1" in line for line in doc["output"])
    with partq.Broker.open(str(path)) as b:
        assert b.queue_status("orders").depth == 0
    # a directory an earlier demo made may be replaced (the run itself is stubbed: 3 s saved)
    from partq import demo as demo_module
    calls = []
    monkeypatch.setattr(demo_module, "run", lambda data: calls.append(data))
    ok(invoke("--data", path, "demo"))      # the group's --data is the demo's directory too
    assert calls == [str(path)]


def test_demo_refuses_a_directory_it_did_not_make(tmp_path):
    store = tmp_path / "precious"
    ok(invoke("--data", store, "init"))
    ok(invoke("--data", store, "queue", "create", "keep"))
    user_error(invoke("--data", store, "demo"), "not empty")
    user_error(invoke("demo", "--data", store), "--force")
    assert "keep" in ok(invoke("--data", store, "queue", "list")).stdout


def test_queue_show_after_scale_up_of_a_queue_that_had_consumers(run, data):
    ok(run("queue", "create", "orders", "-p", "2", "--rebalance-delay", "0"))
    with partq.Broker.open(data) as b:
        b.bind("orders", name="svc").unbind()     # persists the queue's assignment state
    ok(run("scale", "orders", "-p", "4", "--yes"))
    shown = ok(run("queue", "show", "orders", "--json"))
    assert shown.stderr == ""                     # no warning: the stored state fits the count
    doc = json.loads(shown.stdout)
    assert doc["config"]["partitions"] == 4 and doc["config"]["scaling_status"] == "Ready"
    st = doc["status"]
    assert (st["partition_count"], st["scaling_status"], st["rebalance_status"]) == \
        (4, "Ready", "Ready")
    assert [(p["partition"], p["status"], p["flow"], p["error"]) for p in st["partitions"]] == \
        [(p, "Unassigned", None, None) for p in range(4)]     # the 2 new ones included
    assert st["flows"] == [] and st["delivery_owner"] is None
    text = ok(run("queue", "show", "orders")).stdout
    assert "access non-exclusive  partitions 4  depth 0" in text
    rows = [line.split() for line in text.splitlines() if line.split()[1:2] == ["Unassigned"]]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
