"""The crash tests import their helpers (``checker``, ``harness``, ``wlog``) by name, and the
worker scripts run from this directory: put it on sys.path whatever pytest's import mode."""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
