from __future__ import annotations

import pytest
from worker_procs import kill_left


@pytest.fixture(autouse=True)
def _no_worker_left_running():
    """A test that failed half way leaves no ``partq worker`` process behind."""
    yield
    kill_left()
