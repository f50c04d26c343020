"""Wrong messages get a clear typed error and store nothing: wrong payload, key and header
types, sizes over the queue's limits and bad batch items are InvalidMessage, and not even the
good messages of their batch are stored.
"""
from __future__ import annotations

import pytest
from helpers import drain

import partq


# ============================================================================ wrong messages
@pytest.fixture
def small(broker):
    """The shared broker (tests/conftest.py) with a queue of small limits holding one message."""
    broker.create_queue("q", partitions=2, max_message_size=100, max_key_size=10)
    broker.publish("q", b"good-1", key="k")
    return broker


BAD_PUBLISHES = {
    "payload str": lambda b: b.publish("q", "text"),
    "payload None": lambda b: b.publish("q", None),
    "payload int": lambda b: b.publish("q", 5),
    "payload bool": lambda b: b.publish("q", True),
    "payload list": lambda b: b.publish("q", [1, 2]),
    "key bytes": lambda b: b.publish("q", b"x", key=b"k"),
    "key int": lambda b: b.publish("q", b"x", key=5),
    "key bool": lambda b: b.publish("q", b"x", key=True),
    "payload over max_message_size": lambda b: b.publish("q", b"x" * 101),
    "key over max_key_size": lambda b: b.publish("q", b"x", key="k" * 11),
    "key over max_key_size in utf-8": lambda b: b.publish("q", b"x", key="é" * 6),
    "headers not a dict": lambda b: b.publish("q", b"x", headers=[1]),
    "headers not encodable": lambda b: b.publish("q", b"x", headers={"a": object()}),
    "batch with a bad payload in the middle": lambda b: b.publish_many(
        "q", [(b"a", "k"), ("bad", "k"), (b"c", "k")]),
    "batch with an oversized payload": lambda b: b.publish_many("q", [(b"a", "k"), (b"x" * 101, "k")]),
    "batch with a bad key": lambda b: b.publish_many("q", [(b"a", "k"), (b"b", 7)]),
    "batch item str": lambda b: b.publish_many("q", [b"a", "abc"]),
}


@pytest.mark.parametrize("case", sorted(BAD_PUBLISHES))
def test_wrong_messages_are_invalid_message_and_store_nothing(small, case):
    with pytest.raises(partq.InvalidMessage):
        BAD_PUBLISHES[case](small)
    assert small.queue_status("q").depth == 1
    assert [m.payload for m in drain(small.bind("q"))] == [b"good-1"]


def test_key_that_is_not_valid_unicode(small):
    with pytest.raises(partq.InvalidMessage):
        small.publish("q", b"x", key="\ud800")


def test_batch_item_that_is_an_empty_tuple(small):
    with pytest.raises(partq.InvalidMessage):
        small.publish_many("q", [(b"a", "k"), ()])


def test_headers_with_non_str_keys(small):
    """Found by this suite: such headers used to be stored, then never decoded (CorruptRecord
    at delivery, the partition stopped)."""
    with pytest.raises(partq.InvalidMessage):
        small.publish("q", b"h", headers={1: "a"}, key="k")
    small.publish("q", b"good-2", key="k", headers={"n": 1, "nested": {"b": [1, b"x"]}})
    got = drain(small.bind("q"))
    assert [m.payload for m in got] == [b"good-1", b"good-2"]
    assert got[1].headers == {"n": 1, "nested": {"b": [1, b"x"]}}


def test_header_integer_too_large(small):
    with pytest.raises(partq.InvalidMessage):
        small.publish("q", b"x", headers={"a": 1 << 64})
