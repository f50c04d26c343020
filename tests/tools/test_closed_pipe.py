"""A reader that stops reading (``partq copy-out Q --to-file - | head``) is a normal end: exit
status 0 and nothing on stderr, for the commands that stream their output."""
from __future__ import annotations

import subprocess

import pytest
from tools_helpers import PARTQ_SCRIPT

import partq


@pytest.mark.parametrize("command", [["copy-out", "q", "--to-file", "-"], ["inspect", "q"]])
def test_a_closed_pipe_ends_the_command_quietly(tmp_path, command):
    data = tmp_path / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2)
        broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(20_000)])
    proc = subprocess.Popen([PARTQ_SCRIPT, "--data", str(data), *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()                       # as `head -1` does
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0, err
    assert err == b""

