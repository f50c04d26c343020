"""Issue 41, point 3: `partq dr promote` of a standby whose primary needs a token tells the old
primary at once, so that right after it returns the old primary refuses writes; when the old
primary cannot be reached the promotion still succeeds, says so, and `partq dr status` says the
old primary is still to be told. Real processes: a primary holding a token, a `partq standby
--token-file` following it, and the `partq` command line."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from helpers import wait_until
from repl_helpers import free_port, read_json
from sec_helpers import TOKEN
from tools_helpers import PARTQ_SCRIPT


def _partq(*args, data) -> subprocess.CompletedProcess:
    return subprocess.run([PARTQ_SCRIPT, "--data", str(data), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _token_file(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    os.chmod(path, 0o600)
    return str(path)


def _primary_and_standby(tmp_path, procs):
    """A primary with a token (its own process) and a `partq standby --token-file` that caught
    up with it; returns (primary process, its address, standby process, token file)."""
    token_file = _token_file(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    primary = procs.start("primary", "proc_primary_token.py", tmp_path / "primary", address,
                          token_file, tmp_path)
    with open(tmp_path / "standby.out", "wb") as out:
        standby = subprocess.Popen([PARTQ_SCRIPT, "--data", str(tmp_path / "standby"), "standby",
                                    "--primary", address, "--token-file", token_file,
                                    "--interval", "0.2"], stdout=out, stderr=subprocess.STDOUT)

    def caught_up() -> bool:
        st = read_json(tmp_path / "status.json")
        return bool(st and st["published_after_link"] and st["connected"]
                    and st["applied_lsn"] >= st["head_lsn"] > 0)
    try:
        wait_until(caught_up, 60, "the standby to follow the primary", procs=[primary])
    except BaseException:
        standby.kill()
        standby.wait(10)
        raise
    return primary, address, standby, token_file


@pytest.mark.timeout(180)
def test_dr_promote_with_the_token_tells_the_old_primary_at_once(tmp_path, procs):
    primary, address, standby, token_file = _primary_and_standby(tmp_path, procs)
    try:
        promoted = _partq("dr", "promote", "--token-file", token_file, "--json",
                          data=tmp_path / "standby")
        assert promoted.returncode == 0, promoted.stdout + promoted.stderr
        doc = json.loads(promoted.stdout)
        assert doc["promoted"] is True and doc["old_primary"] == address
        assert doc["old_primary_told"] is True, doc
        assert standby.wait(30) == 0               # the standby process was stopped first
        # at once: the old primary, still running, refuses the next write from any process
        refused = _partq("publish", "orders", "after the promotion", data=tmp_path / "primary")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "superseded DR primary" in refused.stderr
        primary.check_alive()
        status = _partq("dr", "status", "--json", data=tmp_path / "standby")
        assert json.loads(status.stdout)["fence_pending"] is None, status.stdout
        took = _partq("publish", "orders", "on the new primary", data=tmp_path / "standby")
        assert took.returncode == 0, took.stderr
    finally:
        if standby.poll() is None:
            standby.kill()
            standby.wait(10)


@pytest.mark.timeout(180)
def test_a_promotion_that_cannot_reach_the_old_primary_says_so_and_can_tell_it_later(
        tmp_path, procs):
    primary, address, standby, token_file = _primary_and_standby(tmp_path, procs)
    try:
        primary.kill()                            # the primary is lost
        promoted = _partq("dr", "promote", "--token-file", token_file, "--fence-timeout", "0.5",
                          "--json", data=tmp_path / "standby")
        assert promoted.returncode == 0, promoted.stdout + promoted.stderr
        doc = json.loads(promoted.stdout)
        assert doc["promoted"] is True and doc["old_primary_told"] is False, doc
        assert doc["old_primary"] == address and doc["old_primary_error"], doc
        assert "Warning: " in promoted.stderr and address in promoted.stderr
        assert standby.wait(30) == 0
        shown = _partq("dr", "status", "--json", data=tmp_path / "standby")
        assert json.loads(shown.stdout)["fence_pending"] == address, shown.stdout
        human = _partq("dr", "status", data=tmp_path / "standby")
        assert f"the old primary {address} has not been told" in human.stdout, human.stdout
        assert "partq dr promote" in human.stdout
        # the old primary comes back, taking writes: promote again tells it
        (tmp_path / "again").mkdir()
        again = procs.start("primary-again", "proc_primary_token.py", tmp_path / "primary",
                            address, token_file, tmp_path / "again")
        wait_until(lambda: read_json(tmp_path / "again" / "status.json"), 60,
                   "the old primary to serve again", procs=[again])
        told = _partq("dr", "promote", "--token-file", token_file, "--fence-timeout", "30",
                      "--json", data=tmp_path / "standby")
        assert told.returncode == 0, told.stdout + told.stderr
        assert json.loads(told.stdout)["old_primary_told"] is True, told.stdout
        refused = _partq("publish", "orders", "late", data=tmp_path / "primary")
        assert refused.returncode == 1 and "superseded DR primary" in refused.stderr, \
            refused.stdout + refused.stderr
        again.check_alive()
    finally:
        if standby.poll() is None:
            standby.kill()
            standby.wait(10)
