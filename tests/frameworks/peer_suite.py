"""Running a framework's own test files against partq: fetch its released source distribution
with pip (into a cache under build/, never into the repository), unpack its tests, lay our
conftest beside them, run pytest on the chosen files in a subprocess and read the outcome of
every test from its JUnit XML."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "peer-suites"


def fetch_tests(package: str) -> Path:
    """The ``tests/`` folder of ``package``'s sdist, of the version installed here: downloaded
    by pip once into the cache and unpacked (its tests only: the package itself is the one
    installed)."""
    ver = version(package)
    root = CACHE / f"{package}-{ver}"
    tests = root / "tests"
    if (root / ".unpacked").exists():
        return tests
    sdists = CACHE / "sdist"
    sdists.mkdir(parents=True, exist_ok=True)
    found = list(sdists.glob(f"{package}-{ver}.tar.gz"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        "--quiet", f"{package}=={ver}", "-d", str(sdists)], check=True)
        found = list(sdists.glob(f"{package}-{ver}.tar.gz"))
    shutil.rmtree(root, ignore_errors=True)
    prefix = f"{package}-{ver}/tests/"
    with tarfile.open(found[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        for m in members:
            m.name = m.name[len(f"{package}-{ver}/"):]
        tar.extractall(root, members=members, filter="data")
    (root / ".unpacked").touch()
    return tests


def run_files(tests: Path, files: list[str], ours: dict[str, Path], timeout: float,
              env: dict | None = None, extra_args: tuple[str, ...] | list[str] = (),
              ) -> tuple[dict[str, tuple[str, str]], str]:
    """Run pytest on ``files`` of ``tests`` with ``ours`` (name in tests/ -> our file) laid
    beside them; return ``{test id: (outcome, message)}`` (outcome passed, failed, error or
    skipped; the id is ``file::test``) and pytest's output."""
    for name, src in ours.items():
        shutil.copyfile(src, tests / name)
    (tests / "__init__.py").touch()
    report = tests / "junit.xml"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "-o", "testpaths=", "--timeout", "60", "--rootdir", str(tests.parent),
           "-c", os.devnull, f"--junitxml={report}", *extra_args, *[f"tests/{f}" for f in files]]
    full_env = {**os.environ, **(env or {})}
    full_env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run(cmd, cwd=tests.parent, capture_output=True, text=True, timeout=timeout,
                          env=full_env)
    output = proc.stdout + proc.stderr
    if not report.exists():
        raise AssertionError(f"pytest wrote no report:\n{output[-5000:]}")
    return outcomes(report), output


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        test_id = f"{module}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "")[:300]
                break
        if test_id in out and out[test_id][0] != "passed":
            continue            # an error in teardown after a failure: keep the failure
        out[test_id] = (outcome, message)
    return out
