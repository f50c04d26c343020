"""Fixtures of the store tests: ``durability`` runs a test once per durability mode, ``opened``
opens Stores and closes them at teardown."""
from __future__ import annotations

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
