"""Running Celery's own integration tests (t/integration/test_tasks.py and test_inspect.py of
the installed Celery's released sdist, fetched by pip at test time) on partq, in parts: each
part is one pytest run with its own session worker, so the parts are separate test files that
the project's suite runs side by side. Celery's conftest runs them with its embedded session
worker (prefork pool), TEST_BROKER on a partq directory and a result backend that needs no
server (``file://``). Our plugin (peer/celery_plugin.py) registers the transport and skips the
tests in KNOWN with why; Celery's own skips (a Redis result backend, tests Celery marks broken)
stay skipped. Every other test must pass."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import peer_suites

# test id -> why it cannot pass on partq (docs/celery.md says the same)
KNOWN = {
    "test_tasks.py::test_tasks::test_expired":
        "a task's `expires` is also its message's TTL (Celery sets `expiration`); partq drops an "
        "expired message as RabbitMQ does, so no worker sees it and its result never turns "
        "REVOKED: result.get() waits for ever (Redis ignores message TTLs)",
    "test_tasks.py::test_tasks::test_revoked_by_headers_complex_canvas":
        "its own 20 s timeout is shorter than its canvases take on the session worker's one "
        "pool process (22 canvases with about 26 s of 2 s tasks per monitoring id): it times "
        "out on Redis alike, after its first 21 subtests pass, as they do on partq",
}


def sdist_root() -> Path:
    """The unpacked sdist of the installed Celery (fetched on first use)."""
    return peer_suites.fetch_sdist("celery", peer_suites.installed_version("celery"))


def top_level_tests(path: Path) -> list[str]:
    """The names of the test classes and functions defined at the top of test file ``path``."""
    tree = ast.parse(path.read_text())
    return [node.name for node in tree.body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name.startswith("test")]


def run_part(name: str, targets: list[str], tmp_path: Path) -> dict[str, tuple[str, str]]:
    """Run Celery's tests ``targets`` (node ids under the sdist's root, as
    ``t/integration/test_tasks.py::test_tasks``) on a fresh partq directory; print and check
    the outcomes (none failed, the KNOWN ones among them skipped); return them."""
    version = peer_suites.installed_version("celery")
    root = sdist_root()
    run = peer_suites.prepare_run(f"celery-{name}", {"celery_plugin.py": "celery_plugin.py"})
    (tmp_path / "results").mkdir()
    env = {"TEST_BROKER": f"partq://{tmp_path / 'broker'}",
           "TEST_BACKEND": f"file://{tmp_path / 'results'}",
           "PARTQ_CELERY_KNOWN": json.dumps(KNOWN),
           # test_trace_log_arguments reads the worker's INFO records: Celery's session worker
           # logs at ERROR unless told (its pool processes' records reach the test process
           # through a queue that needs tblib for tracebacks: the test extra brings it)
           "WORKER_LOGLEVEL": "INFO"}
    outcomes, output = peer_suites.run_pytest(
        run, ["-p", "celery_plugin", "-p", "celery.contrib.pytest", "--rootdir", str(root),
              *[str(root / t) for t in targets]], [run, root], timeout=600, env=env)
    counts = peer_suites.summary(outcomes)
    print(f"celery {version} integration tests ({name}) on partq: {counts}")
    for test_id, (outcome, why) in sorted(outcomes.items()):
        if outcome != "passed":
            print(f"  {outcome}: {test_id}: {why}")
    failed = {t: o for t, o in outcomes.items() if o[0] == "failed"}
    assert not failed, f"{failed}\n{output[-8000:]}"
    skipped = {t for t, o in outcomes.items() if o[0] == "skipped"}
    for test_id in KNOWN:
        file_name, *inner = test_id.split("::")
        if any(t.startswith(file_name) or t.replace(".", "/").endswith(t) for t in targets) \
                and any(("::".join(inner)).replace("::", ".") in t.replace("::", ".")
                        for t in outcomes):
            assert any(t.endswith(inner[-1]) for t in skipped), test_id
    return outcomes
