"""Fixtures of the store tests: ``durability`` runs a test once per durability mode, ``opened``
opens Stores and closes them at teardown, ``small_disk`` mounts a real small tmpfs."""
from __future__ import annotations

import subprocess

import pytest

from partq.storage import Store


@pytest.fixture(params=["sync", "async"])
def durability(request):
    return request.param


@pytest.fixture
def opened():
    """``opened(path, **kw)`` opens a Store and closes it at teardown if the test did not."""
    stores = []

    def open_(path, **kw):
        store = Store.open(path, **kw)
        stores.append(store)
        return store
    yield open_
    for store in reversed(stores):
        store.close()


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs mounted for the test and unmounted after it (the test skips where this
    process may not mount: it needs root, or a user namespace)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "tmpfs",
                           str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
