"""partq.kombu's own promises beyond kombu's mixins: what a consumer holds lives in partq (a
killed consumer loses nothing, a closed channel gives back what it held), rejects go to the dead
message queue, bindings made in one process route publishes of another, queue_delete and purge,
and the same through ``partq serve``. Real directories, real processes, real sockets."""
from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import textwrap
from contextlib import closing

import pytest

kombu = pytest.importorskip("kombu", reason="the celery extra brings kombu")

import partq  # noqa: E402
import partq.kombu  # noqa: E402
from partq.kombu import names  # noqa: E402
from partq.remote.server import Server  # noqa: E402

TOKEN = "a-test-token-of-32-bytes-or-so!!"


def child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60)


def test_a_message_a_killed_consumer_held_is_delivered_again(tmp_path):
    url = f"partq://{tmp_path}"
    with kombu.Connection(url) as conn, closing(conn.SimpleQueue("jobs")) as q:
        q.put({"n": 1})
    proc = child(f"""
        import os, signal, kombu, partq.kombu
        conn = kombu.Connection({url!r})
        msg = conn.SimpleQueue("jobs").get(timeout=5)
        print(msg.payload, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)      # held, never acked nor restored
    """)
    assert proc.returncode == -signal.SIGKILL and "{'n': 1}" in proc.stdout, proc.stderr
    with kombu.Connection(url) as conn, closing(conn.SimpleQueue("jobs")) as q:
        msg = q.get(timeout=5)
        assert msg.payload == {"n": 1} and msg.delivery_info["redelivered"] is True
        msg.ack()
        with pytest.raises(q.Empty):
            q.get_nowait()


def test_closing_a_channel_gives_back_what_it_held_and_acks_are_kept(tmp_path):
    url = f"partq://{tmp_path}"
    with kombu.Connection(url) as conn, closing(conn.SimpleQueue("jobs")) as q:
        for n in range(3):
            q.put(n)
        first, second = q.get(timeout=5), q.get(timeout=5)
        first.ack()
        assert second.payload == 1            # held when the channel closes
    with kombu.Connection(url) as conn, closing(conn.SimpleQueue("jobs")) as q:
        got = sorted((m.payload, m.delivery_info["redelivered"])
                     for m in (q.get(timeout=5), q.get(timeout=5)))
        # 2 was delivered to the consumer's buffer too (no prefetch limit), and given back
        assert [n for n, _ in got] == [1, 2] and got[0][1] is True
        with pytest.raises(q.Empty):
            q.get_nowait()
    with partq.Broker.open(tmp_path) as broker:
        assert broker.queue_status("jobs").depth == 2      # the last two, never acked


def test_a_reject_goes_to_the_dead_message_queue(tmp_path):
    options = {"queue_options": {"dead_message_queue": "jobs.dead"}}
    with partq.Broker.open(tmp_path) as broker:
        broker.create_queue("jobs.dead")
    with kombu.Connection(f"partq://{tmp_path}", transport_options=options) as conn, \
            closing(conn.SimpleQueue("jobs")) as q:
        q.put("poison")
        q.get(timeout=5).reject(requeue=False)
        with pytest.raises(q.Empty):
            q.get_nowait()
    with partq.Broker.open(tmp_path) as broker:
        flow = broker.bind("jobs.dead")
        [dead] = flow.receive(10, timeout=5)
        body = json.loads(dead.payload)["body"]
        assert base64.b64decode(body) == b"poison" and dead.headers["dead_reason"] == "rejected"


def test_a_binding_made_in_one_process_routes_the_publishes_of_another(tmp_path):
    url = f"partq://{tmp_path}"
    proc = child(f"""
        import kombu, partq.kombu
        with kombu.Connection({url!r}) as conn:
            ex = kombu.Exchange("events", type="topic")
            for name, key in (("audit", "order.*"), ("billing", "order.paid")):
                kombu.Queue(name, exchange=ex, routing_key=key)(conn.default_channel).declare()
    """)
    assert proc.returncode == 0, proc.stderr
    with kombu.Connection(url) as conn:          # this process never declared the exchange
        producer = kombu.Producer(conn.default_channel,
                                  exchange=kombu.Exchange("events", type="topic"))
        producer.publish({"id": 1}, routing_key="order.created")
        producer.publish({"id": 2}, routing_key="order.paid")
        got = {name: [] for name in ("audit", "billing")}
        for name in got:
            q = kombu.Queue(name, exchange=kombu.Exchange("events", type="topic"))
            with kombu.Consumer(conn, [q], callbacks=[lambda b, m, n=name: (got[n].append(b),
                                                                           m.ack())]):
                while len(got[name]) < (2 if name == "audit" else 1):
                    conn.drain_events(timeout=5)
        assert got == {"audit": [{"id": 1}, {"id": 2}], "billing": [{"id": 2}]}


def test_queue_delete_removes_the_queue_its_priority_steps_and_its_bindings(tmp_path):
    with kombu.Connection(f"partq://{tmp_path}") as conn:
        ex = kombu.Exchange("ex", type="direct")
        q = kombu.Queue("weird@name", exchange=ex, routing_key="k", max_priority=9)
        q(conn.default_channel).declare()
        with partq.Broker.open(tmp_path) as broker:
            before = {c.name for c in broker.queues()}
        assert names.queue_name("weird@name") in before and len(before) == 5   # 4 steps, 1 binding
        q(conn.default_channel).delete()
        with partq.Broker.open(tmp_path) as broker:
            assert broker.queues() == []


def test_purge_drops_what_waits_and_keeps_what_a_consumer_holds(tmp_path):
    with kombu.Connection(f"partq://{tmp_path}") as conn, closing(conn.SimpleQueue("jobs")) as q:
        for n in range(5):
            q.put(n)
        held = q.get_nowait()             # one message (get would prefetch them all)
        assert q.clear() == 4
        held.ack()
        with pytest.raises(q.Empty):
            q.get_nowait()


def test_names_round_trip_and_stay_partq_names():
    assert names.queue_name("celery") == "celery"
    pidbox = names.queue_name("celery@host-1.celery.pidbox")
    assert pidbox.startswith("kombu.q.") and "@" not in pidbox
    assert names.queue_name("kombu.mine") != "kombu.mine"          # the reserved prefix
    assert len(names.queue_name("x" * 500)) <= names.MAX_NAME
    b = names.binding_name("fanout", "celery.pidbox", "", "", "celery@host.celery.pidbox")
    assert names.parse_binding(b) == ("fanout", "celery.pidbox",
                                      ("", "", "celery@host.celery.pidbox"))
    assert names.parse_binding("celery") is None
    with pytest.raises(ValueError, match="too long"):
        names.binding_name("direct", "e", "k" * 200, "", "q")


def test_the_transport_through_partq_serve(tmp_path):
    broker = partq.Broker.open(tmp_path / "data")
    broker.create_queue("jobs", ordering="key", rebalance_delay=0.0)   # a client creates none
    server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
    try:
        url = f"partq://:{TOKEN}@{server.address}"
        with kombu.Connection(url) as conn, closing(conn.SimpleQueue("jobs")) as q:
            q.put({"n": 1})
            msg = q.get(timeout=5)
            assert msg.payload == {"n": 1}
            msg.requeue()
            again = q.get(timeout=5)
            assert again.payload == {"n": 1} and again.delivery_info["redelivered"]
            again.ack()
        assert broker.queue_status("jobs").depth == 0
        bad = kombu.Connection(f"partq://:{'w' * 32}@{server.address}")
        with pytest.raises(partq.AuthenticationFailed):
            bad.connect()
    finally:
        server.close()
        broker.close()
