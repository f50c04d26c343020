"""Helpers shared by the ``partq`` tool tests (imported by name: conftest.py puts tests/tools on
sys.path, since pytest's importlib import mode does not)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner, Result

from partq.tools.cli import cli

PARTQ_SCRIPT = os.path.join(os.path.dirname(sys.executable), "partq")


def script_works() -> bool:
    if not os.path.exists(PARTQ_SCRIPT):
        return False
    try:
        return subprocess.run([PARTQ_SCRIPT, "--version"], capture_output=True,
                              timeout=60).returncode == 0
    except OSError:
        return False


def invoke(*args, input: str | None = None, env: dict | None = None) -> Result:
    """Run ``partq ARGS`` in this process (no ``--data``: pass it in ARGS)."""
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, env=env)


def describe(result: Result) -> str:
    exc = result.exception
    tb = ""
    if exc is not None and not isinstance(exc, SystemExit):
        import traceback
        tb = "".join(traceback.format_exception(*result.exc_info))
    return (f"exit {result.exit_code}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
            f"\n{tb}")


def ok(result: Result) -> Result:
    assert result.exit_code == 0 and (result.exception is None or
                                      isinstance(result.exception, SystemExit)), describe(result)
    return result


def one_line_error(result: Result, status: int, *fragments: str) -> str:
    """Exit ``status``, exactly one line on stderr, "Error: ...", no traceback, containing
    every fragment; returns that line."""
    assert result.exit_code == status, describe(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), describe(result)
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], describe(result)
    return lines[0]


def user_error(result: Result, *fragments: str) -> str:
    """Exit 1, exactly one line on stderr, "Error: ...", no traceback; returns that line."""
    assert isinstance(result.exception, SystemExit), describe(result)
    return one_line_error(result, 1, *fragments)


def option_error(result: Result, *fragments: str) -> str:
    """A value an option refuses on its own: exit 2 (a usage error), exactly one line on
    stderr, "Error: ...", naming the option; returns that line."""
    return one_line_error(result, 2, *fragments)


def usage_error(result: Result) -> None:
    assert result.exit_code == 2, describe(result)
    assert "Traceback" not in result.output


def json_lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_script(script: str, data: str, *args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([script, "--data", data, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def script_user_error(proc: subprocess.CompletedProcess, *fragments: str, status: int = 1) -> str:
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], proc.stderr
    return lines[0]
