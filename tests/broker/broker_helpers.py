"""Helpers shared by the broker tests (on sys.path through pytest's ``pythonpath``)."""
from __future__ import annotations

from functools import partial

import helpers

DELAY = 5.0
HANDOFF = 3.0

# ``helpers.drain`` bounded at 100 receives: a flow that keeps redelivering ends a test quickly
drain = partial(helpers.drain, max_rounds=100)
