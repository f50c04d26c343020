#!/usr/bin/env python3
"""How long a ``partq`` command takes to start and finish, beside the bare Python processes
that do the least the same job needs (issue 42's start-up targets).

Each command runs as a new process, as an operator's shell runs it, with bytecode cached (the
warm-up round writes any missing ``.pyc``). The sides of a group run alternately, one run per
round (bench/method.py: one warm-up round, then ``--pairs`` rounds, 15 by default); a line
gives each side's median in seconds and the median of the rounds' ratios.

* ``partq_version``: ``partq --version`` beside ``python -c "import click"`` (target: at most
  1.5x): the command line must not load what no command asked for.
* ``partq_help``: ``partq --help`` (every command listed with its short help) beside the same.
* ``partq_publish``: ``partq --data DIR publish q hello`` (a durable, fsynced commit) beside a
  Python process that imports lmdb, msgpack, crc32c and click and commits one put to an LMDB
  environment (target: at most 2.0x): a publisher loads no delivery, replication, metrics or
  server.
* ``partq_publish_vs_lean_peer``: the same publish beside that process importing crc32c's C
  extension without the package's ``__init__`` (which looks its own version up through
  ``importlib.metadata``, as partq no longer does): what bounds the publish, without that cost.
* ``import_partq``: ``python -c "import partq"`` beside ``python -c pass``.

Usage: ``python bench/startup.py [--quick] [--pairs N]``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from method import emit, header, interleave, line

import partq

DEFAULT_PAIRS = 15

# the peers: the least a Python process does to do each job
IMPORT_CLICK = "import click"
PEER_PUT = """\
import sys
import click, crc32c, lmdb, msgpack
env = lmdb.open(sys.argv[1], map_size=1 << 24)
with env.begin(write=True) as txn:
    txn.put(b"q", msgpack.packb([crc32c.crc32c(b"hello"), b"hello"]))
env.close()
"""
# crc32c's C extension loaded without running the package's __init__ (its version lookup)
LEAN_CRC = """\
import importlib.machinery, importlib.util
spec = importlib.machinery.PathFinder.find_spec("crc32c")
ext = importlib.machinery.PathFinder.find_spec("crc32c._crc32c", spec.submodule_search_locations)
mod = importlib.util.module_from_spec(ext)
ext.loader.exec_module(mod)
crc = mod.crc32c
"""
LEAN_PEER_PUT = PEER_PUT.replace("import click, crc32c, lmdb, msgpack",
                                 "import click, lmdb, msgpack\n" + LEAN_CRC) \
                        .replace("crc32c.crc32c(", "crc(")


def partq_command() -> list[str]:
    """The ``partq`` console script beside this interpreter, else ``python -m partq.tools``."""
    script = os.path.join(os.path.dirname(sys.executable), "partq")
    if os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "partq.tools"]


def timed(argv: list[str]):
    """A job: run ``argv`` to its end (it must succeed) and return the seconds it took."""
    def run() -> float:
        start = time.perf_counter()
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
        return took
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--pairs", "--rounds", type=int, default=None, dest="pairs",
                        help=f"rounds after the warm-up (default {DEFAULT_PAIRS}, or 2 with "
                             "--quick)")
    args = parser.parse_args(argv)
    pairs = max(1, args.pairs if args.pairs is not None else (2 if args.quick else DEFAULT_PAIRS))
    emit(header("startup", pairs))

    scratch = tempfile.mkdtemp(prefix="partq-startup-")
    try:
        data, raw = os.path.join(scratch, "partq"), os.path.join(scratch, "raw")
        os.mkdir(raw)
        with partq.Broker.open(data) as broker:
            broker.create_queue("q", partitions=4)
        py, cmd = sys.executable, partq_command()
        got = interleave([
            ("python_bare", timed([py, "-c", "pass"])),
            ("python_import_click", timed([py, "-c", IMPORT_CLICK])),
            ("partq_version", timed([*cmd, "--version"])),
            ("partq_help", timed([*cmd, "--help"])),
            ("import_partq", timed([py, "-c", "import partq"])),
            ("python_lmdb_msgpack_crc32c_click_one_put", timed([py, "-c", PEER_PUT, raw])),
            ("python_lean_crc32c_one_put", timed([py, "-c", LEAN_PEER_PUT, raw])),
            ("partq_publish", timed([*cmd, "--data", data, "publish", "q", "hello"])),
        ], pairs, script="startup")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def out(name: str, peer: str | None = None, target: float | None = None,
            value_of: str | None = None, **extra) -> None:
        values = got[value_of or name]
        doc = line(name, "s", values, peer, None if peer is None else got[peer], digits=3,
                   **extra)
        if target is not None:          # a ceiling on the ratio: at most target times the peer
            doc.update(target=target, target_is="ratio_max")
        emit(doc)

    out("python_bare")
    out("python_import_click")
    out("partq_version", "python_import_click", target=1.5)
    out("partq_help", "python_import_click")
    out("import_partq", "python_bare")
    out("python_lmdb_msgpack_crc32c_click_one_put")
    out("python_lean_crc32c_one_put")
    out("partq_publish", "python_lmdb_msgpack_crc32c_click_one_put", target=2.0)
    out("partq_publish_vs_lean_peer", "python_lean_crc32c_one_put", value_of="partq_publish")
    return 0


if __name__ == "__main__":
    sys.exit(main())
