"""README's examples run as printed: the worker on its first screen (its module and commands),
and the first example of "Use it from Python", which runs again on the same directory."""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def first_python_block(after: str = "## Use it from Python") -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index(after):], re.S)
    assert match, "README.md has no python example"
    return match.group(1)


def test_the_readme_worker_runs_as_printed(tmp_path):
    """The module and the three commands of README's first screen: the worker prints the
    message, and SIGTERM ends it with exit status 0."""
    text = (REPO / "README.md").read_text()
    module = re.search(r"```python\n# tasks.py\n(.*?)```", text, re.S)
    commands = re.search(r"```\n(partq --data data/ init.*?)```", text, re.S)
    assert module and commands, "README.md's first screen lost the worker"
    (tmp_path / "tasks.py").write_text(module.group(1))
    lines = [c.split("#")[0].split() for c in commands.group(1).strip().splitlines()]
    partq_cmd = [sys.executable, "-m", "partq"]
    for args in lines[:-1]:
        subprocess.run([*partq_cmd, *shlex.split(" ".join(args[1:]))], cwd=tmp_path,
                       check=True, capture_output=True, timeout=60)
    worker = subprocess.Popen([*partq_cmd, *lines[-1][1:]], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert worker.stdout is not None
    assert worker.stdout.readline() == "customer-42 b'{\"id\": 1}'\n"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0


def test_the_readme_example_runs_twice_on_one_directory(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(first_python_block())
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "data" / "data.mdb").exists()
