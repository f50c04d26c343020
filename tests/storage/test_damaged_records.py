"""Damaged records get a clear typed error and leave the rest of the store undamaged (rule
`checksums`): a flipped byte is reported once and stops only its partition (a ``skip_corrupt``
flow steps over it), and decoding arbitrary bytes raises only CorruptRecord.
"""
from __future__ import annotations

import crc32c
import lmdb
import msgpack
import pytest
from helpers import drain
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import partq
from partq.storage import decode_record, encode_record


# ============================================================================ damaged records
def keys_by_partition(n: int) -> dict[int, str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        found.setdefault(partq.key_partition(f"key{i}", n), f"key{i}")
        i += 1
    return found


def flip_everywhere(path, needle: bytes, at: int) -> int:
    """Flip one byte of every copy of ``needle`` in the file (LMDB leaves old copies of a page
    in freed pages; the live one is among them). Returns how many copies were changed."""
    with open(path, "r+b") as f:
        raw = bytearray(f.read())
        count, i = 0, raw.find(needle)
        while i >= 0:
            raw[i + at] ^= 0x5A
            count += 1
            i = raw.find(needle, i + 1)
        f.seek(0)
        f.write(raw)
    return count


@pytest.fixture
def corrupted(tmp_path):
    """A queue of 3 partitions, 5 messages each, with one byte of partition 1 seq 2 flipped."""
    data = tmp_path / "data"
    keys = keys_by_partition(3)
    with partq.Broker.open(data, clock=partq.ManualClock()) as b:
        b.create_queue("q", partitions=3, rebalance_delay=0.0)
        for p, key in keys.items():
            for j in range(5):
                assert b.publish("q", b"UNIQUE-%d-%d-PAYLOAD" % (p, j), key=key) == \
                    partq.PublishResult(p, j)
    assert flip_everywhere(data / "data.mdb", b"UNIQUE-1-2-PAYLOAD", 9) >= 1
    return data, keys


def test_flipped_byte_is_reported_once_and_stops_only_its_partition(corrupted):
    data, keys = corrupted
    with partq.Broker.open(data, clock=partq.ManualClock()) as b:
        flow = b.bind("q", name="c")
        delivered, errors = [], []
        for _ in range(6):
            try:
                msgs = flow.receive(100)
            except partq.CorruptRecord as exc:
                errors.append(exc)
                continue
            delivered += [(m.partition, m.seq) for m in msgs]
            flow.ack_many(msgs)
        assert len(errors) == 1, errors
        err = errors[0]
        assert (err.queue, err.partition, err.seq) == ("q", 1, 2)
        assert "'q'" in str(err) and "partition 1" in str(err) and "seq 2" in str(err)
        assert "skip_corrupt=True" in str(err)          # it says what to do
        assert sorted(delivered) == sorted([(0, j) for j in range(5)] + [(2, j) for j in range(5)]
                                           + [(1, 0), (1, 1)])
        status = b.queue_status("q").partitions[1]
        assert "seq 2" in status.error and status.depth == 3
        # other partitions keep delivering; partition 1 stays stopped
        for p in (0, 1, 2):
            b.publish("q", b"later-%d" % p, key=keys[p])
        later = drain(flow)
        assert sorted((m.partition, m.payload) for m in later) == [(0, b"later-0"), (2, b"later-2")]


def last_page(data) -> int:
    """The last page of data.mdb that LMDB uses (past it the file keeps a reserve for acks)."""
    env = lmdb.open(str(data), readonly=True, lock=False)
    try:
        return env.info()["last_pgno"]
    finally:
        env.close()


def test_skip_corrupt_flow_delivers_past_it_and_nothing_else_is_damaged(corrupted):
    data, _ = corrupted
    used = last_page(data)
    with partq.Broker.open(data, clock=partq.ManualClock()) as b:
        flow = b.bind("q", name="c", skip_corrupt=True)
        got = drain(flow)
        assert sorted((m.partition, m.seq) for m in got) == \
            sorted((p, j) for p in range(3) for j in range(5) if (p, j) != (1, 2))
        assert all(m.payload == b"UNIQUE-%d-%d-PAYLOAD" % (m.partition, m.seq) for m in got)
        assert b.queue_status("q").depth == 0           # the skipped record was acked past
    assert last_page(data) == used


def test_skipping_a_corrupt_record_lets_the_log_truncate(corrupted):
    data, keys = corrupted
    with partq.Broker.open(data, clock=partq.ManualClock()) as b:
        flow = b.bind("q", name="c", skip_corrupt=True)
        drain(flow)
        b.publish_many("q", [(b"more-%d" % i, keys[1]) for i in range(200)])
        drain(flow)
        status = b.queue_status("q")
        assert status.depth == 0
        assert status.partitions[1].ack_floor == status.partitions[1].next_seq


def test_skip_corrupt_flow_bound_after_the_error_in_the_same_process(corrupted):
    data, _ = corrupted
    with partq.Broker.open(data, clock=partq.ManualClock()) as b:
        flow = b.bind("q", name="c")
        with pytest.raises(partq.CorruptRecord):
            for _ in range(5):
                flow.ack_many(flow.receive(100))
        drain(flow)
        flow.unbind()
        skipping = b.bind("q", name="d", skip_corrupt=True)
        assert [(m.partition, m.seq) for m in drain(skipping)] == [(1, 3), (1, 4)]


# ---------------------------------------------------------------------- record fuzzing
def _checksum(body: bytes) -> bytes:
    """A record's header: the crc32c of its body, 4 bytes big-endian."""
    return crc32c.crc32c(body).to_bytes(4, "big")


SOUND_BODY = msgpack.packb([1, None, None, b""], use_bin_type=True)


ONE_BIT_OFF = bytes([_checksum(SOUND_BODY)[0] ^ 1]) + _checksum(SOUND_BODY)[1:] + SOUND_BODY


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
@example(b"")
@example(b"\x00\x00\x00\x00")                                    # a header, no body
@example(ONE_BIT_OFF)                                            # a sound body, a bad checksum
def test_decode_record_of_arbitrary_bytes_raises_only_corrupt_record(raw):
    """Bytes that do not start with the crc32c of the rest never decode: the only error is a
    CorruptRecord naming the record and saying what is wrong."""
    assume(len(raw) < 5 or raw[:4] != _checksum(raw[4:]))   # a valid checksum: next test
    with pytest.raises(partq.CorruptRecord) as err:
        decode_record(raw, "q", 1, 2)
    assert (err.value.queue, err.value.partition, err.value.seq) == ("q", 1, 2)
    reason = "shorter than a header" if len(raw) < 5 else "crc32c mismatch"
    assert reason in err.value.reason and reason in str(err.value)


def _sound_fields(body: bytes) -> list | None:
    """The record a body holds, read with msgpack alone: [publish_time_ns: int, key: str or
    None, headers: dict or None, payload: bytes]; None when it holds no such record."""
    try:
        f = msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises a zoo of types on bad input
        return None
    if (type(f) is list and len(f) == 4 and type(f[0]) is int and type(f[3]) is bytes
            and (f[1] is None or type(f[1]) is str) and (f[2] is None or type(f[2]) is dict)):
        return f
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
@example(msgpack.packb([7, "k", {"h": 1}, b"payload"], use_bin_type=True))   # a sound record
@example(msgpack.packb([7, None, None, b""], use_bin_type=True))             # a sound, empty one
@example(msgpack.packb([7, 8, None, b"payload"], use_bin_type=True))         # an int key
@example(msgpack.packb([7, "k", None, "text"], use_bin_type=True))           # a str payload
@example(msgpack.packb([7, "k", None], use_bin_type=True))                   # three fields
@example(b"\xc1")                                                             # not msgpack at all
def test_decode_record_of_arbitrary_body_behind_a_valid_checksum(body):
    """Behind a valid checksum, a body decodes exactly when it holds a well-typed record, and
    then to that record's fields; any other body is a CorruptRecord naming what is wrong (not
    the checksum)."""
    raw = _checksum(body) + body
    expected = _sound_fields(body) if body else None
    if expected is None:
        with pytest.raises(partq.CorruptRecord) as err:
            decode_record(raw, "q", 1, 2)
        assert (err.value.queue, err.value.partition, err.value.seq) == ("q", 1, 2)
        assert "crc32c" not in err.value.reason, err.value.reason
    else:
        rec = decode_record(raw, "q", 1, 2)
        assert list(rec) == expected and [type(x) for x in rec] == [type(x) for x in expected]


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=200), key=st.none() | st.text(max_size=20),
       pos=st.integers(min_value=0), xor=st.integers(min_value=1, max_value=255))
def test_any_flipped_byte_of_a_record_is_detected(payload, key, pos, xor):
    raw = bytearray(encode_record(123, key, None, payload))
    raw[pos % len(raw)] ^= xor
    with pytest.raises(partq.CorruptRecord):
        decode_record(bytes(raw), "q", 0, 0)
