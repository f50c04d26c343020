"""Celery's own t/integration/test_tasks.py but its class test_tasks (class-based tasks, apply,
trace logs, task replacement, signals, pool timeouts) on partq: celery_suite.py says how."""
from __future__ import annotations

import pytest

pytest.importorskip("celery", reason="the celery extra (pip install 'partq[celery]') brings Celery")
pytest.importorskip("pydantic", reason="Celery's integration tasks import pydantic (the test extra)")

import celery_suite


def test_celery_other_task_tests_pass_on_partq(tmp_path):
    path = "t/integration/test_tasks.py"
    root = celery_suite.sdist_root()
    names = [n for n in celery_suite.top_level_tests(root / path) if n != "test_tasks"]
    outcomes = celery_suite.run_part("more", [f"{path}::{n}" for n in names], tmp_path)
    assert any("test_trace_log_arguments" in t for t in outcomes)
    assert sum(o == "passed" for o, _ in outcomes.values()) >= 15
