"""The one table from LMDB's failures to partq's errors (``partq.storage.lmdb_errors``), each
condition provoked for real on a real environment: the partq error it becomes, LMDB's own
words in its message, and the hint that says what to do next.

What could take the interpreter down (reading a damaged page) runs in a child process, and so
does what needs a user who may not write the store (as root: root without the capabilities
that override file permissions, through ``setpriv``)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading

import lmdb
import pytest
from helpers import run_child

from partq.errors import (
    AccessDenied,
    CorruptStore,
    InvalidConfig,
    NotAPartqStore,
    PartqError,
    StorageFull,
    StoreBusy,
)
from partq.storage import Store
from partq.storage.lmdb_errors import Step, translated
from partq.storage.read_only_store import ReadOnlyStore

DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]


def _raised(step: Step, path, action) -> PartqError:
    """What ``action()`` raises inside ``translated``: a partq error, never an lmdb one."""
    with pytest.raises(PartqError) as info:
        with translated(str(path), step):
            action()
    assert not isinstance(info.value, lmdb.Error)
    return info.value


def test_a_full_map_is_storage_full(tmp_path, opened):
    env = lmdb.open(str(tmp_path / "raw"), map_size=64 << 10)
    try:
        def fill():
            with env.begin(write=True) as txn:
                for i in range(10_000):
                    txn.put(b"%06d" % i, b"." * 200)
        err = _raised(Step.WRITE, tmp_path / "raw", fill)
    finally:
        env.close()
    assert isinstance(err, StorageFull), err
    msg = str(err)
    assert msg.startswith(f"cannot write to {tmp_path / 'raw'}: its map is full")
    assert "MDB_MAP_FULL" in msg and "larger max_map_size, or ack and drain" in msg
    # a Store at its tiny max_map_size says the same in its own words
    store = opened(tmp_path / "store", map_size=64 << 10, max_map_size=64 << 10)
    with pytest.raises(StorageFull, match="max_map_size=65536"):
        store.write(lambda w: [w.put_meta(b"k%d" % i, b"." * 1000) for i in range(1000)])


@pytest.mark.parametrize("opener", [Store.open, ReadOnlyStore.open],
                         ids=["store", "read-only"])
def test_a_file_that_is_not_lmdb_is_a_corrupt_store(tmp_path, opener):
    path = tmp_path / "d"
    path.mkdir(mode=0o700)
    (path / "data.mdb").write_bytes(b"not an lmdb file\n" * 500)
    with pytest.raises(CorruptStore) as info:
        opener(path)
    msg = str(info.value)
    assert msg.startswith(f"cannot open {path}: data.mdb is not a readable LMDB file"), msg
    assert "MDB_INVALID" in msg and msg.endswith("restore it from a DR-standby or backup")


DAMAGED_PAGE = r"""
    import json, struct, sys
    from partq.storage import Store, encode_record
    path = sys.argv[1]
    store = Store.open(path)
    qid = store.write(lambda w: w.allocate_qid())
    store.write(lambda w: w.init_partition(qid, 0))
    marker = b"MARKER-5c1e" * 30
    store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"a" * 300)] * 100))
    seq = store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, marker)]))
    store.write(lambda w: w.append(qid, 0, [encode_record(1, None, None, b"b" * 300)] * 100))
    store.close()
    with open(path + "/data.mdb", "r+b") as f:
        data = bytearray(f.read())
        at = data.find(marker)
        while at != -1:      # mark each page holding the record an overflow page (flags at +10)
            struct.pack_into("<H", data, at // 4096 * 4096 + 10, 0x04)
            at = data.find(marker, at + 1)
        f.seek(0)
        f.write(data)
    store = Store.open(path)
    try:
        with store.read() as r:
            r.records(qid, 0, seq, 1)      # a point lookup: LMDB reports MDB_CORRUPTED
        print(json.dumps(["no error", ""]))
    except Exception as exc:
        print(json.dumps([type(exc).__name__, str(exc)]))
"""


def test_a_damaged_page_is_a_corrupt_store(tmp_path):
    child = run_child(DAMAGED_PAGE, tmp_path / "d", timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    name, msg = json.loads(child.stdout)
    assert name == "CorruptStore", (name, msg)
    assert msg.startswith(f"cannot read {tmp_path / 'd'}: a page of data.mdb is damaged"), msg
    assert "MDB_CORRUPTED" in msg and "run `partq verify`" in msg and "DR-standby" in msg


NOT_PERMITTED = r"""
    import json, sys
    from partq.storage import Store
    from partq.storage.read_only_store import ReadOnlyStore
    out = {}
    for name, opener, path in (("store", Store.open, sys.argv[1]),
                               ("read-only", ReadOnlyStore.open, sys.argv[2])):
        try:
            opener(path).close()
            out[name] = ["opened", ""]
        except Exception as exc:
            out[name] = [type(exc).__name__, str(exc)]
    print(json.dumps(out))
"""


def _run_without_dac(code: str, *args) -> subprocess.CompletedProcess:
    prefix = DROP_DAC if os.geteuid() == 0 else []
    return subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=60)


def _permissions_hold(tmp_path) -> bool:
    """Whether a child started as ``_run_without_dac`` does is refused a read-only file."""
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(0o444)
    try:
        return _run_without_dac(f"open({str(probe)!r}, 'a')").returncode != 0
    except OSError:
        return False


def test_files_this_user_may_not_use_are_access_denied(tmp_path):
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root, and setpriv is not there to drop the right to write")
    if not _permissions_hold(tmp_path):
        pytest.skip("this process cannot be prevented from writing here")
    unwritable, unreadable = tmp_path / "unwritable", tmp_path / "unreadable"
    for path in (unwritable, unreadable):
        Store.open(path).close()
    for name in ("data.mdb", "lock.mdb"):
        (unwritable / name).chmod(stat.S_IRUSR)
    unwritable.chmod(stat.S_IRUSR | stat.S_IXUSR)
    (unreadable / "data.mdb").chmod(0)
    try:
        child = _run_without_dac(NOT_PERMITTED, unwritable, unreadable)
    finally:
        unwritable.chmod(0o700)
        for name in ("data.mdb", "lock.mdb"):
            (unwritable / name).chmod(0o600)
        (unreadable / "data.mdb").chmod(0o600)
    assert child.returncode == 0, child.stderr[-2000:]
    out = json.loads(child.stdout)
    for name, path in (("store", unwritable), ("read-only", unreadable)):
        error, msg = out[name]
        assert error == "AccessDenied", (name, error, msg)
        assert msg.startswith(f"cannot open {path}: this user may not use its files"), msg
        assert "Permission denied" in msg and "(`partq --read-only`" in msg, msg


def test_a_write_in_a_read_only_environment_is_access_denied(tmp_path):
    Store.open(tmp_path / "d").close()
    env = lmdb.open(str(tmp_path / "d"), readonly=True, lock=False)
    try:
        err = _raised(Step.WRITE, tmp_path / "d", lambda: env.begin(write=True))
    finally:
        env.close()
    assert isinstance(err, AccessDenied), err
    assert "run as a user who may write it" in str(err)


def test_every_reader_slot_taken_is_store_busy(tmp_path):
    env = lmdb.open(str(tmp_path / "d"), max_readers=1)
    first = env.begin()              # the one slot, held by this thread
    failures: list[PartqError] = []

    def second_reader():
        try:
            with translated(str(tmp_path / "d"), Step.READ):
                env.begin().abort()
        except PartqError as exc:
            failures.append(exc)
    try:
        reader = threading.Thread(target=second_reader)
        reader.start()
        reader.join()
    finally:
        first.abort()
        env.close()
    assert len(failures) == 1 and isinstance(failures[0], StoreBusy), failures
    assert "MDB_READERS_FULL" in str(failures[0]) and "end some readers" in str(failures[0])


def test_an_environment_open_outside_partq_is_refused_as_already_open(tmp_path):
    path = tmp_path / "d"
    Store.open(path).close()
    env = lmdb.open(str(path))
    try:
        with pytest.raises(InvalidConfig) as info:
            Store.open(path)
    finally:
        env.close()
    msg = str(info.value)
    assert "already open in this process" in msg and msg.endswith("share the Broker or Store")
    Store.open(path).close()          # once LMDB's own is closed, partq opens it


def test_missing_files_are_not_a_partq_store(tmp_path):
    err = _raised(Step.OPEN, tmp_path / "gone",
                  lambda: lmdb.open(str(tmp_path / "gone"), create=False))
    assert isinstance(err, NotAPartqStore), err
    assert "its files are missing" in str(err) and "`partq init`" in str(err)
