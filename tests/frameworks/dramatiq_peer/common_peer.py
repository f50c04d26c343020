"""The helpers dramatiq's test files import from their ``tests/common.py`` (copied there as
``common.py`` by tests/frameworks/test_dramatiq_suite.py): a worker context manager and the
skip marks."""
from __future__ import annotations

import os
import platform
from contextlib import contextmanager

import pytest
from dramatiq import Worker

RABBITMQ_USERNAME = os.getenv("RABBITMQ_USERNAME", "guest")
RABBITMQ_PASSWORD = os.getenv("RABBITMQ_PASSWORD", "guest")


def _credentials():
    import pika
    return pika.credentials.PlainCredentials(RABBITMQ_USERNAME, RABBITMQ_PASSWORD)


RABBITMQ_CREDENTIALS = _credentials()

skip_in_ci = pytest.mark.skipif(os.getenv("CI") == "true", reason="the test is skipped in CI")
skip_on_windows = pytest.mark.skipif(platform.system() == "Windows", reason="not on Windows")
skip_on_pypy = pytest.mark.skipif(platform.python_implementation() == "PyPy", reason="not on PyPy")


@contextmanager
def worker(*args, **kwargs):
    w = Worker(*args, **kwargs)
    try:
        w.start()
        yield w
    finally:
        w.stop()
