"""``partq scale --online`` (rule `online-scaling`) and ``partq rebalance --dry-run`` (rule
`rebalance-dry-run`) from the command line."""
from __future__ import annotations

import json

from tools_helpers import json_lines, ok, user_error

from partq import key_partition


def test_scale_online_keeps_ingress_on_and_queue_show_lists_the_holds(run, broker):
    ok(run("queue", "create", "orders", "-p", "4"))
    keys = [f"k{i}" for i in range(40)]
    moved = [k for k in keys if key_partition(k, 4) != key_partition(k, 6)]
    flow = broker.bind("orders", name="c")
    broker.publish_many("orders", [(b"old", k) for k in keys])
    old = flow.receive(1000)
    steps = json_lines(ok(run("scale", "orders", "--partitions", "6", "--online", "--yes",
                              "--json")).stdout)
    by_step = {s["step"]: s for s in steps}
    assert [by_step[n]["status"] for n in (1, 2, 3, 7)] == ["skipped"] * 4
    assert by_step[4]["status"] == "done" and by_step[4]["online"] is True
    assert broker.queue_config("orders").ingress_enabled
    broker.publish_many("orders", [(b"new", k) for k in keys])
    shown = json.loads(ok(run("queue", "show", "orders", "--json")).stdout)["status"]["cutover"]
    assert (shown["from_partitions"], shown["to_partitions"]) == (4, 6)
    assert sum(o["held"] for o in shown["old_partitions"]) == len(moved)
    text = ok(run("queue", "show", "orders")).stdout
    assert "online scaling 4 -> 6 draining" in text and "OLD PARTITION" in text
    flow.ack_many(old)
    broker.tick()
    assert json.loads(ok(run("queue", "show", "orders", "--json")).stdout)["status"]["cutover"] \
        is None


def test_rebalance_dry_run_text_and_json(run, broker):
    ok(run("queue", "create", "orders", "-p", "4", "--rebalance-delay", "5",
           "--max-handoff-time", "2"))
    broker.bind("orders", name="a")
    plan = json.loads(ok(run("rebalance", "orders", "--dry-run", "--add", "b", "--json")).stdout)
    assert {s["to_name"] for s in plan["steps"]} == {"b"} and len(plan["steps"]) == 2
    assert {f["name"]: len(f["partitions"]) for f in plan["after"]} == {"a": 2, "b": 2}
    text = ok(run("rebalance", "orders", "--dry-run", "--add", "b")).stdout
    assert "handoff" in text and "b (new)" in text and "balanced: yes" in text
    assert broker.queue_status("orders").flows[0].partitions == [0, 1, 2, 3]   # nothing moved
    user_error(run("rebalance", "orders", "--dry-run", "--remove", "zz"), "no bound flow")
    result = run("rebalance", "orders")
    assert result.exit_code == 2 and "--dry-run" in result.output


def test_queue_show_and_the_dry_run_say_what_waits_under_key_ordering(run, broker):
    ok(run("queue", "create", "orders", "-p", "2", "--ordering", "key", "--rebalance-delay", "5"))
    keys = [k for k in (f"k{i}" for i in range(40)) if key_partition(k, 2) == 1][:3]
    flow = broker.bind("orders", name="a")
    broker.publish_many("orders", [(b"m", k) for k in keys] + [(b"again", keys[0])])
    got = flow.receive(100)
    assert len(got) == 4
    flow.nack(got[0], delay=60)                      # keys[0] waits; the others stay in flight
    shown = json.loads(ok(run("queue", "show", "orders", "--json")).stdout)["status"]
    p1 = shown["partitions"][1]
    assert (p1["held_keys"], p1["held_messages"], p1["held_for"]) == (1, 2, ["delay"])
    text = ok(run("queue", "show", "orders")).stdout
    assert "HELD" in text and "1 key, 2 messages (delay)" in text
    plan = json.loads(ok(run("rebalance", "orders", "--dry-run", "--add", "b", "--json")).stdout)
    [step] = [s for s in plan["steps"] if s["action"] == "handoff"]
    assert step["partition"] == 1 and step["holds_keys"] == sorted(keys[1:]) and step["holds_key_count"] == 2
    text = ok(run("rebalance", "orders", "--dry-run", "--add", "b")).stdout
    assert f"only its 2 key(s) in flight wait: {', '.join(sorted(keys[1:]))}" in text
