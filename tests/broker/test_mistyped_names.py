"""A mistyped queue name is answered with the close one, by every verb that names a queue; a
name close to none says how to make the queue; a name that is not a str is an InvalidConfig."""
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


NOT_A_NAME_VERBS = {
    "publish": lambda b, name: b.publish(name, b"x"),
    "publish_many": lambda b, name: b.publish_many(name, [b"x"]),
    "bind": lambda b, name: b.bind(name),
    "queue_status": lambda b, name: b.queue_status(name),
    "queue_config": lambda b, name: b.queue_config(name),
    "delete_queue": lambda b, name: b.delete_queue(name),
}


@pytest.mark.parametrize("verb", sorted(NOT_A_NAME_VERBS))
@pytest.mark.parametrize("name", [5, b"orders", None])
def test_a_queue_named_by_something_else_than_a_str_is_invalid_config(broker, verb, name):
    """It was an AttributeError (``'int' object has no attribute 'encode'``) from the storage
    layer for most verbs."""
    with pytest.raises(partq.InvalidConfig, match="queue must be a queue name"):
        NOT_A_NAME_VERBS[verb](broker, name)
    assert broker.queue_status("orders").depth == 0


def test_a_name_close_to_none_says_how_to_make_it(broker):
    with pytest.raises(partq.QueueNotFound, match="partq queue create zzz"):
        broker.publish("zzz", b"x")


def test_the_command_suggests_too(broker, tmp_path):
    broker.close()
    proc = run_script(PARTQ_SCRIPT, str(tmp_path / "data"), "queue", "show", "paymnts")
    assert proc.returncode == 1
    assert proc.stderr == "Error: no queue named 'paymnts'; did you mean 'payments'?\n"
