"""The fixtures of dramatiq's own test suite, giving a ``partq.dramatiq.PartqBroker`` where
dramatiq's give a StubBroker or a RedisBroker (copied as ``conftest.py`` beside dramatiq's
test files, which tests/frameworks/test_dramatiq_suite.py fetches from dramatiq's source
distribution at test time). Each test gets a fresh partq directory."""
from __future__ import annotations

import logging

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.rate_limits.backends import StubBackend as StubRateLimiterBackend
from dramatiq.results.backends import RedisBackend, StubBackend

from partq.dramatiq import PartqBroker

logging.basicConfig(level=logging.INFO,
                    format="[%(asctime)s] [%(threadName)s] [%(name)s] [%(levelname)s] %(message)s")


def partq_broker(tmp_path) -> PartqBroker:
    # fail_fast_default: a join raises the error of a message a worker dead-lettered, as the
    # StubBroker's join does (dramatiq's stub tests expect it)
    broker = PartqBroker(tmp_path / "partq", fail_fast_default=True)
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    return broker


@pytest.fixture()
def stub_broker(tmp_path):
    broker = partq_broker(tmp_path)
    yield broker
    broker.emit_before("process_stop")
    broker.close()


@pytest.fixture()
def stub_worker(stub_broker):
    worker = Worker(stub_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture()
def redis_broker(tmp_path):
    broker = partq_broker(tmp_path)
    broker.fail_fast_default = False      # as the RedisBroker's join
    yield broker
    broker.emit_before("process_stop")
    broker.close()


@pytest.fixture()
def redis_worker(redis_broker):
    worker = Worker(redis_broker, worker_timeout=100, worker_threads=32)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture()
def result_backend():
    return StubBackend()


@pytest.fixture()
def redis_result_backend():
    return RedisBackend()       # the test that takes it makes no call to Redis


@pytest.fixture()
def rate_limiter_backend():
    return StubRateLimiterBackend()
