"""The distribution a user installs: every package of the library is in the sdist and the wheel,
and a wheel installed into a fresh virtual environment, outside the checkout, runs the README's
first example, ``partq queue list`` and ``python -m partq``.

The build is ``python -m build`` without isolation (setuptools and build come with the test
extra), so the suite needs no package index; it builds the sdist and then the wheel from the
sdist, as pip does when it installs from a source archive. The fresh environment gets the
library's dependencies from the test environment (a path file, read as a plain directory: no
editable finder of the checkout comes with it) and the wheel itself with ``--no-deps``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import partq

REPO = Path(__file__).resolve().parents[1]
# the import name of each top-level folder of the library (pyproject's package-dir)
ROOTS = {"partq": "partq", "storage": "partq.storage", "tools": "partq.tools", "spark": "partq.spark"}


def library_packages() -> set[str]:
    """Every folder of the library with an __init__.py, by its import name."""
    found = set()
    for folder, name in ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *rel)))
    return found


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def only(folder: Path, pattern: str) -> Path:
    matches = list(folder.glob(pattern))
    assert len(matches) == 1, matches
    return matches[0]


def test_every_package_of_the_library_is_in_the_wheel_and_the_sdist(dist):
    expected = library_packages()
    assert {"partq", "partq.delivery", "partq.storage", "partq.tools", "partq.spark"} <= expected

    wheel_files = zipfile.ZipFile(only(dist, "partq-*.whl")).namelist()
    in_wheel = {"/".join(p.split("/")[:-1]).replace("/", ".") for p in wheel_files
                if p.endswith("/__init__.py")}
    assert expected - in_wheel == set(), "packages missing from the wheel"
    assert "partq/py.typed" in wheel_files
    assert "partq/__main__.py" in wheel_files
    assert not any(p.startswith(("tests/", "bench/")) for p in wheel_files)

    with tarfile.open(only(dist, "partq-*.tar.gz")) as sdist:
        names = sdist.getnames()
    top = names[0].split("/")[0]
    in_sdist = set()
    for folder, name in ROOTS.items():
        prefix = f"{top}/{folder}/"
        for path in names:
            if path.startswith(prefix) and path.endswith("/__init__.py"):
                rel = path[len(prefix):].split("/")[:-1]
                in_sdist.add(".".join((name, *rel)))
    assert expected - in_sdist == set(), "packages missing from the sdist"


def test_the_metadata_a_package_index_shows(dist):
    with zipfile.ZipFile(only(dist, "partq-*.whl")) as wheel:
        meta_name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        meta = wheel.read(meta_name).decode()
    assert f"Version: {partq.__version__}" in meta
    assert "License-Expression: MIT" in meta
    assert "Description-Content-Type: text/markdown" in meta
    assert "Requires-Python: >=3.11" in meta
    assert "Classifier: Typing :: Typed" in meta
    # the README the index renders says the same Python versions as the metadata
    readme = (REPO / "README.md").read_text()
    assert re.search(r"Python 3\.11 or newer", readme)


def fresh_venv(where: Path) -> Path:
    """A new venv that sees the test environment's dependencies but not the checkout."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    py = where / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "partq-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py


def test_the_wheel_installed_in_a_fresh_venv_runs_the_readme_and_the_command(dist, tmp_path):
    py = fresh_venv(tmp_path / "venv")
    wheel = only(dist, "partq-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, timeout=300)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc

    where = run(str(py), "-c", "import partq, partq.delivery, partq.scaling; print(partq.__file__)")
    assert where.stdout.strip().startswith(str(tmp_path / "venv")), where.stdout

    readme = (REPO / "README.md").read_text()
    readme = readme[readme.index("## Use it from Python"):]    # (the worker's module is above)
    example = re.search(r"```python\n(.*?)```", readme, re.S)
    assert example
    (work / "example.py").write_text(example.group(1))
    run(str(py), "example.py")

    partq_cmd = str(tmp_path / "venv" / "bin" / "partq")
    listing = run(partq_cmd, "--data", "data", "queue", "list", "--json")
    assert "orders" in listing.stdout
    assert run(partq_cmd, "--version").stdout.strip() == f"partq {partq.__version__}"
    assert run(str(py), "-m", "partq", "--version").stdout.strip() == f"partq {partq.__version__}"
    run(str(py), "-c", "import partq; assert callable(partq.aio.connect)")


def test_the_sdist_carries_the_documents_readme_links_to(dist):
    """README links to docs/*.md: a user who unpacks the sdist finds them (it lacked docs/)."""
    import re
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)", (REPO / "README.md").read_text()))
    assert linked, "README links to no docs/ page"
    with tarfile.open(only(dist, "partq-*.tar.gz")) as sdist:
        names = sdist.getnames()
    top = names[0].split("/")[0]
    assert {f"{top}/{path}" for path in linked} - set(names) == set()
    assert {f"{top}/README.md", f"{top}/LICENSE"} <= set(names)
