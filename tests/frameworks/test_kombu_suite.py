"""kombu's own integration mixins (t/integration/common.py of the installed kombu's released
sdist, fetched by pip at test time) pass on partq: BasicFunctionality, BaseExchangeTypes,
BaseTimeToLive, BasePriority and BaseMessage, unchanged, with a connection on a partq directory
(peer/kombu_conftest.py). No test is skipped or expected to fail."""
from __future__ import annotations

import pytest

pytest.importorskip("kombu", reason="the celery extra (pip install 'partq[celery]') brings kombu")

import peer_suites

# test id -> why it may not pass on partq (docs/celery.md says the same); none today
KNOWN: dict[str, str] = {}
MIXINS = ("BasicFunctionality", "BaseExchangeTypes", "BaseTimeToLive", "Priority", "BaseMessage")


def test_kombu_integration_mixins_pass_on_partq():
    version = peer_suites.installed_version("kombu")
    root = peer_suites.fetch_sdist("kombu", version)
    run = peer_suites.prepare_run("kombu", {"conftest.py": "kombu_conftest.py",
                                            "test_partq_kombu.py": "kombu_mixins.py"})
    outcomes, output = peer_suites.run_pytest(run, ["test_partq_kombu.py"], [root], timeout=240)
    counts = peer_suites.summary(outcomes)
    print(f"kombu {version} integration mixins on partq: {counts}")
    unexpected = {t: o for t, o in outcomes.items() if o[0] != "passed" and t not in KNOWN}
    assert not unexpected, f"{unexpected}\n{output[-6000:]}"
    for mixin in MIXINS:      # every mixin ran
        assert any(mixin in t for t in outcomes), (mixin, sorted(outcomes))
    assert counts["passed"] >= 29
