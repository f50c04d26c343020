"""Random SIGKILLs of real publisher, consumer and scaler processes sharing one directory (rule
`crash-recovery`).

Quick form (default): a few hundred kills in about a minute. Long form: ``PARTQ_CRASH_LONG=1``
(thousands of kills; ``PARTQ_CRASH_ROUNDS`` and ``PARTQ_CRASH_ROUND_SECONDS`` resize it); it
prints its figures as one JSON line. ``PARTQ_CRASH_SEED`` fixes the seed (printed on failure);
the seed fixes the schedule (which process dies when, crash points, workers' choices), not the
exact interleaving.

Both forms make every other round a lifecycle round (``harness``: max_redelivery, a dead message
queue, a quota, TTLs, nacks and rejects, checked by ``lifecycle_checks``);
``PARTQ_CRASH_LIFECYCLE=N`` makes it every N-th round (1: all, 0: none). Half the rounds, drawn
from the seed, are key rounds (the queue has ``ordering="key"``, checked by ``key_checks``;
figure ``key_rounds``); ``PARTQ_CRASH_KEY_SHARE`` changes the share (1: all, 0: none).
"""
from __future__ import annotations

import json
import os
import random

import pytest
from harness import RoundFailed, run_rounds

LONG = os.environ.get("PARTQ_CRASH_LONG") == "1"
LIFECYCLE_EVERY = int(os.environ.get("PARTQ_CRASH_LIFECYCLE", "2"))
KEY_SHARE = float(os.environ.get("PARTQ_CRASH_KEY_SHARE", "0.5"))


def _seed() -> int:
    raw = os.environ.get("PARTQ_CRASH_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(1 << 31)


def _run(tmp_path, rounds: int, seconds: float):
    seed = _seed()
    failure = None
    try:
        fig = run_rounds(os.fspath(tmp_path), seed, rounds, seconds,
                         lifecycle_every=LIFECYCLE_EVERY, key_share=KEY_SHARE)
    except RoundFailed as exc:
        failure = str(exc)
    if failure:
        pytest.fail(failure, pytrace=False)
    out = {"name": "crash_random_kills", "seed": seed, **fig.as_dict()}
    print("\n" + json.dumps(out, sort_keys=True))
    return fig


def test_random_kills_quick(tmp_path):
    fig = _run(tmp_path, rounds=6, seconds=5.5)
    # rounds are timed, so the count follows the machine's speed: 150-200 alone on two CPUs,
    # 149 beside another test worker; fewer than 100 means the harness stopped killing
    assert fig.killed >= 100, fig.as_dict()
    assert fig.published > 0 and fig.acked > 0
    if LIFECYCLE_EVERY and LIFECYCLE_EVERY <= 6:
        assert fig.lifecycle_rounds and sum(fig.dead.values()) > 0, fig.as_dict()


@pytest.mark.skipif(not LONG, reason="long form: set PARTQ_CRASH_LONG=1")
@pytest.mark.timeout(4 * 3600)
def test_random_kills_long(tmp_path):
    rounds = int(os.environ.get("PARTQ_CRASH_ROUNDS", "60"))
    seconds = float(os.environ.get("PARTQ_CRASH_ROUND_SECONDS", "10"))
    fig = _run(tmp_path, rounds=rounds, seconds=seconds)
    assert fig.killed >= 1000 or rounds < 60, fig.as_dict()
