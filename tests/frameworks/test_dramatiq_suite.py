"""dramatiq's own tests on partq: the test files of dramatiq's released source distribution
(fetched by pip at test time into build/peer-suites/, never kept in this repository), run with
fixtures of ours (tests/frameworks/dramatiq_peer/) that give a ``partq.dramatiq.PartqBroker``
where dramatiq's give its StubBroker (``stub_broker``, ``stub_worker``) or its RedisBroker
(``redis_broker``, ``redis_worker``). Every test must pass but those listed below, each with
why; docs/dramatiq.md gives the same list."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("dramatiq")
from peer_suite import fetch_tests, run_files

HERE = Path(__file__).resolve().parent / "dramatiq_peer"

FILES = ["test_actors.py", "test_broker.py", "test_callbacks.py", "test_composition.py",
         "test_generic_actors.py", "test_worker.py", "test_messages.py", "test_results.py",
         "test_stub_broker.py", "test_redis.py"]

STUB_QUEUE = "reads or writes the StubBroker's in-memory queue.Queue objects (stub_broker.queues[name])"
REDIS = "reads Redis's own keys or Lua commands (client, do_enqueue, do_fetch, do_ack, do_nack)"

# Tests that fail on partq for a reason that is not a missing feature of partq: they look at
# the insides of the broker they were written for.
KNOWN_FAILURES = {
    "test_actors.py::test_actors_can_be_sent_messages": STUB_QUEUE,
    "test_actors.py::test_worker_handles_non_numeric_eta_and_logs_warning": STUB_QUEUE,
    "test_actors.py::test_worker_handles_none_eta": STUB_QUEUE,
    "test_stub_broker.py::test_stub_broker_can_be_flushed": STUB_QUEUE,
    "test_stub_broker.py::test_stub_broker_respects_prefetch": STUB_QUEUE,
    "test_redis.py::test_redis_unacked_messages_can_be_requeued": REDIS,
    "test_redis.py::test_redis_messages_can_be_dead_lettered": REDIS,
    "test_redis.py::test_redis_messages_belonging_to_missing_actors_are_rejected": REDIS,
    "test_redis.py::test_redis_requeues_unhandled_messages_on_shutdown": REDIS,
    "test_redis.py::test_redis_requeues_unhandled_delay_messages_on_shutdown": REDIS,
    "test_redis.py::test_redis_consumer_ack_can_retry_on_connection_error": REDIS,
    "test_redis.py::test_redis_consumer_nack_can_retry_on_connection_error": REDIS,
}

# Tests that may pass or fail: they assume delivery within microseconds of a send.
TIMING = {
    "test_worker.py::test_workers_process_messages_in_order":
        "counts the worker's in-memory queue right after the sends, a timing only an in-memory "
        "broker meets (the order it checks holds)",
}

# Tests not run (deselected), with why.
NOT_RUN = {
    "test_redis.py::test_redis_join_race_condition":
        "its actor calls Redis's Lua command do_qsize; it would wait out 20 retries",
    "test_redis.py::test_redis_dead_lettered_messages_are_cleaned_up":
        "Redis's dead-letter expiry (maintenance Lua); partq keeps dead messages in NAME.XQ "
        "until an operator removes them",
    "test_redis.py::test_redis_broker_can_connect_via_url": "makes a RedisBroker: needs a Redis server",
    "test_redis.py::test_redis_broker_can_connect_via_client": "makes a RedisBroker: needs a Redis server",
}


@pytest.mark.timeout(600)
def test_dramatiqs_own_tests_pass_on_partq():
    tests = fetch_tests("dramatiq")
    deselect = [arg for test_id in NOT_RUN for arg in ("--deselect", f"tests/{test_id}")]
    results, output = run_files(tests, FILES, {"conftest.py": HERE / "conftest_peer.py",
                                               "common.py": HERE / "common_peer.py"},
                                timeout=540, extra_args=deselect)
    tally = Counter(outcome for outcome, _ in results.values())
    print(f"dramatiq's own tests on partq: {tally['passed']} passed, {tally['failed']} failed, "
          f"{tally['error']} errors, {tally['skipped']} skipped, {len(NOT_RUN)} not run")
    for test_id, (outcome, message) in sorted(results.items()):
        if outcome != "passed":
            why = KNOWN_FAILURES.get(test_id) or TIMING.get(test_id) or message
            print(f"  {outcome}: {test_id}: {why}")
    assert len(results) > 100, output[-3000:]
    unexpected = {t: m for t, (o, m) in results.items()
                  if o in ("failed", "error") and t not in KNOWN_FAILURES and t not in TIMING}
    assert not unexpected, f"{unexpected}\n{output[-5000:]}"
    stale = [t for t in KNOWN_FAILURES if results.get(t, ("missing",))[0] != "failed"]
    assert not stale, f"listed as failing but did not fail (update the list and the docs): {stale}"
    skipped = {t: m for t, (o, m) in results.items() if o == "skipped"}
    assert not skipped, skipped
