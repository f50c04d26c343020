"""Record encoding (rule `checksums`): round trips, and damage is always reported as ``CorruptRecord``.

``decode_record`` promises to raise only ``CorruptRecord``: the checksum is verified before
msgpack sees the body, and every msgpack failure is translated. The fuzz tests below feed it
random bytes, random bodies behind a *valid* checksum (so the msgpack path is exercised too), and
records with one flipped bit.
"""
from __future__ import annotations

import crc32c
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partq.errors import CorruptRecord, InvalidMessage
from partq.storage import Record, decode_record, encode_record

# What msgpack can store as an integer: int64 for negatives, uint64 for positives.
I64_MIN, U64_MAX = -(1 << 63), (1 << 64) - 1

timestamps = st.integers(min_value=I64_MIN, max_value=U64_MAX)
keys = st.none() | st.text(max_size=64)
header_values = st.none() | st.text(max_size=32) | st.integers(min_value=I64_MIN, max_value=U64_MAX)
headers = st.none() | st.dictionaries(st.text(max_size=16), header_values, max_size=8)
payloads = st.binary(max_size=4096)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def framed(body: bytes) -> bytes:
    """``body`` behind a correct checksum, so decoding gets past the crc32c check."""
    return crc32c.crc32c(body).to_bytes(4, "big") + body


# ---------------------------------------------------------------------------- round trips
@FAST
@given(ts=timestamps, key=keys, hdrs=headers, payload=payloads)
def test_round_trip(ts, key, hdrs, payload):
    raw = encode_record(ts, key, hdrs, payload)
    assert isinstance(raw, bytes)
    assert decode_record(raw, "q", 0, 0) == Record(ts, key, hdrs, payload)


@pytest.mark.parametrize("size", [0, 1, 255, 256, 65_535, 65_536, 1 << 20, 10 << 20])
def test_round_trip_payload_sizes(size):
    payload = bytes(i % 251 for i in range(size))
    raw = encode_record(7, "k", {"h": 1}, payload)
    rec = decode_record(raw, "q", 3, 9)
    assert rec.payload == payload and rec.key == "k" and rec.headers == {"h": 1}


def test_empty_payload_key_and_headers_are_kept_distinct_from_none():
    rec = decode_record(encode_record(0, "", {}, b""), "q", 0, 0)
    assert rec == Record(0, "", {}, b"")
    rec = decode_record(encode_record(0, None, None, b""), "q", 0, 0)
    assert rec == Record(0, None, None, b"")


def test_decode_accepts_bytes_and_memoryview():
    raw = encode_record(1, "k", None, b"payload")
    assert decode_record(memoryview(raw), "q", 0, 0) == decode_record(raw, "q", 0, 0)


# ---------------------------------------------------------------------------- damage
def _assert_corrupt_or_valid(raw: bytes) -> None:
    """decode_record either returns a well-typed Record or raises CorruptRecord; nothing else."""
    try:
        rec = decode_record(raw, "q", 1, 2)
    except CorruptRecord as exc:
        assert (exc.queue, exc.partition, exc.seq) == ("q", 1, 2)
        return
    assert isinstance(rec, Record)
    assert isinstance(rec.publish_time_ns, int)
    assert rec.key is None or isinstance(rec.key, str)
    assert rec.headers is None or isinstance(rec.headers, dict)
    assert isinstance(rec.payload, bytes)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_corrupt_record(raw):
    # Without a matching checksum nothing can decode: every input must be CorruptRecord.
    if len(raw) >= 4 and crc32c.crc32c(raw[4:]).to_bytes(4, "big") == raw[:4]:
        _assert_corrupt_or_valid(raw)
    else:
        with pytest.raises(CorruptRecord):
            decode_record(raw, "q", 1, 2)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_body_behind_valid_checksum_raises_only_corrupt_record(body):
    _assert_corrupt_or_valid(framed(body))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=I64_MIN, max_value=U64_MAX) | st.floats()
    | st.text(max_size=16) | st.binary(max_size=16),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5) | st.binary(max_size=4), children,
                      max_size=5),
    max_leaves=20)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgpack_values | st.lists(msgpack_values, min_size=4, max_size=4))
def test_well_formed_msgpack_of_the_wrong_shape_raises_only_corrupt_record(value):
    _assert_corrupt_or_valid(framed(msgpack.packb(value, use_bin_type=True)))


@pytest.mark.parametrize("raw", [b"", b"\x00", b"\x00\x00\x00\x00", framed(b"")[:4]])
def test_records_shorter_than_a_header_are_corrupt(raw):
    with pytest.raises(CorruptRecord, match="shorter than a header"):
        decode_record(raw, "q", 0, 0)


def test_corrupt_record_names_queue_partition_and_seq():
    raw = bytearray(encode_record(1, "k", None, b"hello"))
    raw[-1] ^= 0xFF
    with pytest.raises(CorruptRecord) as info:
        decode_record(bytes(raw), "orders", 3, 41)
    exc = info.value
    assert (exc.queue, exc.partition, exc.seq) == ("orders", 3, 41)
    assert "'orders'" in str(exc) and "partition 3" in str(exc) and "seq 41" in str(exc)
    assert "crc32c" in exc.reason


@FAST
@given(ts=timestamps, key=keys, hdrs=headers, payload=st.binary(max_size=1024), data=st.data())
def test_any_single_flipped_bit_is_detected(ts, key, hdrs, payload, data):
    raw = bytearray(encode_record(ts, key, hdrs, payload))
    bit = data.draw(st.integers(min_value=0, max_value=len(raw) * 8 - 1), label="bit")
    raw[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptRecord):
        decode_record(bytes(raw), "q", 0, 0)


def test_every_single_bit_flip_of_one_record_is_detected():
    raw = encode_record(1_700_000_000_000_000_000, "customer-42", {"trace": "abc", "n": 7}, bytes(256))
    for bit in range(len(raw) * 8):
        damaged = bytearray(raw)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(CorruptRecord):
            decode_record(bytes(damaged), "q", 0, bit)


def test_truncated_records_are_detected():
    raw = encode_record(5, "k", {"a": "b"}, b"x" * 100)
    for n in range(len(raw)):
        with pytest.raises(CorruptRecord):
            decode_record(raw[:n], "q", 0, n)


# ---------------------------------------------------------------------------- encode/decode agreement
@settings(max_examples=50, deadline=None)
@given(hdrs=st.dictionaries(st.integers(-10, 10) | st.text(max_size=4), st.none(), min_size=1,
                            max_size=3))
def test_whatever_encode_accepts_decodes(hdrs):
    try:
        raw = encode_record(1, None, hdrs, b"p")
    except (TypeError, ValueError):
        return  # refusing to encode is fine; storing something undecodable is not
    assert decode_record(raw, "q", 0, 0).headers == hdrs


@pytest.fixture
def broker(broker):
    """The shared broker (tests/conftest.py) with a queue "q" of one partition."""
    broker.create_queue("q", partitions=1)
    return broker


@pytest.mark.parametrize("hdrs", [{"n": 1 << 64}, {"n": -(1 << 64)}])
def test_publish_rejects_out_of_range_header_ints_as_invalid_message(broker, hdrs):
    with pytest.raises(InvalidMessage):
        broker.publish("q", b"x", headers=hdrs)


def test_publish_rejects_unencodable_key_as_invalid_message(broker):
    with pytest.raises(InvalidMessage):
        broker.publish("q", b"x", key="\ud800")


def test_published_headers_with_int_keys_are_refused_or_delivered(broker):
    try:
        broker.publish("q", b"x", headers={1: "a"})
    except InvalidMessage:
        return
    flow = broker.bind("q")
    msgs = flow.receive(max_messages=1, timeout=2.0)
    assert [m.payload for m in msgs] == [b"x"]
