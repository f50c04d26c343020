"""Fixtures of the ``partq`` tool tests: a store, an in-process runner (click's CliRunner), and the
installed console script for tests that need real, separate processes."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# pytest's importlib import mode does not put test folders on sys.path; the helpers are imported
# by name
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools_helpers import PARTQ_SCRIPT, invoke, ok, script_works

import partq


@pytest.fixture(scope="session")
def partq_script() -> str:
    """The installed ``partq`` console script (tests that need it skip until it is installed)."""
    if not script_works():
        pytest.skip("the partq console script is not installed yet: register partq.tools in "
                    "pyproject.toml and reinstall (pip install -e .)")
    return PARTQ_SCRIPT


@pytest.fixture
def data(tmp_path) -> str:
    """A fresh, initialised store directory."""
    path = str(tmp_path / "data")
    ok(invoke("--data", path, "init"))
    return path


@pytest.fixture
def run(data):
    """``run(*args)``: ``partq --data DATA ARGS`` in this process."""
    def _run(*args, input: str | None = None):
        return invoke("--data", data, *args, input=input)
    return _run


@pytest.fixture
def broker(data):
    """A Broker on the same store, in this process (it binds nothing unless a test does)."""
    b = partq.Broker.open(data)
    yield b
    b.close()
