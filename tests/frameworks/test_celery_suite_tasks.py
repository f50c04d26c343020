"""Celery's own t/integration/test_tasks.py, its class test_tasks (the longest part: retries
with countdowns, ETAs, time limits, revokes), on partq: celery_suite.py says how."""
from __future__ import annotations

import pytest

pytest.importorskip("celery", reason="the celery extra (pip install 'partq[celery]') brings Celery")
pytest.importorskip("pydantic", reason="Celery's integration tasks import pydantic (the test extra)")

import celery_suite


def test_celery_test_tasks_class_passes_on_partq(tmp_path):
    outcomes = celery_suite.run_part("tasks", ["t/integration/test_tasks.py::test_tasks"],
                                     tmp_path)
    assert any(t.endswith("::test_expired") for t in outcomes)
    assert sum(o == "passed" for o, _ in outcomes.values()) >= 25
