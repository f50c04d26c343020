"""``partq verify`` against damage that reading records does not meet: a flipped bit in LMDB's
free list (which only a commit reads: publishing fails, or hands out a page still in use), and a
flipped bit in a chunk's key (its records sort elsewhere, or the key names a range the chunk
does not hold). Verify names what is damaged; consumers get a typed ``CorruptRecord``, and a
``skip_corrupt`` flow delivers everything else.

The store is made by a real Broker, damaged on disk with the file's own layout (LMDB 0.9's meta
pages: the one with the larger transaction id names the free list's root page), and used by
real processes.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap

import pytest
from helpers import run_child

import partq

PSIZE = 4096
NO_PAGE = (1 << 64) - 1
# after the 16-byte page header: magic, version, address, map size, then two 48-byte database
# records (the free list's, the main database's), the last page, the transaction id
META = struct.Struct("<IIQQ48s48sQQ")
DB_ROOT = 40                # offset of the root page number in a database record
P_LEAF = 0x02


def newest_meta(raw: bytes) -> tuple[int, int, int]:
    """(free list root, main database root, last page) of the meta page LMDB uses."""
    metas = [META.unpack_from(raw, page * PSIZE + 16) for page in (0, 1)]
    magic, _, _, _, free, main, last_pg, _ = max(metas, key=lambda m: m[7])
    assert magic == 0xBEEFC0DE
    return (int.from_bytes(free[DB_ROOT:DB_ROOT + 8], "little"),
            int.from_bytes(main[DB_ROOT:DB_ROOT + 8], "little"), last_pg)


def make_store(data) -> None:
    """Messages published and some acked, so that the free list has entries."""
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=3)
        for i in range(10):
            b.publish_many("q", [(b"m%d-%d" % (i, j) + b"x" * 300, f"k{j}") for j in range(40)])
        flow = b.bind("q", "c")
        for _ in range(3):
            flow.ack_many(flow.receive(100, timeout=5))
        flow.unbind()


def damage_free_list(data, how: str) -> int:
    """Damage the root page of the free list; returns its page number."""
    path = f"{data}/data.mdb"
    with open(path, "r+b") as f:
        raw = bytearray(f.read())
        root, main_root, _ = newest_meta(raw)
        assert root != NO_PAGE, "the free list is empty: nothing to damage"
        page = root * PSIZE
        assert raw[page + 10] == P_LEAF, "a free list this small is one leaf page"
        node = page + int.from_bytes(raw[page + 16:page + 18], "little")   # its first entry
        assert raw[node + 4] == 0, "the entry's page numbers are on the page itself"
        data_at = node + 8 + int.from_bytes(raw[node + 6:node + 8], "little")
        if how == "flag":               # one bit: the page no longer says it is a leaf
            raw[page + 10] ^= P_LEAF
        elif how == "count":            # one bit: the entry claims far more pages than it holds
            raw[data_at + 3] ^= 0x10
        else:                           # the entry lists a page in use as free
            raw[data_at + 8:data_at + 16] = main_root.to_bytes(8, "little")
        f.seek(0)
        f.write(raw)
    return root


def cli(script, data, *args) -> subprocess.CompletedProcess:
    return subprocess.run([script, "--data", str(data), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("how", ["flag", "count", "page in use"])
def test_verify_finds_a_damaged_free_list(partq_script, tmp_path, how):
    data = tmp_path / "data"
    make_store(data)
    ok = cli(partq_script, data, "verify", "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True, ok.stdout + ok.stderr
    stored = json.loads(ok.stdout)["checked"]
    before = tmp_path / "before.jsonl"
    assert cli(partq_script, data, "copy-out", "q", "--to-file", before).returncode == 0
    root = damage_free_list(data, how)

    checked = cli(partq_script, data, "verify", "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    doc = json.loads(checked.stdout)
    assert doc["ok"] is False and doc["damaged_pages"], doc
    assert all(d["tree"] == "free list" for d in doc["damaged_pages"]), doc
    if how != "page in use":
        assert doc["damaged_pages"][0]["page"] == root
    # reads never touch the free list: every record is still checked, and intact
    assert doc["records_checked"] is True and doc["checked"] == stored and doc["corrupt"] == []
    line = checked.stderr.strip().splitlines()[-1]
    assert "LMDB's free list" in line and "copy-out" in line and "DR-standby" in line, line

    text = cli(partq_script, data, "verify")
    assert text.returncode == 1 and "free list" in text.stdout, text.stdout
    # what can be read is copied out, as the error says
    after = tmp_path / "after.jsonl"
    copied = cli(partq_script, data, "copy-out", "q", "--to-file", after)
    assert copied.returncode == 0, copied.stderr
    assert after.read_text() == before.read_text() and after.read_text()


def test_the_damaged_free_list_is_what_breaks_publishing(partq_script, tmp_path):
    """The damage verify reports is the damage a publish fails on."""
    data = tmp_path / "data"
    make_store(data)
    damage_free_list(data, "flag")
    published = cli(partq_script, data, "publish", "q", "one more")
    assert published.returncode == 1 and "MDB_CORRUPTED" in published.stderr, published.stderr
    assert "free list" in cli(partq_script, data, "verify").stderr


# ------------------------------------------------------------------------- chunk keys
CONSUME = """
    import json, sys, partq
    out = {"got": [], "error": None}
    try:
        with partq.Broker.open(sys.argv[1]) as b:
            flow = b.bind("q", "c", skip_corrupt=sys.argv[2] == "skip")
            while True:
                msgs = flow.receive(1000, timeout=0.2)
                if not msgs:
                    break
                out["got"] += [m.seq for m in msgs]
                flow.ack_many(msgs)
    except partq.PartqError as exc:
        out["error"] = [type(exc).__name__, getattr(exc, "seq", None), str(exc)]
    print(json.dumps(out))
"""


def flip_chunk_key(data, qid: int, last: int, byte: int, bit: int) -> int:
    """Flip one bit of the log key (queue id, partition 0, ``last``) in every copy of it in
    data.mdb (LMDB leaves older copies in freed pages); returns how many there were."""
    key = struct.pack(">IIQ", qid, 0, last)
    path = f"{data}/data.mdb"
    with open(path, "r+b") as f:
        raw = bytearray(f.read())
        count, i = 0, raw.find(key)
        while i >= 0:
            raw[i + byte] ^= 1 << bit
            count += 1
            i = raw.find(key, i + 1)
        f.seek(0)
        f.write(raw)
    return count


@pytest.fixture
def flipped_key(tmp_path):
    """Three chunks of 100 messages in one partition; the middle chunk's key (last seq 199)
    gets a high bit of its sequence flipped: it now claims to end at seq 2**40 + 199."""
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("q")
        qid = b.queue_config("q").qid
        for i in range(3):
            b.publish_many("q", [b"m%d" % (i * 100 + j) for j in range(100)])
    assert flip_chunk_key(data, qid, 199, 10, 0) >= 1
    return data, qid


def test_verify_names_a_chunk_key_with_a_flipped_bit(partq_script, flipped_key):
    data, qid = flipped_key
    checked = cli(partq_script, data, "verify", "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    doc = json.loads(checked.stdout)
    bad_key = struct.pack(">IIQ", qid, 0, (1 << 40) + 199).hex()
    named = [c for c in doc["corrupt"] if c.get("key") == bad_key]
    assert named and named[0]["queue"] == "q" and named[0]["partition"] == 0, doc["corrupt"]
    assert "100..199" in named[0]["reason"], named
    # the records the damaged key hid are reported one by one, and nothing else
    assert sorted(c["seq"] for c in doc["corrupt"] if c["seq"] is not None) == list(range(100, 200))
    assert f"chunk key {bad_key}" in checked.stderr or "corrupt record" in checked.stderr


def test_consumers_get_corrupt_record_and_skip_past_a_flipped_chunk_key(flipped_key):
    data, _ = flipped_key
    res = run_child(CONSUME, data, "stop")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["got"] == list(range(100)), out["got"][:5]
    assert out["error"][:2] == ["CorruptRecord", 100], out["error"]
    assert "partq verify" in out["error"][2]

    res = run_child(CONSUME, data, "skip")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["error"] is None and out["got"] == list(range(200, 300)), out


def test_verify_read_only_finds_a_damaged_free_list(partq_script, tmp_path):
    """Without LMDB's reader lock (``--read-only``) the pages are walked as well."""
    data = tmp_path / "data"
    make_store(data)
    root = damage_free_list(data, "count")
    checked = cli(partq_script, data, "verify", "--read-only", "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    doc = json.loads(checked.stdout)
    assert [(d["tree"], d["page"]) for d in doc["damaged_pages"]][:1] == [("free list", root)], doc


WRITER = """
    import sys, partq
    with partq.Broker.open(sys.argv[1]) as b:
        b.create_queue("w", partitions=4)
        flow = b.bind("w", "c")
        for i in range(300):
            b.publish_many("w", [(b"x" * (i % 5) * 700, f"k{j}") for j in range(20)])
            flow.ack_many(flow.receive(15, timeout=0))
        print("done", flush=True)
"""


def test_verify_finds_nothing_wrong_while_another_process_writes(partq_script, tmp_path):
    """The pages and keys are checked on one commit's snapshot each: a writer committing
    meanwhile never shows as damage (nor does a lock-free reader's, which walks again)."""
    data = tmp_path / "data"
    make_store(data)
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(data)],
                              stdout=subprocess.PIPE, text=True)
    runs = 0
    try:
        while writer.poll() is None or runs < 2:
            for extra in ([], ["--read-only"]):
                checked = cli(partq_script, data, "verify", *extra, "--json")
                if checked.returncode != 0 and "changed under" in checked.stderr:
                    continue        # a lock-free read under a busy writer may give up: not damage
                assert checked.returncode == 0, checked.stdout + checked.stderr
                doc = json.loads(checked.stdout)
                assert doc["damaged_pages"] == [] and doc["records_checked"] is True
                runs += 1
    finally:
        out, _ = writer.communicate(timeout=120)
    assert writer.returncode == 0 and out.strip() == "done"
