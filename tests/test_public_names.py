"""``import partq`` is cheap and its names are the public ones: every name of ``__all__`` loads
on first use, and ``dir(partq)`` shows them, not the helpers of that loading (issue 42)."""
from __future__ import annotations

import subprocess
import sys

import partq


def test_dir_shows_the_public_names_only():
    names = dir(partq)
    assert set(partq.__all__) <= set(names)
    for helper in ("TYPE_CHECKING", "annotations", "importlib", "logging", "_LAZY"):
        assert helper not in names
    assert [n for n in names if not n.startswith("__")] == sorted(partq.__all__)


def test_every_public_name_loads():
    code = ("import partq\n"
            "missing = [n for n in partq.__all__ if getattr(partq, n, None) is None]\n"
            "assert not missing, missing\n"
            "assert issubclass(partq.QueueFull, partq.PartqError)\n"
            "assert partq.Broker.__module__ == 'partq.broker'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_an_unknown_name_is_an_attribute_error():
    try:
        partq.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("partq.NoSuchThing did not raise AttributeError")
