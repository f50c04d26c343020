"""The LMDB store damaged on disk: a flipped byte is a CorruptRecord naming its position (rule
`checksums`), a damaged B-tree page is a CorruptStore, never an abort.

Every test runs against a real LMDB environment in its own ``tmp_path`` directory (fixtures in
tests/storage/conftest.py); the main write/read tests run once per durability mode.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from store_helpers import append, make_queue

from partq.errors import CorruptRecord
from partq.storage import decode_record

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- damage on disk
@pytest.mark.parametrize("payload_size", [200, 20_000], ids=["inline", "overflow-page"])
def test_flipped_byte_on_disk_is_a_corrupt_record_naming_its_position(tmp_path, opened, durability,
                                                                       payload_size):
    path = tmp_path / "d"
    store = opened(path, durability=durability)
    qid = make_queue(store, partitions=2)
    marker = b"MARKER-7f3a9c" + os.urandom(8).hex().encode()
    marker_payload = marker + b"." * (payload_size - len(marker))
    append(store, qid, 1, [b"before-%d" % i for i in range(5)])
    marker_seq = append(store, qid, 1, [marker_payload])
    append(store, qid, 1, [b"after-%d" % i for i in range(5)])
    store.close()

    data = bytearray((path / "data.mdb").read_bytes())
    hits = []
    at = data.find(marker)
    while at != -1:  # LMDB may still hold stale copies of the page: damage every copy
        hits.append(at)
        data[at + len(marker) // 2] ^= 0x01
        at = data.find(marker, at + 1)
    assert hits, "marker payload not found in data.mdb"
    (path / "data.mdb").write_bytes(bytes(data))

    store = opened(path, durability=durability)
    with store.read() as r:
        raws = dict(r.records(qid, 1, 0, 100))
    assert sorted(raws) == list(range(11))
    for seq, raw in raws.items():
        if seq == marker_seq:
            with pytest.raises(CorruptRecord) as info:
                decode_record(raw, "orders", 1, seq)
            assert (info.value.queue, info.value.partition, info.value.seq) == ("orders", 1, 5)
            assert "'orders'" in str(info.value) and "partition 1" in str(info.value)
            assert "seq 5" in str(info.value)
        else:
            assert decode_record(raw, "orders", 1, seq).payload.startswith((b"before-", b"after-"))


DAMAGED_PAGE_READ = r"""
import struct, sys
from partq.storage import Store, encode_record
path = sys.argv[1]
store = Store.open(path)
qid = store.write(lambda w: w.allocate_qid())
store.write(lambda w: w.init_partition(qid, 0))
store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"a" * 300)] * 100))
seq = store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"MARKER-5c1e" * 30)]))
store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"b" * 300)] * 100))
store.close()
with open(path + "/data.mdb", "r+b") as f:
    data = bytearray(f.read())
    page = 4096
    at = data.find(b"MARKER-5c1e")
    while at != -1:  # mark each page holding the record as an overflow page (mp_flags at +10)
        struct.pack_into("<H", data, at // page * page + 10, 0x04)
        at = data.find(b"MARKER-5c1e", at + 1)
    f.seek(0)
    f.write(data)
store = Store.open(path)
try:
    with store.read() as r:
        r.records(qid, 0, seq, 1)  # a point lookup: LMDB reports MDB_CORRUPTED
    print("no error")
except Exception as exc:
    print(type(exc).__module__ + "." + type(exc).__name__)
"""


def test_damaged_btree_page_is_reported_as_corrupt_store(tmp_path):
    # In a subprocess: iterating *into* such a page trips an assertion inside LMDB that aborts
    # the whole process, which no Python code can catch.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", DAMAGED_PAGE_READ, str(tmp_path / "d")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "partq.storage.errors.CorruptStore"   # = partq.CorruptStore
