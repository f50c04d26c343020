"""Fixtures for the broker tests: real LMDB directories (tmp_path) and a ManualClock."""
from __future__ import annotations

import pytest

import partq


@pytest.fixture
def clock():
    return partq.ManualClock(1000.0)


@pytest.fixture
def broker(tmp_path, clock):
    b = partq.Broker.open(tmp_path / "data", clock=clock)
    yield b
    b.close()


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


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
