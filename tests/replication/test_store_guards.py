"""Issue 16, points 8 to 10, with real processes: a writer stopped (SIGSTOP) inside a commit
holds up no open and no read-only command; the files partq creates have the owner's modes
whatever the umask, and lock files are never followed through a planted link; bad settings are
typed errors of one line."""
from __future__ import annotations

import json
import math
import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading

import pytest
from helpers import wait_until

import partq

PY = sys.executable
PARTQ = os.path.join(os.path.dirname(sys.executable), "partq")

STOPPED_WRITER = """
    import os, signal, sys, partq
    b = partq.Broker.open(sys.argv[1])
    def op(w):
        w.put_meta(b"written-while-stopped", b"1")
        print("inside", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)          # stopped holding LMDB's write lock
    b.store.write(op)
    b.close()
    print("done", flush=True)
"""

READER = """
    import json, sys, partq
    with partq.Broker.open(sys.argv[1]) as b:
        print(json.dumps(b.queue_status("orders").depth))
"""


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.timeout(120)
def test_a_writer_stopped_inside_a_commit_holds_up_no_reader(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("orders", partitions=3)
        b.publish_many("orders", [b"a", b"b", b"c"])
    writer = subprocess.Popen([PY, "-c", textwrap.dedent(STOPPED_WRITER), str(data)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "inside"
        wait_until(lambda: open(f"/proc/{writer.pid}/stat").read().split()[2] == "T", 10,
                   "the writer to be stopped")
        listed = subprocess.run([PARTQ, "--data", str(data), "queue", "list", "--json"],
                                capture_output=True, text=True, timeout=30)
        assert listed.returncode == 0, listed.stderr
        assert "orders" in listed.stdout
        read = subprocess.run([PY, "-c", textwrap.dedent(READER), str(data)],
                              capture_output=True, text=True, timeout=30)
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout) == 3
        stats = subprocess.run([PARTQ, "--data", str(data), "stats", "--json"],
                               capture_output=True, text=True, timeout=30)
        assert json.loads(stats.stdout)["store"]["writer_stopped_pid"] == writer.pid
        text = subprocess.run([PARTQ, "--data", str(data), "stats"], capture_output=True,
                              text=True, timeout=30).stdout
        assert f"pid {writer.pid} is stopped while it holds the store's write lock" in text
    finally:
        writer.send_signal(signal.SIGCONT)
        out, _ = writer.communicate(timeout=30)
    assert writer.returncode == 0 and "done" in out
    with partq.Broker.open(data) as b, b.store.read() as r:
        assert r.meta(b"written-while-stopped") == b"1"


@pytest.mark.timeout(120)
def test_a_process_opened_during_a_stopped_commit_writes_once_it_resumes(tmp_path):
    """Opened while another process is stopped inside a commit, a broker reads at once, and its
    writes (one made from inside a read, as an ack is) wait for that commit, then go through:
    no deadlock, no lost write, and its reads are never held up meanwhile."""
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("orders", partitions=3)
        b.publish_many("orders", [b"a", b"b", b"c"])
    writer = subprocess.Popen([PY, "-c", textwrap.dedent(STOPPED_WRITER), str(data)],
                              stdout=subprocess.PIPE, text=True)
    b = None
    try:
        assert writer.stdout.readline().strip() == "inside"
        wait_until(lambda: open(f"/proc/{writer.pid}/stat").read().split()[2] == "T", 10,
                   "the writer to be stopped")
        b = partq.Broker.open(data)
        assert b.open_report["write_lock_holder"] == writer.pid
        results: list = []

        def publish():
            results.append(b.publish("orders", b"late", key="k"))

        def write_from_a_read():
            with b.store.read() as r:
                seen = r.meta(b"format")
                b.store.write(lambda w: w.put_meta(b"from-a-read", seen))
            results.append("from-a-read")

        threads = [threading.Thread(target=fn) for fn in (publish, write_from_a_read)]
        for t in threads:
            t.start()
        for _ in range(20):                       # reads answer while the writes wait
            assert b.queue_status("orders").depth == 3
        assert all(t.is_alive() for t in threads) and not results
    finally:
        writer.send_signal(signal.SIGCONT)
        out, _ = writer.communicate(timeout=30)
    try:
        for t in threads:
            t.join(30)
        assert len(results) == 2 and not any(t.is_alive() for t in threads)
        assert b.queue_status("orders").depth == 4
        flow = b.bind("orders", name="c")
        got = flow.receive(10, timeout=5)
        flow.ack_many(got)
        assert b.queue_status("orders").depth == 4 - len(got)
    finally:
        b.close()
    with partq.Broker.open(data) as again, again.store.read() as r:
        assert r.meta(b"written-while-stopped") == b"1" and r.meta(b"from-a-read") is not None


MAKE_FILES = """
    import os, sys
    os.umask(int(sys.argv[2], 8))
    import partq
    from partq.delivery.lock import OwnerLock
    b = partq.Broker.open(sys.argv[1])
    b.create_queue("q")
    flow = b.bind("q")                   # the queue's delivery lock
    lock = OwnerLock(os.path.join(sys.argv[1], "standby.lock"))
    lock.release()
    b.close()
"""


@pytest.mark.parametrize("umask", ["000", "022", "077"])
@pytest.mark.parametrize("file_mode", [None, "0640"])
def test_file_modes_whatever_the_umask(tmp_path, umask, file_mode):
    data = tmp_path / "data"
    env = dict(os.environ)
    env.pop("PARTQ_FILE_MODE", None)
    if file_mode is not None:
        env["PARTQ_FILE_MODE"] = file_mode
    done = subprocess.run([PY, "-c", textwrap.dedent(MAKE_FILES), str(data), umask],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    files = 0o640 if file_mode else 0o600
    directory = 0o750 if file_mode else 0o700
    assert _mode(data) == directory
    assert _mode(data / "data.mdb") == files
    assert _mode(data / "lock.mdb") == files
    assert _mode(data / "delivery-locks") == 0o700
    assert _mode(data / "standby.lock") == 0o600
    for name in os.listdir(data / "delivery-locks"):
        if name.endswith(".lock"):
            assert _mode(data / "delivery-locks" / name) == 0o600, name


def test_a_planted_link_is_never_followed_by_the_standby_lock(tmp_path):
    data = tmp_path / "standby"
    data.mkdir()
    target = tmp_path / "precious"
    target.write_text("keep me")
    os.symlink(target, data / "standby.lock")
    run = subprocess.run([PARTQ, "--data", str(data), "standby", "--primary", "127.0.0.1:1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "symbolic link" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert target.read_text() == "keep me"


def test_bad_replication_settings_are_typed_errors(tmp_path):
    for bad in (math.nan, -5, 0, "10", True, None, math.inf):
        with pytest.raises(partq.InvalidConfig, match="sync_timeout"):
            partq.Broker.open(tmp_path / "x", replication_listen="127.0.0.1:0",
                              replication_mode="sync", sync_timeout=bad)
    assert not (tmp_path / "x").exists(), "a refused open must not create the directory"
    with pytest.raises(partq.InvalidConfig, match="replication_mode"):
        partq.Broker.open(tmp_path / "x", replication_listen="127.0.0.1:0",
                          replication_mode="semi")
    with pytest.raises(partq.InvalidConfig, match="at least 16 bytes"):
        partq.Broker.open(tmp_path / "x", standby_of="127.0.0.1:1", replication_token="short")
    with pytest.raises(partq.InvalidConfig, match="max_slot_keep"):
        partq.Broker.open(tmp_path / "x", max_slot_keep=-1)
    with pytest.raises(partq.InvalidConfig, match="SSLContext"):
        partq.Broker.open(tmp_path / "x", replication_ssl="cert.pem")
    with pytest.raises(partq.InvalidConfig, match="file_mode"):
        partq.storage.Store.open(tmp_path / "x", file_mode=0o755)


def test_a_second_open_with_other_settings_says_which(tmp_path):
    with partq.Broker.open(tmp_path / "d", max_map_size=1 << 30):
        with pytest.raises(partq.InvalidConfig, match=r"max_map_size=1073741824, not 2147483648"):
            partq.Broker.open(tmp_path / "d", max_map_size=2 << 30)
        with pytest.raises(partq.InvalidConfig, match="durability"):
            partq.Broker.open(tmp_path / "d", max_map_size=1 << 30, durability="async")
        with partq.Broker.open(tmp_path / "d", max_map_size=1 << 30) as same:
            assert same.queues() == []
