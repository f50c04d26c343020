"""``partq verify`` against a byte flipped on disk, and how inspect and copy-out treat the damaged
record (shown as corrupt, never a crash; copy-out stops before it unless told to skip it)."""
from __future__ import annotations

import json

import pytest
from tools_helpers import json_lines, ok, user_error

import partq

NEEDLE = b"UNIQUE-PAYLOAD-5f0c2e9a-needle"


def test_verify_a_clean_store(run, broker):
    ok(run("queue", "create", "a", "-p", "3"))
    ok(run("queue", "create", "b"))
    broker.publish_many("a", [(b"x%d" % i, f"k{i}") for i in range(50)])
    broker.publish_many("b", [b"y"] * 5)
    assert "checked 55 records in 2 queues: all intact" in ok(run("verify")).stdout
    doc = json.loads(ok(run("verify", "--json")).stdout)
    assert doc == {"checked": 55, "queues": {"a": 50, "b": 5}, "corrupt": [], "damaged_pages": [],
                   "records_checked": True, "ok": True}
    assert json.loads(ok(run("verify", "b", "--json")).stdout)["checked"] == 5


@pytest.fixture
def damaged(data):
    """A store with one flipped byte inside one record's payload; returns (partition, seq)."""
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=3)
        b.create_queue("clean")
        b.publish_many("clean", [b"fine"] * 3)
        b.publish_many("q", [(b"payload %d" % i, f"k{i}") for i in range(60)])
        res = b.publish("q", NEEDLE, key="needle")    # last: no later commit copies its page
    path = f"{data}/data.mdb"
    with open(path, "r+b") as f:
        raw = f.read()
        assert raw.count(NEEDLE) == 1, "the needle must be in exactly one place on disk"
        at = raw.index(NEEDLE) + len(NEEDLE) // 2
        f.seek(at)
        f.write(bytes([raw[at] ^ 0x01]))
    return res.partition, res.seq


def test_verify_reports_the_flipped_record(run, damaged):
    p, seq = damaged
    result = run("verify")
    user_error(result, f"1 corrupt record (q partition {p} seq {seq})")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["QUEUE", "PARTITION", "SEQ", "REASON"]
    assert lines[1].split() == ["q", str(p), str(seq), "crc32c", "mismatch"]
    assert "checked 64 records in 2 queues: 1 corrupt" in result.stdout
    as_json = run("verify", "--json")
    assert as_json.exit_code == 1
    doc = json.loads(as_json.stdout)
    assert doc["ok"] is False and doc["checked"] == 64
    assert doc["corrupt"] == [{"queue": "q", "partition": p, "seq": seq, "reason": "crc32c mismatch"}]
    ok(run("verify", "clean"))


def test_inspect_shows_the_corrupt_record(run, damaged):
    p, seq = damaged
    rows = json_lines(ok(run("inspect", "q", "-p", p, "--json")).stdout)
    bad = [r for r in rows if r.get("corrupt")]
    assert [(r["seq"], r["error"]) for r in bad] == [(seq, "crc32c mismatch")]
    assert len(rows) == seq + 1                     # every other record still shows
    text = ok(run("inspect", "q", "-p", p, "--from-seq", seq)).stdout
    assert "CORRUPT: crc32c mismatch" in text


def test_copy_out_stops_before_the_corrupt_record_and_can_skip_it(run, damaged, tmp_path):
    p, seq = damaged
    out = tmp_path / "o.jsonl"
    user_error(run("copy-out", "q", "--to-file", out, "--partition", p),
               f"partition {p} seq {seq}", "--skip-corrupt")
    assert [r["seq"] for r in json_lines(out.read_text())] == list(range(seq))
    doc = json.loads(ok(run("copy-out", "q", "--to-file", out, "--skip-corrupt", "--json")).stdout)
    assert next(x for x in doc["partitions"] if x["partition"] == p)["skipped_corrupt"] == [seq]
    assert len(json_lines(out.read_text())) == 60    # all but the damaged one, each once
