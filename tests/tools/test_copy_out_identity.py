"""Regression tests (operator issue, finding 1): a copy-out resumes only a copy of the very same
queues. Checkpoints used to be keyed by queue *name* and outlive the queue, so after a queue was
deleted and created again under its name, `copy-out --move` printed "copied 0" and then removed
every message of the new parent queue. Each test runs the installed `partq` script in a separate
process, as an operator would."""
from __future__ import annotations

import json

from tools_helpers import run_script, script_user_error

import partq
from partq import PARENT


def _stranded_queue(script: str, data: str, name: str, payloads: list[bytes]) -> None:
    """An exclusive queue holding ``payloads``, then made non-exclusive: they are stranded in
    its parent queue."""
    assert run_script(script, data, "queue", "create", name, "-p", "3", "--access-type",
                      "exclusive").returncode == 0
    with partq.Broker.open(data) as broker:
        broker.publish_many(name, [(p, f"k{i % 7}") for i, p in enumerate(payloads)])
    proc = run_script(script, data, "queue", "update", name, "--access-type", "non-exclusive",
                      "--yes")
    assert proc.returncode == 0, proc.stderr


def _payloads(broker, name: str) -> list[bytes]:
    flow = broker.bind(name)
    got = []
    while msgs := flow.receive(max_messages=1000, timeout=0.2):
        got += [m.payload for m in msgs]
        flow.ack_many(msgs)
    flow.unbind()
    return got


def test_move_into_a_queue_created_again_moves_every_message(partq_script, data):
    first = [b"first-%d" % i for i in range(100)]
    _stranded_queue(partq_script, data, "mv", first)
    proc = run_script(partq_script, data, "copy-out", "mv", "--parent", "--to-queue", "mv",
                      "--move", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["copied"] == 100 and doc["removed_from_parent"] == 100

    assert run_script(partq_script, data, "queue", "delete", "mv", "--yes").returncode == 0
    second = [b"second-%d" % i for i in range(100)]
    _stranded_queue(partq_script, data, "mv", second)
    proc = run_script(partq_script, data, "copy-out", "mv", "--parent", "--to-queue", "mv",
                      "--move", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["copied"] == 100 and doc["removed_from_parent"] == 100
    with partq.Broker.open(data) as broker:
        status = broker.queue_status("mv")
        assert (status.depth, status.parent_depth) == (100, 0)
        assert sorted(_payloads(broker, "mv")) == sorted(second)


def test_copy_into_a_destination_created_again_copies_everything(partq_script, data):
    with partq.Broker.open(data) as broker:
        broker.create_queue("src", partitions=2)
        broker.publish_many("src", [b"m%d" % i for i in range(50)])
        broker.create_queue("dst", partitions=2)
    assert run_script(partq_script, data, "copy-out", "src", "--to-queue", "dst").returncode == 0
    assert run_script(partq_script, data, "queue", "delete", "dst", "--yes").returncode == 0
    assert run_script(partq_script, data, "queue", "create", "dst", "-p", "2").returncode == 0
    proc = run_script(partq_script, data, "copy-out", "src", "--to-queue", "dst", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["copied"] == 50
    with partq.Broker.open(data) as broker:
        assert broker.queue_status("dst").depth == 50


def test_copy_of_a_source_created_again_copies_everything(partq_script, data):
    with partq.Broker.open(data) as broker:
        broker.create_queue("dst", partitions=2)
        broker.create_queue("src", partitions=2)
        broker.publish_many("src", [b"old%d" % i for i in range(30)])
    assert run_script(partq_script, data, "copy-out", "src", "--to-queue", "dst").returncode == 0
    assert run_script(partq_script, data, "queue", "delete", "src", "--yes").returncode == 0
    with partq.Broker.open(data) as broker:
        broker.create_queue("src", partitions=2)
        broker.publish_many("src", [b"new%d" % i for i in range(30)])
    proc = run_script(partq_script, data, "copy-out", "src", "--to-queue", "dst", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["copied"] == 30
    with partq.Broker.open(data) as broker:
        assert broker.queue_status("dst").depth == 60


def test_an_export_of_a_deleted_queue_is_not_continued(partq_script, data, tmp_path):
    out = tmp_path / "export.jsonl"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=1)
        broker.publish_many("q", [b"old%d" % i for i in range(10)])
    assert run_script(partq_script, data, "copy-out", "q", "--to-file", out).returncode == 0
    before = out.read_bytes()
    assert run_script(partq_script, data, "queue", "delete", "q", "--yes").returncode == 0
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=1)
        broker.publish_many("q", [b"new%d" % i for i in range(10)])
    script_user_error(run_script(partq_script, data, "copy-out", "q", "--to-file", out),
                      "earlier queue named 'q'", "--overwrite")
    assert out.read_bytes() == before
    proc = run_script(partq_script, data, "copy-out", "q", "--to-file", out, "--overwrite",
                      "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["copied"] == 10
    payloads = [json.loads(line)["payload_b64"] for line in out.read_text().splitlines()]
    assert len(payloads) == 10


def test_move_leaves_a_corrupt_record_it_skipped(partq_script, data):
    """--move removes only what was copied: a record skipped as corrupt stays, also when a
    later run resumes the copy and removes what the earlier run left."""
    _stranded_queue(partq_script, data, "q", [b"p%d" % i for i in range(20)])
    with partq.Broker.open(data) as broker:
        qid = broker.queue_config("q").qid
    # copy without --move first (the "earlier run"), skipping a damaged record
    _damage_record(data, qid, PARENT, 5)
    proc = run_script(partq_script, data, "copy-out", "q", "--parent", "--to-queue", "q",
                      "--skip-corrupt", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["copied"] == 19
    proc = run_script(partq_script, data, "copy-out", "q", "--parent", "--to-queue", "q",
                      "--skip-corrupt", "--move", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["copied"] == 0 and doc["removed_from_parent"] == 19
    with partq.Broker.open(data) as broker:
        status = broker.queue_status("q")
        assert (status.depth, status.parent_depth) == (19, 1)


def _damage_record(data: str, qid: int, partition: int, seq: int) -> None:
    """Flip a byte inside record ``seq`` of a partition's log, in place (its crc32c fails)."""
    import lmdb
    import msgpack

    from partq.storage.encoding import log_key, unpack_chunk
    env = lmdb.open(data, max_dbs=16)
    log = env.open_db(b"log")
    with env.begin(write=True) as txn:
        cur = txn.cursor(db=log)
        assert cur.set_range(log_key(qid, partition, seq))
        last = int.from_bytes(cur.key()[8:], "big")
        first, records = unpack_chunk(cur.value(), last)
        rec = bytearray(records[seq - first])
        rec[-1] ^= 0xFF
        records[seq - first] = bytes(rec)
        txn.put(cur.key(), msgpack.packb([first, *records], use_bin_type=True), db=log)
    env.close()
