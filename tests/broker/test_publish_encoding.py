"""The publishing encoder (``partq.publish.publisher.encode``) encodes the common batch items
inline and sends every other item through ``encode_one``: both paths must give the same bytes
as the storage layer's ``encode_record`` and the same key hash, and refuse exactly the items
the queue's limits refuse, whatever mix of item shapes a batch holds.
"""
from __future__ import annotations

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from partq.config import QueueConfig
from partq.errors import InvalidMessage
from partq.publish.encode import encode, encode_item
from partq.storage import encode_record

CONFIG = QueueConfig("q", partitions=4, max_message_size=24, max_key_size=6)
NOW = 1_700_000_000_000_000_000

payloads = st.one_of(st.binary(max_size=30), st.binary(max_size=30).map(bytearray),
                     st.sampled_from(["text", None, 5, [b"a"]]))
keys = st.one_of(st.none(), st.text(max_size=8), st.sampled_from(["é" * 3, "\ud800", b"k", 7]))
headers = st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                    st.sampled_from([[1], {"a": object()}]))
items = st.one_of(payloads, st.tuples(payloads), st.tuples(payloads, keys),
                  st.tuples(payloads, keys, headers), st.tuples(payloads, keys, headers, keys),
                  st.just(()))


def expected(item, expires):
    """What one item must encode to, from the documented rules alone; None when refused."""
    if type(item) is not tuple:
        item = (item,)
    if not 1 <= len(item) <= 3:
        return None
    payload, key, hdrs = (*item, None, None)[:3]
    if not isinstance(payload, (bytes, bytearray, memoryview)) or len(payload) > 24:
        return None
    if key is not None:
        if type(key) is not str:
            return None
        try:
            raw_key = key.encode()
        except UnicodeEncodeError:
            return None
        if len(raw_key) > 6:
            return None
    if hdrs is not None and type(hdrs) is not dict:
        return None
    try:
        record = encode_record(NOW, key, hdrs, bytes(payload), expires)
    except (TypeError, ValueError, OverflowError):  # a header msgpack cannot hold (an int past
        return None                                 # 64 bits): refused as encode_one refuses it
    return (None if key is None else crc32c.crc32c(key.encode())), record


@given(st.lists(items, max_size=6), st.sampled_from([None, NOW + 5]))
def test_a_batch_encodes_as_its_items_would_one_by_one(batch, expires):
    want = [expected(item, expires) for item in batch]
    if None in want:
        with pytest.raises(InvalidMessage):
            encode(CONFIG, batch, NOW, expires)
    else:
        assert encode(CONFIG, batch, NOW, expires) == want
    for item, one in zip(batch, want, strict=True):
        if one is None:
            with pytest.raises(InvalidMessage):
                encode_item(CONFIG, item, NOW, expires)
        else:
            assert encode_item(CONFIG, item, NOW, expires) == one


def test_the_inline_path_refuses_with_the_per_message_error():
    """An item over a limit in the common shape gets the message that names the limit."""
    with pytest.raises(InvalidMessage, match="max_message_size=24"):
        encode(CONFIG, [(b"a", "k"), (b"x" * 25, "k")], NOW)
    with pytest.raises(InvalidMessage, match="max_key_size=6"):
        encode(CONFIG, [(b"a", "k" * 7)], NOW)
    with pytest.raises(InvalidMessage, match="max_key_size=6"):
        encode(CONFIG, [(b"a", "é" * 4)], NOW)      # 4 characters, 8 bytes in UTF-8
