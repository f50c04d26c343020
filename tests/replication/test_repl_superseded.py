"""No split brain (rule `replication`): a promoted standby tells its old primary, which from then
on refuses every write in every process of its directory and serves no standby; a store that
was never its standby cannot do that."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import wait_until
from repl_helpers import free_port

import partq
from partq.replication.supersede import forked_from


def _refuses(broker: partq.Broker) -> bool:
    try:
        broker.publish("orders", b"late", key="k")
    except partq.Superseded:
        return True
    return False


def test_an_old_primary_that_comes_back_is_told_and_refuses_writes(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    old = partq.Broker.open(tmp_path / "old", replication_listen=address)
    old.create_queue("orders", partitions=2)
    old.publish_many("orders", [(b"m%d" % i, f"k{i}") for i in range(20)])
    standby = partq.Broker.open(tmp_path / "new", standby_of=address)
    try:
        wait_until(lambda: standby.replication_status().connected   # (a link that dropped
                   and "orders" in {c.name for c in standby.queues()}  # resumes, connected
                   and standby.queue_status("orders").depth == 20,     # before it has the queue)
                   30, "the standby to catch up")
        old.close()                                   # the primary is taken for lost
        standby.promote()                             # its address is down: told once it is back
        standby.publish("orders", b"on the new primary", key="k")
        old = partq.Broker.open(tmp_path / "old", replication_listen=address)
        wait_until(lambda: _refuses(old), 30, "the old primary to be told it is superseded")
        with pytest.raises(partq.Superseded, match="superseded DR primary"):
            old.bind("orders")
        with pytest.raises(partq.Superseded):
            old.create_queue("other")
        assert old.queue_status("orders").depth >= 20          # reads go on
        assert old.replication_status().superseded and not standby.replication_status().superseded
        shown = subprocess.run([sys.executable, "-m", "partq", "--data", str(tmp_path / "old"),
                                "dr", "status", "--json"], capture_output=True, text=True,
                               timeout=60)
        assert json.loads(shown.stdout)["superseded"] is True, shown.stderr
        # another process of the old directory is refused too, in its first commit
        code = ("import sys, partq\n"
                "b = partq.Broker.open(sys.argv[1])\n"
                "try:\n    b.publish('orders', b'x', key='k')\n"
                "except partq.Superseded as exc:\n    print('refused:', exc); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "old")],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "move it aside" in proc.stdout
        # the new primary goes on, and stops telling once the old one answered
        standby.publish("orders", b"still", key="k")
        assert standby.queue_status("orders").depth == 22
    finally:
        old.close()
        standby.close()


def test_a_store_that_never_followed_the_primary_cannot_supersede_it():
    a, b = ("A", 0), ("B", 100)
    assert forked_from([a], [a, ("S", 150)])                  # a promoted standby of it
    assert forked_from([a, b], [a, ("S", 90)])                # promoted before it restarted
    assert not forked_from([a], [("X", 0), ("S", 10)])        # another primary's standby
    assert not forked_from([a], [a])                          # the same history: no promotion
    assert not forked_from([a, b], [a, b])
