"""The method every ratio of the benchmarks follows (issue 18), in one place.

* Interleaved pairs: the sides of a comparison run slice after slice, A, B, A, B, ... (or A, B,
  C, A, B, C, ... for a group of more than two), ``pairs`` rounds (7 by default) after one
  unreported warm-up round in which every side runs once. Both sides see the same disk and the
  same neighbours while their speed drifts.
* Each ratio is the ratio of one round's two slices; a line reports the median of those ratios
  with their min and max (``ratio``, ``ratio_min``, ``ratio_max``, ``pairs``), and beside it
  the median of each side (``value``, ``peer_value``). The median ratio is therefore not
  exactly ``value / peer_value``: it is the better figure of the two when the disk drifts.
* The first line of a script, ``load_average_at_start``, carries the load average (1, 5 and 15
  minutes), the CPU count and the date: a ratio means little without knowing what else ran.

(A script's own folder is on ``sys.path``: ``from method import ...``.)
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from statistics import median

DEFAULT_PAIRS = 7


class Skip(Exception):
    """A side that cannot run here; its message is the reason reported."""


def emit(doc: dict) -> dict:
    print(json.dumps(doc), flush=True)
    return doc


def log(script: str, msg: str) -> None:
    print(f"[{script}] {msg}", file=sys.stderr, flush=True)


def header(script: str, pairs: int | None = None, **extra) -> dict:
    """The first line of a script's output: the machine and what shared it at the start."""
    load = os.getloadavg()
    doc = {"name": "load_average_at_start", "unit": "runnable processes",
           "value": round(load[0], 2), "cpus": os.cpu_count(),
           "loadavg": [round(x, 2) for x in load], "script": script,
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if pairs is not None:
        doc["pairs"] = pairs
    return {**doc, **extra}


def interleave(jobs: Sequence[tuple[str, Callable[[], float]]], pairs: int = DEFAULT_PAIRS,
               warm: bool = True, script: str = "bench") -> dict[str, list[float] | str]:
    """Run every job once per round, in the order given, ``pairs`` rounds after one warm-up
    round (``warm``) whose results are dropped. Returns ``{name: [one figure per round]}``, or
    ``{name: reason}`` for a job that raised ``Skip`` (its message) or failed (the error): it is
    not run again, and the others go on."""
    samples: dict[str, list[float]] = {name: [] for name, _ in jobs}
    failed: dict[str, str] = {}
    for r in range(-1 if warm else 0, pairs):
        for name, fn in jobs:
            if name in failed:
                continue
            try:
                value = fn()
            except Skip as exc:
                failed[name] = str(exc)
                continue
            except Exception as exc:  # a peer's failure is a result to report
                failed[name] = f"failed: {type(exc).__name__}: {exc}"
                log(script, f"{name} failed in round {r + 1}: {exc!r}")
                continue
            if r >= 0:
                samples[name].append(value)
        if r >= 0:
            log(script, f"round {r + 1}/{pairs}: " + ", ".join(
                f"{n}={samples[n][-1]:.0f}" for n, _ in jobs if n not in failed and samples[n]))
    return {name: failed.get(name) or samples[name] for name, _ in jobs}


def ratios(values: Sequence[float], peers: Sequence[float]) -> list[float]:
    """The ratio of each pair (round), skipping pairs whose peer figure is 0."""
    return [v / p for v, p in zip(values, peers, strict=True) if p]


def _rounded(x: float, digits: int) -> float | int:
    """``x`` to ``digits`` decimals; an int at 0, so that JSON shows what was rounded away
    (18362 is within 0.5 of the figure; 18362.0 would claim 0.05)."""
    return round(x, digits) if digits else round(x)


def line(name: str, unit: str, values: Sequence[float] | str, peer: str | None = None,
         peer_values: Sequence[float] | str | None = None, *, target: float | None = None,
         digits: int = 1, note: str | None = None, **extra) -> dict:
    """One result line from per-round figures. ``values`` (or ``peer_values``) given as a str is
    the reason that side was not measured: the line says ``skipped`` (or ``peer_skipped``) and
    carries no figure for it, never a made-up one."""
    doc: dict = {"name": name, "unit": unit}
    if isinstance(values, str):
        doc.update(value=None, skipped=values)
    else:
        doc["value"] = _rounded(median(values), digits)
    if peer is not None:
        doc.update(peer=peer, peer_value=None, ratio=None)
        if isinstance(peer_values, str):
            doc["peer_skipped"] = peer_values
        elif peer_values is not None:
            doc["peer_value"] = _rounded(median(peer_values), digits)
            if not isinstance(values, str):
                rs = ratios(values, peer_values)
                if rs:
                    doc.update(ratio=round(median(rs), 3), ratio_min=round(min(rs), 3),
                               ratio_max=round(max(rs), 3), pairs=len(rs))
    if target is not None:
        doc["target"] = target
    if note:
        doc["note"] = note
    doc.update(extra)
    return doc


def pairs_line(name: str, unit: str, peer: str, values: list[float], peers: list[float],
               target: float | None = None) -> dict:
    """``line`` with the rounding bench/remote.py has always used (3 digits)."""
    return line(name, unit, values, peer, peers, target=target, digits=3)
