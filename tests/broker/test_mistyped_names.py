"""A mistyped queue name is answered with the close one, by every verb that names a queue; a
name close to none says how to make the queue."""
from __future__ import annotations

import pytest
from tools_helpers import PARTQ_SCRIPT, run_script

import partq


@pytest.fixture
def broker(tmp_path):
    with partq.Broker.open(tmp_path / "data") as broker:
        broker.create_queue("orders", partitions=2)
        broker.create_queue("payments", partitions=1)
        yield broker


@pytest.mark.parametrize("verb", [
    lambda b: b.publish("ordres", b"x"),
    lambda b: b.publish_many("ordres", [b"x"]),
    lambda b: b.bind("ordres"),
    lambda b: b.queue_status("ordres"),
    lambda b: b.queue_config("ordres"),
])
def test_a_mistyped_name_suggests_the_close_one(broker, verb):
    with pytest.raises(partq.QueueNotFound, match="did you mean 'orders'"):
        verb(broker)


def test_a_name_close_to_none_says_how_to_make_it(broker):
    with pytest.raises(partq.QueueNotFound, match="partq queue create zzz"):
        broker.publish("zzz", b"x")


def test_the_command_suggests_too(broker, tmp_path):
    broker.close()
    proc = run_script(PARTQ_SCRIPT, str(tmp_path / "data"), "queue", "show", "paymnts")
    assert proc.returncode == 1
    assert proc.stderr == "Error: no queue named 'paymnts'; did you mean 'payments'?\n"
