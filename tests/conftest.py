"""Fixtures every test folder shares: a broker on a fresh LMDB directory (tmp_path) driven by a
ManualClock, so timers run only when a test advances the clock and calls ``tick()``. A folder's
own conftest may build on them (``tests/broker``) or replace them (``tests/tools``)."""
from __future__ import annotations

import pytest

import partq


@pytest.fixture
def clock():
    return partq.ManualClock(1000.0)


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def broker(data_dir, clock):
    b = partq.Broker.open(data_dir, clock=clock)
    yield b
    b.close()


@pytest.fixture
def open_broker(data_dir, clock):
    """``open_broker()`` opens (or reopens) the test directory with the shared ManualClock; every
    broker opened this way is closed at teardown."""
    opened: list[partq.Broker] = []

    def _open(**kw) -> partq.Broker:
        kw.setdefault("clock", clock)
        b = partq.Broker.open(data_dir, **kw)
        opened.append(b)
        return b
    yield _open
    for b in opened:
        b.close()
