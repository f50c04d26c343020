"""conftest for kombu's own integration mixins (t/integration/common.py) on partq: every test
gets a kombu connection on a fresh partq directory (the transport's defaults, nothing tuned)."""
from __future__ import annotations

import kombu
import pytest

import partq.kombu  # noqa: F401  (registers the transport "partq")


@pytest.fixture()
def connection(tmp_path):
    return kombu.Connection(f"partq://{tmp_path / 'broker'}")


@pytest.fixture()
def invalid_connection():
    # nothing listens there: a partq serve that cannot be reached
    return kombu.Connection("partq://127.0.0.1:1")
