"""Helpers every test folder shares (on sys.path through pytest's ``pythonpath``): waiting on a
condition, draining a flow, running code in a child interpreter, and checking a benchmark's JSON
lines. Tests synchronise on conditions, never on sleeps."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from decimal import Decimal

BENCH_KEYS = frozenset({"name", "unit", "value"})
BENCH_PEER_KEYS = frozenset({"peer", "peer_value", "ratio"})


def bench_env(repo, scratch, path: str | None = None) -> dict:
    """The environment a benchmark script runs in under the suite: the repository importable,
    its scratch directories under ``scratch`` (where the test can check it removed them), and
    ``path`` as PATH when given (a PATH without a peer's server)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
    env["TMPDIR"] = str(scratch)
    if path is not None:
        env["PATH"] = path
    return env


def wait_until(cond, timeout: float, what: str, interval: float = 0.02, procs=()):
    """Poll ``cond()`` until it returns something truthy and return that; fail naming ``what``
    after ``timeout`` seconds. Fails early, with its output, when one of ``procs`` (objects with
    ``check_alive()`` and ``name``/``tail()``) died."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        for p in procs:
            p.check_alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" +
                                 "".join(f"\n--- {p.name}:\n{p.tail()}" for p in procs))
        time.sleep(interval)


def drain(flow, ack: bool = True, batch: int = 1000, timeout: float = 0.0,
          max_rounds: int = 10_000, at_least: int = 0) -> list:
    """Receive (and ack, unless ``ack=False``) until a receive waiting ``timeout`` seconds
    returns nothing, at most ``max_rounds`` receives; return everything received, in order.
    Until ``at_least`` messages came, an empty receive does not end it (it waits again)."""
    out: list = []
    for _ in range(max_rounds):
        msgs = flow.receive(batch, timeout=timeout)
        if not msgs and len(out) >= at_least:
            break
        out += msgs
        if ack and msgs:
            flow.ack_many(msgs)
    return out


def run_child(code: str, *args, env: dict | None = None, timeout: float = 60,
              stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a fresh interpreter with ``args`` as its argv, without the
    PARTQ_CRASH_AT of this process, and return the finished process (output as text)."""
    full_env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=full_env, input=stdin)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _half_unit(x) -> float:
    """Half a unit in the last digit of ``x`` as JSON prints it (the shortest repr): the most
    that rounding to the printed digits can have changed it. 12.3 -> 0.05, 7 -> 0.5."""
    return 0.5 * 10.0 ** Decimal(repr(x)).as_tuple().exponent


def _check_ratio(obj: dict, ratio_from: str, text: str) -> None:
    value, peer_value, ratio = obj["value"], obj["peer_value"], obj["ratio"]
    if "ratio_min" in obj and ratio is not None:
        # bench/method.py: the median of interleaved pairs' ratios, within their min and max;
        # with one pair it is that pair's ratio, i.e. value / peer_value unrounded
        assert isinstance(obj.get("pairs"), int) and obj["pairs"] >= 1, text
        low, high = obj["ratio_min"], obj["ratio_max"]
        assert _number(low) and _number(high) and low <= ratio <= high, text
        if obj["pairs"] > 1:
            return
        ratio_from = "measured"
    if ratio_from == "printed":
        # the bench divided the figures it printed and rounded the ratio to 3 decimals
        if peer_value == 0:
            assert ratio is None, text
            return
        assert _number(ratio), text
        assert abs(ratio - value / peer_value) <= 1e-3, f"ratio is not value / peer_value: {text}"
        return
    assert ratio_from == "measured", ratio_from
    # the bench divided the unrounded figures: each printed figure (and the ratio) may be off
    # by half a unit in its last printed digit
    if ratio is None:      # no ratio: only when the measured peer figure was 0
        assert peer_value == 0, f"no ratio beside a peer figure: {text}"
        return
    assert _number(ratio), text
    hv, hp = _half_unit(value), _half_unit(peer_value)
    hr = _half_unit(ratio) + 1e-9 * abs(ratio)
    low = (value - hv) / (peer_value + hp)
    high = (value + hv) / (peer_value - hp) if peer_value > hp else math.inf
    assert low - hr <= ratio <= high + hr, f"ratio is not value / peer_value: {text}"


def check_bench_lines(lines, expected_names=None, *, keys=BENCH_KEYS, only_keys: bool = False,
                      positive: bool = True, skips: bool = False, peers_in_run: bool = True,
                      ratio_from: str = "printed") -> dict[str, dict]:
    """Check a benchmark's output, one JSON object per line, and return the lines by name.

    Every line has a non-empty ``name`` (printed once) and ``unit``, and ``value``, a finite
    number (> 0 when ``positive``, else >= 0); it has at least ``keys`` (exactly those when
    ``only_keys``). A line with a ``peer`` has ``peer_value`` and ``ratio``: when the peer is a
    line printed earlier, ``peer_value`` is that line's value (and it must be one unless
    ``peers_in_run=False``); ``ratio`` is ``value / peer_value``: within 1e-3 when the bench
    divides the figures it prints (``ratio_from="printed"``; no ratio for a peer value of 0),
    within the rounding of the printed figures when it divides unrounded ones
    (``ratio_from="measured"``). A line without a peer has no ``peer_value`` or ``ratio`` but
    None.

    With ``skips``, a line may say why it has no figure: ``skipped`` (a reason) with ``value``
    and ``ratio`` None; a line whose peer was skipped has ``peer_value`` and ``ratio`` None and
    repeats the peer's reason as ``peer_skipped``. ``expected_names``: the exact set of names.
    """
    lines = list(lines)
    assert lines, "the bench printed nothing"
    seen: dict[str, dict] = {}
    for text in lines:
        obj = json.loads(text)
        assert isinstance(obj, dict), text
        assert keys <= set(obj), f"missing {sorted(keys - set(obj))}: {text}"
        if only_keys:
            assert set(obj) == set(keys), f"unexpected {sorted(set(obj) - set(keys))}: {text}"
        name, unit = obj["name"], obj["unit"]
        assert isinstance(name, str) and name, text
        assert isinstance(unit, str) and unit, text
        assert name not in seen, f"{name} printed twice"
        skipped = obj.get("skipped")
        if skipped is not None:                  # not measured here: a reason, never a number
            assert skips, f"a skipped line where every figure is measured: {text}"
            assert isinstance(skipped, str) and skipped.strip(), text
            assert obj["value"] is None and obj.get("ratio") is None, text
        else:
            value = obj["value"]
            assert _number(value) and (value > 0 if positive else value >= 0), text
        peer = obj.get("peer")
        if peer is not None:
            assert isinstance(peer, str) and peer, text
            assert BENCH_PEER_KEYS <= set(obj), text
            peer_value = obj["peer_value"]
            if peer in seen:
                assert peer_value == seen[peer]["value"], f"{text}, but {peer} printed {seen[peer]}"
            else:
                assert not peers_in_run, f"{peer} is not an earlier result of this run: {text}"
            if peer_value is None:               # the peer was skipped: say so, no ratio
                assert skips and obj["ratio"] is None, text
                assert isinstance(obj.get("peer_skipped"), str) and obj["peer_skipped"], text
                if peer in seen:
                    assert obj["peer_skipped"] == seen[peer]["skipped"], text
            else:
                assert _number(peer_value), text
                assert peer_value > 0 if positive else peer_value >= 0, text
                assert "peer_skipped" not in obj, text
                if skipped is not None:
                    assert obj["ratio"] is None, text
                else:
                    _check_ratio(obj, ratio_from, text)
                    assert obj["ratio"] is None or obj["ratio"] > 0 or not positive, text
        else:
            assert obj.get("peer_value") is None and obj.get("ratio") is None, text
            assert "peer_skipped" not in obj, text
        seen[name] = obj
    if expected_names is not None:
        expected = set(expected_names)
        assert set(seen) == expected, (f"missing {sorted(expected - set(seen))}, "
                                       f"unexpected {sorted(set(seen) - expected)}")
    return seen
