"""README's first Python example runs as printed, and runs again on the same directory."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def first_python_block() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "README.md has no python example"
    return match.group(1)


def test_the_readme_example_runs_twice_on_one_directory(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(first_python_block())
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "data" / "data.mdb").exists()
