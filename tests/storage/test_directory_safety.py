"""A store directory another user could have prepared is refused before anything in it is opened:
owned by another user, writable by group or others, or holding a link where partq keeps its own
files. The case from the review: another user makes a world-writable directory whose
``lock.mdb`` is a link to a file of ours, and we run ``partq --data DIR init``."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

import partq

NOBODY = 65534


def as_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def victim(tmp_path):
    """A file of ours that a prepared link points to: it must come out unchanged."""
    path = tmp_path / "precious"
    path.write_bytes(b"do not touch")
    path.chmod(0o600)
    return path


def prepared_by_other_user(tmp_path, victim):
    trap = tmp_path / "trap"
    trap.mkdir()
    (trap / "lock.mdb").symlink_to(victim)
    trap.chmod(0o777)
    os.chown(trap, NOBODY, NOBODY)
    os.lchown(trap / "lock.mdb", NOBODY, NOBODY)
    return trap


def assert_untouched(victim):
    assert victim.read_bytes() == b"do not touch"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600


@pytest.mark.skipif(not as_root(), reason="making a directory another user owns needs root")
def test_a_directory_another_user_prepared_is_refused_and_nothing_is_written(tmp_path, victim):
    trap = prepared_by_other_user(tmp_path, victim)
    with pytest.raises(partq.UnsafeDirectory, match=r"owned by .*uid 65534.*not by this user"):
        partq.Broker.open(trap)
    assert_untouched(victim)
    proc = subprocess.run([sys.executable, "-m", "partq", "--data", str(trap), "init"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "owned by" in proc.stderr, proc.stderr
    assert_untouched(victim)


def test_a_link_where_partq_keeps_its_files_is_refused(tmp_path, victim):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    (data / "lock.mdb").symlink_to(victim)
    with pytest.raises(partq.UnsafeDirectory, match="symbolic link"):
        partq.Broker.open(data)
    assert_untouched(victim)


def test_a_linked_data_file_of_an_existing_store_is_refused(tmp_path, victim):
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=1)
    real = tmp_path / "elsewhere.mdb"
    (data / "data.mdb").rename(real)
    (data / "data.mdb").symlink_to(real)
    with pytest.raises(partq.UnsafeDirectory, match="data.mdb is a symbolic link"):
        partq.Broker.open(data)


def test_a_store_others_may_write_is_refused_until_it_is_fixed(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=1)
        broker.publish("q", b"kept")
    data.chmod(0o777)
    with pytest.raises(partq.UnsafeDirectory, match=r"mode 0777.*chmod go-w"):
        partq.Broker.open(data)
    data.chmod(0o700)
    with partq.Broker.open(data) as broker:
        assert broker.queue_status("q").depth == 1


def test_a_new_store_in_an_empty_directory_of_ours_is_made_private(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)           # ours and empty: a store is made here, and the mode fixed
    with partq.Broker.open(data):
        pass
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
