"""Running a framework's own test suite against partq: its released source distribution is
fetched by pip at test time into a cache (``build/framework-sdists``, never into the repository's
tracked files), unpacked, and pytest runs the chosen test files there with a conftest of ours
(``peer/``) that gives their fixtures partq. The outcome of every test comes back from a JUnit
XML report."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "framework-sdists"
PEER = Path(__file__).resolve().parent / "peer"


def installed_version(dist: str) -> str:
    return metadata.version(dist)


def fetch_sdist(dist: str, version: str) -> Path:
    """The unpacked sdist of ``dist==version`` (downloaded by pip on first use; a lock file keeps
    two test processes from fetching at once)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    root = CACHE / f"{dist}-{version}"
    with open(CACHE / f".{dist}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (root / "PKG-INFO").exists():
            return root
        archive = CACHE / f"{dist}-{version}.tar.gz"
        if not archive.exists():
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
                            "--no-deps", f"{dist}=={version}", "-d", str(CACHE)], check=True,
                           timeout=300)
        shutil.rmtree(root, ignore_errors=True)
        with tarfile.open(archive) as tar:
            tar.extractall(CACHE, filter="data")
        return root


def prepare_run(name: str, files: dict[str, str]) -> Path:
    """A fresh folder ``CACHE/run-<name>`` with ``files`` (target name -> file of ``peer/``)."""
    run = CACHE / f"run-{name}"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    for target, source in files.items():
        shutil.copy(PEER / source, run / target)
    (run / "pytest.ini").write_text("[pytest]\ntimeout = 120\naddopts = -p no:cacheprovider\n"
                                    "python_classes = test_* Test*\n")
    return run


def run_pytest(run: Path, args: list[str], pythonpath: list[Path], timeout: float,
               env: dict | None = None) -> tuple[dict[str, tuple[str, str]], str]:
    """Run pytest in ``run`` on ``args``; every test's ``(outcome, message)`` by its id
    (``file::Class::test``), outcome one of passed, failed, skipped, xfailed, and the output."""
    report = run / "report.xml"
    full_env = {**os.environ, **(env or {}),
                "PYTHONPATH": os.pathsep.join([str(p) for p in pythonpath] + [str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-c", str(run / "pytest.ini"),
                           "--rootdir", str(run), "-q", "-rfEsx", f"--junitxml={report}", *args],
                          cwd=run, env=full_env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if not report.exists():
        raise AssertionError(f"pytest wrote no report (exit {proc.returncode}):\n{output[-6000:]}")
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message", "")
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome, message = ("xfailed" if xfail else "skipped"), child.get("message", "")
        outcomes[test_id] = (outcome, message)
    return outcomes, output


def summary(outcomes: dict[str, tuple[str, str]]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "xfailed": 0}
    for outcome, _ in outcomes.values():
        counts[outcome] += 1
    return counts
