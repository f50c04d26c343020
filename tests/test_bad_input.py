"""Bad input of every kind gets a clear typed error and leaves stored data undamaged.

Damaged records (S24), damaged or foreign files, a full map, wrong message types and sizes,
killed writers and stale reader slots (S25), and a broker used across ``fork()`` (STYLE 7).
Anything that could take the interpreter down (damaged files, kills, fork) runs in a child
process. A bug this finds is a strict xfail whose reason names the file, function and cause
until it is fixed; the ones found so far are fixed and their tests stay as regressions.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap

import crc32c
import lmdb
import msgpack
import pytest
from helpers import drain
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import partq
from partq.storage import decode_record, encode_record

PY = sys.executable
MiB = 1 << 20


def run_child(code: str, *args, env: dict | None = None, timeout: float = 60,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    full_env.update(env or {})
    return subprocess.run([PY, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, input=stdin)


def keys_by_partition(n: int) -> dict[int, str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        found.setdefault(partq.key_partition(f"key{i}", n), f"key{i}")
        i += 1
    return found


def file_digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ============================================================================ damaged records
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


def test_skip_corrupt_flow_delivers_past_it_and_nothing_else_is_damaged(corrupted):
    data, _ = corrupted
    size = os.path.getsize(data / "data.mdb")
    with partq.Broker.open(data, clock=partq.ManualClock()) as b:
        flow = b.bind("q", name="c", skip_corrupt=True)
        got = drain(flow)
        assert sorted((m.partition, m.seq) for m in got) == \
            sorted((p, j) for p in range(3) for j in range(5) if (p, j) != (1, 2))
        assert all(m.payload == b"UNIQUE-%d-%d-PAYLOAD" % (m.partition, m.seq) for m in got)
        assert b.queue_status("q").depth == 0           # the skipped record was acked past
    assert os.path.getsize(data / "data.mdb") == size


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


# ============================================================================ damaged files
OPEN_AND_USE = """
    import json, logging, sys, lmdb, partq
    skipped = []
    class Skips(logging.Handler):
        def emit(self, record):
            skipped.append(record.getMessage())
    logging.getLogger("partq.delivery").addHandler(Skips())
    out = {"outcome": "ok"}
    delivered = 0
    try:
        with partq.Broker.open(sys.argv[1]) as b:
            for c in b.queues():
                b.queue_status(c.name)
                flow = b.bind(c.name, name="x", skip_corrupt=True)
                while True:
                    msgs = flow.receive(1000, timeout=0.05)
                    if not msgs:
                        break
                    delivered += len(msgs)
                    flow.ack_many(msgs)
                b.publish(c.name, b"after", key="z")
        out.update(delivered=delivered, skipped=len(skipped))
    except partq.PartqError as exc:
        out = {"outcome": "partq", "error": type(exc).__name__, "message": str(exc)}
    except lmdb.Error as exc:
        out = {"outcome": "raw lmdb error", "error": type(exc).__name__, "message": str(exc)}
    except Exception as exc:
        out = {"outcome": "other", "error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(out))
"""


def damaged_store(tmp_path, damage) -> tuple:
    """A store with messages, its data.mdb passed through ``damage(bytes) -> bytes``; returns
    (exit status, outcome dict) of a child that opens and uses it."""
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=3)
        b.publish_many("q", [(b"PAYLOAD-%05d-" % i + b"x" * 200, f"k{i}") for i in range(600)])
    path = data / "data.mdb"
    path.write_bytes(damage(path.read_bytes()))
    res = run_child(OPEN_AND_USE, data)
    outcome = json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else None
    return res.returncode, outcome, res.stderr[-2000:]


def _garble_meta(raw, rng):
    return rng.randbytes(8192) + raw[8192:]


DAMAGE = {
    "random whole file": lambda raw, rng: rng.randbytes(len(raw)),
    "random meta pages": _garble_meta,
    "zeros": lambda raw, rng: bytes(len(raw)),
    "text": lambda raw, rng: b"not an lmdb file\n" * 500,
    "one page left": lambda raw, rng: raw[:4096],
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
@pytest.mark.parametrize("seed", [0, 1])
def test_damaged_file_is_a_typed_error(tmp_path, how, seed):
    rng = random.Random(seed)
    status, outcome, err = damaged_store(tmp_path, lambda raw: DAMAGE[how](raw, rng))
    assert status == 0, f"the child died ({status}): {err}"
    assert outcome["outcome"] == "partq", outcome
    assert outcome["error"] in ("CorruptStore", "NotAPartqStore"), outcome


def test_random_bytes_in_a_data_page_are_a_typed_error(tmp_path):
    def garble_a_payload_page(raw):
        pages = sorted({i // 4096 for i in range(0, len(raw), 64) if b"PAYLOAD-" in raw[i:i + 64]})
        p = pages[len(pages) // 2]
        return raw[:p * 4096] + random.Random(5).randbytes(4096) + raw[(p + 1) * 4096:]
    status, outcome, err = damaged_store(tmp_path, garble_a_payload_page)
    assert status == 0, f"the child died ({status}): {err}"
    if outcome["outcome"] == "ok":
        # the page held records only (chunks of records live in their own pages): each damaged
        # record failed its checksum and the skip_corrupt flow logged and stepped over it
        assert outcome["skipped"] > 0 and outcome["delivered"] + outcome["skipped"] == 600, outcome
    else:
        assert outcome["outcome"] == "partq", outcome


def test_truncated_data_file_is_a_typed_error_not_sigbus(tmp_path):
    status, outcome, err = damaged_store(tmp_path, lambda raw: raw[:len(raw) // 2])
    assert status == 0, f"the child died by signal {-status}: {err}"
    assert outcome["outcome"] == "partq", outcome


# ============================================================================ foreign directories
def test_directory_of_another_program(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(partq.NotAPartqStore, match="other files"):
        partq.Broker.open(other)
    assert sorted(os.listdir(other)) == ["notes.txt"]
    assert (other / "notes.txt").read_text() == "mine"


def test_lmdb_environment_of_another_program(tmp_path):
    other = tmp_path / "other"
    env = lmdb.open(str(other), max_dbs=2)
    users = env.open_db(b"users")
    with env.begin(write=True) as txn:
        txn.put(b"alice", b"1", db=users)
        txn.put(b"plain-key", b"value")
    env.close()
    before = file_digest(other / "data.mdb")
    with pytest.raises(partq.NotAPartqStore, match="not a partq store"):
        partq.Broker.open(other)
    assert file_digest(other / "data.mdb") == before
    env = lmdb.open(str(other), max_dbs=2)
    with env.begin() as txn:
        assert txn.get(b"alice", db=env.open_db(b"users", txn=txn)) == b"1"
    env.close()


def test_a_file_and_a_missing_directory(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(partq.NotAPartqStore, match="is a file"):
        partq.Broker.open(tmp_path / "file")
    with pytest.raises(partq.NotAPartqStore, match="does not exist"):
        partq.Broker.open(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


# ============================================================================ full map
FOLLOWER = """
    import json, sys, partq
    b = partq.Broker.open(sys.argv[1], map_size=1 << 20, max_map_size=64 << 20)
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        try:
            if cmd == "depth":
                out = b.queue_status("q").depth
            elif cmd == "publish":
                out = b.publish("q", b"from-follower", key="f").seq
            elif cmd == "drain":
                flow = b.bind("q", name="follower")
                out = []
                while True:
                    msgs = flow.receive(1000, timeout=0.2)
                    if not msgs:
                        break
                    out += [m.payload[:9].decode() for m in msgs]
                    flow.ack_many(msgs)
                flow.unbind()
        except Exception as exc:
            out = f"{type(exc).__name__}: {exc}"
        print(json.dumps(out), flush=True)
"""


def test_full_map(tmp_path):
    data = tmp_path / "data"
    b = partq.Broker.open(data, map_size=MiB, max_map_size=2 * MiB, clock=partq.ManualClock())
    b.create_queue("q", partitions=3, rebalance_delay=0.0)
    n, failed = 0, None
    while failed is None:
        batch = [(b"M%07d-" % (n + i) + b"y" * 1000, f"k{n + i}") for i in range(50)]
        heads = [p.next_seq for p in b.queue_status("q").partitions]
        try:
            b.publish_many("q", batch)
            n += 50
        except partq.StorageFull as exc:
            failed = exc
    assert "max_map_size" in str(failed)
    # the failed batch left nothing behind
    assert [p.next_seq for p in b.queue_status("q").partitions] == heads
    assert b.queue_status("q").depth == n
    follower = subprocess.Popen([PY, "-c", textwrap.dedent(FOLLOWER), str(data)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        def ask(cmd):
            follower.stdin.write(cmd + "\n")
            follower.stdin.flush()
            return json.loads(follower.stdout.readline())
        assert json.loads(follower.stdout.readline()) == "ready"
        assert ask("depth") == n
        # consume and ack still work at the limit
        flow = b.bind("q", name="c")
        got = drain(flow)
        assert [m.payload[:9] for m in sorted(got, key=lambda m: m.payload)] == \
            [b"M%07d-" % i for i in range(n)]
        assert b.queue_status("q").depth == 0
        b.close()
        # reopened with a larger limit, publishing works and the map grows past the old limit
        b = partq.Broker.open(data, map_size=MiB, max_map_size=64 * MiB, clock=partq.ManualClock())
        k = 4000
        for j in range(0, k, 50):
            b.publish_many("q", [(b"N%07d-" % (j + i) + b"z" * 1000, f"k{j + i}") for i in range(50)])
        assert os.path.getsize(data / "data.mdb") > 2 * MiB
        # the other process, opened at the old size, follows the resize
        assert ask("depth") == k
        assert isinstance(ask("publish"), int)
        drained = ask("drain")
        assert isinstance(drained, list), drained
        assert sorted(drained) == sorted([f"N{i:07d}-" for i in range(k)] + ["from-foll"])
        assert b.queue_status("q").depth == 0
    finally:
        follower.stdin.close()
        follower.wait(timeout=30)
        b.close()


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


# ============================================================================ killed writers
KILLED_WRITER = """
    import importlib, json, os, sys, threading, partq
    from partq.storage import crashpoints
    b = partq.Broker.open(sys.argv[1], clock=partq.ManualClock())
    print(json.dumps({"report": b.open_report, "size": os.path.getsize(sys.argv[1] + "/data.mdb")}),
          flush=True)
    held = threading.Event()

    def hold_a_reader():          # a reader slot that goes stale when this process is killed
        with b.store.read():
            held.set()
            threading.Event().wait()
    threading.Thread(target=hold_a_reader, daemon=True).start()
    held.wait()
    i = int(sys.argv[2])
    # a steady backlog: publish, consume, ack (freed pages must be reused, not added)
    for j in range(3):
        b.publish_many("q", [(b"steady-%d-%d-%d" % (i, j, k) + b"s" * 2000, "k%d" % j)
                             for k in range(10)])
    flow = b.bind("q", name="c")
    while True:
        msgs = flow.receive(1000)
        if not msgs:
            break
        flow.ack_many(msgs)
    # now a write transaction dies just before its commit
    os.environ["PARTQ_CRASH_AT"] = "before_commit:1"
    importlib.reload(crashpoints)
    b.publish_many("q", [(b"doomed-%d-%d" % (i, k) + b"d" * 2000, "k%d" % k) for k in range(30)])
    print("the doomed batch was committed", flush=True)
"""


def test_killed_writers_and_stale_readers(tmp_path):
    """Each child holds a read transaction, publishes and drains a steady backlog, then is
    SIGKILLed inside the write transaction of a batch (PARTQ_CRASH_AT=before_commit:1, armed
    just before it). This process keeps the directory open all along, as a long-running service
    would (when nobody has it open, LMDB resets the reader table at the next open anyway). Each
    next open works and clears the dead child's reader slot, nothing of a doomed batch is ever
    visible, and the file stops growing."""
    data = tmp_path / "data"
    keeper = partq.Broker.open(data, clock=partq.ManualClock())
    try:
        keeper.create_queue("q", partitions=3, rebalance_delay=0.0)
        sizes = []
        for i in range(14):
            res = run_child(KILLED_WRITER, data, i)
            assert res.returncode == -signal.SIGKILL, (res.returncode, res.stdout, res.stderr[-2000:])
            opened = json.loads(res.stdout.splitlines()[0])
            if i > 0:
                assert opened["report"]["stale_readers_cleared"] >= 1, opened
            sizes.append(opened["size"])
            status = keeper.queue_status("q")
            assert status.depth == 0
            assert sum(p.next_seq for p in status.partitions) == (i + 1) * 30   # steady ones only
        sizes.append(os.path.getsize(data / "data.mdb"))
        # after some rounds of warm-up the file keeps its size (records of one batch are one
        # chunk in overflow pages, which want contiguous free pages: warm-up takes a few rounds)
        print("data.mdb sizes", sizes)
        assert sizes[-1] <= sizes[7], sizes
    finally:
        keeper.close()
    with partq.Broker.open(data) as b:
        assert drain(b.bind("q", name="c")) == []


# ============================================================================ fork
FORK_OPS = {
    "publish": lambda b, flow, msgs: b.publish("q", b"x", key="a"),
    "publish_many": lambda b, flow, msgs: b.publish_many("q", [(b"x", "a")]),
    "receive": lambda b, flow, msgs: flow.receive(10),
    "ack_many": lambda b, flow, msgs: flow.ack_many(msgs),
    "bind": lambda b, flow, msgs: b.bind("q", name="other"),
    "queue_status": lambda b, flow, msgs: b.queue_status("q"),
    "queues": lambda b, flow, msgs: b.queues(),
    "tick": lambda b, flow, msgs: b.tick(),
}


def in_forked_child(fn) -> dict:
    """Run ``fn()`` in a forked child; return what it returned (JSON) or its exception."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            out = {"result": fn()}
        except BaseException as exc:
            out = {"error": type(exc).__name__, "message": str(exc)}
        os.write(w, json.dumps(out, default=repr).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


@pytest.fixture
def forked_setup(tmp_path):
    data = tmp_path / "data"
    b = partq.Broker.open(data, clock=partq.ManualClock())   # no ticker thread: see the report
    b.create_queue("q", partitions=2, rebalance_delay=0.0)
    b.publish("q", b"before-fork", key="a")
    flow = b.bind("q", name="c")
    msgs = flow.receive(10)
    yield data, b, flow, msgs
    b.close()


@pytest.mark.parametrize("op", sorted(FORK_OPS))
def test_broker_used_across_fork(forked_setup, op):
    data, b, flow, msgs = forked_setup
    out = in_forked_child(lambda: FORK_OPS[op](b, flow, msgs) and None)
    assert out.get("error") == "UsedAcrossFork", out
    assert "fork" in out["message"] and str(data) in out["message"]
    assert "open" in out["message"].lower()           # it says what to do
    # the parent is unharmed
    flow.ack_many(msgs)
    b.publish("q", b"after-fork", key="a")
    assert [m.payload for m in drain(flow)] == [b"after-fork"]


def test_closing_an_inherited_broker_in_a_child_keeps_the_parents_delivery_lock(forked_setup):
    data, b, flow, msgs = forked_setup
    in_forked_child(lambda: b.close())
    res = run_child("""
        import sys, partq
        with partq.Broker.open(sys.argv[1]) as b:
            b.bind("q", name="intruder")      # served by whoever owns delivery (S29)
            print(b.queue_status("q").delivery_owner)
    """, data)
    assert res.stdout.startswith(f"pid {os.getpid()} "), res.stdout + res.stderr[-2000:]


def test_opening_the_broker_again_in_the_child(forked_setup):
    """Either it works, or it is refused with UsedAcrossFork: never a misleading error (it used
    to be CorruptStore "already open in this process")."""
    data, b, flow, msgs = forked_setup

    def child():
        with partq.Broker.open(data, clock=partq.ManualClock()) as again:
            return again.publish("q", b"from-child", key="a").seq
    out = in_forked_child(child)
    assert "result" in out or out["error"] == "UsedAcrossFork", out
    flow.ack_many(msgs)
    assert [m.payload for m in drain(flow)] == ([b"from-child"] if "result" in out else [])
