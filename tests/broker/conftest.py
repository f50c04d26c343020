"""Fixtures for the broker tests (``clock``, ``broker``, ``open_broker`` and ``data_dir`` come
from tests/conftest.py).

One suite, many configurations: the broker tests run with both unkeyed partitioners. A test that publishes to
a partitioned queue and checks what is delivered takes ``partitioner`` and creates its queue with
``partitioner=partitioner``, so it runs once per partitioner: its assertions must hold wherever
unkeyed messages go. Tests about something else (two processes or brokers sharing a directory,
an idle flow's CPU, refused binds, exclusive queues) do not take it, nor would a test of one
partitioner on purpose (those live in tests/core/test_partitioners.py, beside the pure
rebalancer's tests).
"""
from __future__ import annotations

import pytest

UNKEYED_PARTITIONERS = ("random", "sticky")


@pytest.fixture(params=UNKEYED_PARTITIONERS)
def partitioner(request) -> str:
    return request.param
