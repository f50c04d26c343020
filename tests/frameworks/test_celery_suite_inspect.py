"""Celery's own t/integration/test_inspect.py (remote control: ping, stats, active, scheduled,
revoked, hello, conf, ...) on partq: celery_suite.py says how."""
from __future__ import annotations

import pytest

pytest.importorskip("celery", reason="the celery extra (pip install 'partq[celery]') brings Celery")
pytest.importorskip("pydantic", reason="Celery's integration tasks import pydantic (the test extra)")

import celery_suite


def test_celery_inspect_tests_pass_on_partq(tmp_path):
    outcomes = celery_suite.run_part("inspect", ["t/integration/test_inspect.py"], tmp_path)
    assert all(o == "passed" for o, _ in outcomes.values()), outcomes
    assert len(outcomes) >= 13
