"""Fixtures for the replication tests: started processes are SIGKILLed at teardown, whatever
happened, so no primary or standby outlives its test."""
from __future__ import annotations

import pytest
from repl_helpers import Proc  # tests/replication is on sys.path: pyproject.toml's pythonpath


class Procs:
    def __init__(self, workdir) -> None:
        self.workdir = workdir
        self.started: list[Proc] = []

    def start(self, name: str, script: str, *args) -> Proc:
        proc = Proc(self.workdir, name, script, *args)
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            proc.kill()


@pytest.fixture
def procs(tmp_path):
    p = Procs(tmp_path)
    yield p
    p.kill_all()
