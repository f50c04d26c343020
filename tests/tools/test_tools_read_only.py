"""Reading a store without writing it (``partq.ops.read_only``, over
``partq.storage.read_only_store``): ``inspect``, ``queue list|show``,
``stats`` and ``verify`` for a user who may read the directory but not write it, forced with
``--read-only`` / ``PARTQ_READ_ONLY``, and what a concurrent writer does to such a reader.

The real permission test runs the installed script as a user who cannot write the store: as
root that is root without the capabilities that override file permissions (``setpriv``), so it
runs in CI too; it is skipped only when such a process can still write a read-only file."""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from tools_helpers import invoke, json_lines, ok, user_error

import partq
from partq.ops.read_only import open_read_only, open_store_read_only
from partq.storage import read_only_store

DROP_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
READ_COMMANDS = [["queue", "list"], ["queue", "show", "q"], ["stats"], ["verify"],
                 ["inspect", "q", "--limit", "0"]]


def _fill(data: str) -> None:
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=3, rebalance_delay=0)
        b.create_queue("excl", access_type="exclusive")
        b.publish_many("q", [(b"m%d" % i, f"k{i % 5}", {"i": i} if i % 4 == 0 else None)
                             for i in range(200)])
        b.publish_many("excl", [b"e1", b"e2"])
        flow = b.bind("q", name="svc")
        flow.ack_many(flow.receive(max_messages=50, timeout=1.0))
        flow.unbind()


def _comparable(command: list[str], stdout: str):
    docs = json_lines(stdout)
    if command == ["stats"]:
        for key in ("readers", "max_readers"):     # in lock.mdb, which read-only does not open
            docs[0]["store"].pop(key)
    return docs


def _digest(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.iterdir()) if p.is_file()}


def test_read_only_gives_the_same_answers(data):
    _fill(data)
    for command in READ_COMMANDS:
        usual = ok(invoke("--data", data, *command, "--json"))
        forced = ok(invoke("--data", data, *command, "--json", "--read-only"))
        assert _comparable(command, forced.stdout) == _comparable(command, usual.stdout), command
        assert forced.stderr == usual.stderr == ""          # asked for: no warning
        by_env = ok(invoke("--data", data, *command, "--json", env={"PARTQ_READ_ONLY": "1"}))
        assert _comparable(command, by_env.stdout) == _comparable(command, usual.stdout)
    text = ok(invoke("--data", data, "queue", "show", "excl", "--read-only")).stdout
    assert "exclusive" in text and "partitions 0" in text


def test_read_only_writes_nothing(partq_script, data):
    """Not even lock.mdb: a reader with LMDB's lock writes its reader slot there."""
    _fill(data)
    store = Path(data)
    before = _digest(store)
    for command in READ_COMMANDS:
        proc = subprocess.run([partq_script, "--data", data, *command, "--read-only", "--json"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert _digest(store) == before
    locked = subprocess.run([partq_script, "--data", data, "stats", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert locked.returncode == 0, locked.stderr


def test_writing_commands_refuse_while_read_only_is_asked(data):
    _fill(data)
    for command in (["queue", "create", "x"], ["publish", "q", "x"], ["consume", "q"],
                    ["scale", "q", "-p", "4", "--yes"], ["queue", "delete", "q", "--yes"]):
        user_error(invoke("--data", data, *command, env={"PARTQ_READ_ONLY": "1"}),
                   "$PARTQ_READ_ONLY is set", "this command writes")
    with partq.Broker.open(data) as b:
        assert [c.name for c in b.queues()] == ["excl", "q"] and b.queue_status("q").depth == 150


def test_the_library_refuses_writes(data):
    _fill(data)
    broker = open_read_only(data)
    try:
        assert broker.queue_status("q").depth == 150
        assert [c.name for c in broker.queues()] == ["excl", "q"]
        for write in (lambda: broker.publish("q", b"x"), lambda: broker.bind("q"),
                      lambda: broker.create_queue("new"), lambda: broker.delete_queue("q"),
                      lambda: broker.update_queue("q", ingress_enabled=False),
                      lambda: broker.publish_many("q", [b"x"], checkpoint=("c", 1))):
            with pytest.raises(partq.OpenedReadOnly, match="read-only"):
                write()
        with pytest.raises(partq.OpenedReadOnly):
            broker.store.write(lambda w: None)
    finally:
        broker.close()


def test_the_read_only_broker_keeps_up_with_the_broker(data):
    """ReadOnlyBroker is a Broker built by Broker.__init__ (without a ticking thread): it has
    what a Broker has (the dispatcher aside, whose view its own queue_status replaces)."""
    _fill(data)
    with partq.Broker.open(data) as usual:
        expected = set(vars(usual)) - {"dispatcher"}
    broker = open_read_only(data)
    try:
        assert expected <= set(vars(broker)), expected - set(vars(broker))
        assert broker.replication_status().role == "primary"
    finally:
        broker.close()


def test_a_torn_read_is_made_again(data, monkeypatch):
    """A read that a writer may have torn (two commits since its snapshot began) is made again
    on a fresh snapshot, with the block's earlier reads, which must answer the same."""
    _fill(data)
    store = open_store_read_only(data)
    try:
        verdicts = iter([False, False, True])        # torn twice, then intact
        monkeypatch.setattr(read_only_store.ReadOnlyStore, "unchanged_since",
                            lambda self, txnid: next(verdicts, True))
        with store.read() as r:
            config = r.queue("q")
            assert config is not None and config["name"] == "q"
        monkeypatch.setattr(read_only_store.ReadOnlyStore, "unchanged_since", lambda self, txnid: False)
        with pytest.raises(partq.TornRead, match="run the command again"):
            with store.read() as r:
                r.queues()
        # an earlier answer of the block that differs on the fresh snapshot: cannot be mended
        verdicts = iter([True, False])
        monkeypatch.setattr(read_only_store.ReadOnlyStore, "unchanged_since",
                            lambda self, txnid: next(verdicts, True))
        real = read_only_store.Reader.head
        calls = []

        def head(self, qid, p):
            calls.append(p)
            return real(self, qid, p) + (1 if len(calls) > 2 else 0)   # "a publish" meanwhile
        monkeypatch.setattr(read_only_store.Reader, "head", head)
        with pytest.raises(partq.TornRead):
            with store.read() as r:
                r.head(1, 0)
                r.head(1, 1)
    finally:
        store.close()


def test_a_torn_read_is_one_line_from_the_command(data, monkeypatch):
    _fill(data)
    monkeypatch.setattr(read_only_store, "RETRY_PAUSE", 0.0)
    monkeypatch.setattr(read_only_store.ReadOnlyStore, "unchanged_since", lambda self, txnid: False)
    for command in READ_COMMANDS:
        user_error(invoke("--data", data, *command, "--read-only"), "changed under this read",
                   "run the command again")


def _writer_script(data: str, seconds: float) -> str:
    return f"""
import os, time, partq
with partq.Broker.open({data!r}) as b:
    flow = b.bind("q", name="churn")
    end = time.monotonic() + {seconds}
    i = 0
    while time.monotonic() < end:
        b.publish_many("q", [(os.urandom(300), str(i + j)) for j in range(50)])
        flow.ack_many(flow.receive(max_messages=60, timeout=0.05))
        i += 50
    flow.unbind()
"""


def test_reading_while_another_process_writes(partq_script, data):
    """A writer publishes and acks (freeing pages it then reuses) while read-only readers
    without a reader lock run: each run is a consistent answer or one TornRead line, never a
    crash, a traceback or a record reported corrupt."""
    _fill(data)
    writer = subprocess.Popen([os.path.join(os.path.dirname(partq_script), "python"), "-c",
                               _writer_script(data, 6.0)], stderr=subprocess.PIPE, text=True)
    outcomes = {"ok": 0, "torn": 0}
    try:
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            for command in (["verify", "--json"], ["stats", "--json"],
                            ["inspect", "q", "--json", "--limit", "500"]):
                proc = subprocess.run([partq_script, "--data", data, *command, "--read-only"],
                                      capture_output=True, text=True, timeout=60)
                assert "Traceback" not in proc.stderr, proc.stderr
                if proc.returncode == 0:
                    outcomes["ok"] += 1
                    docs = json_lines(proc.stdout)
                    if command[0] == "verify":
                        assert docs[0]["ok"] is True and docs[0]["corrupt"] == []
                    if command[0] == "inspect":
                        assert not any(d.get("corrupt") for d in docs)
                else:
                    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
                    assert "changed under this read" in proc.stderr, proc.stderr
                    outcomes["torn"] += 1
    finally:
        writer.wait(timeout=60)
    assert writer.returncode == 0, writer.stderr
    assert outcomes["ok"] > 0, outcomes


# ---------------------------------------------------------------------- real permissions
def _cannot_write_as_reader(probe_dir: Path) -> bool:
    """Whether a process started as the test's reader is refused a write to a read-only file."""
    target = probe_dir / "probe"
    target.write_text("x")
    target.chmod(0o444)
    probe_dir.chmod(0o555)
    try:
        cmd = ["python3", "-c", f"open({str(target)!r}, 'a')"]
        proc = subprocess.run((DROP_DAC + cmd) if os.geteuid() == 0 else cmd,
                              capture_output=True, timeout=30)
        return proc.returncode != 0
    except OSError:
        return False
    finally:
        probe_dir.chmod(0o755)


def _make_read_only(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)
    path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)


def _make_writable(path: Path) -> None:
    path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)
    for p in path.rglob("*"):
        p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o200)


def test_a_user_who_may_not_write_the_directory(partq_script, data, tmp_path):
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root, and setpriv is not there to drop the right to write")
    probe = tmp_path / "probe"
    probe.mkdir()
    if not _cannot_write_as_reader(probe):
        pytest.skip("running as root cannot be prevented from writing here")
    _fill(data)
    store = Path(data)
    expected = {" ".join(c): _comparable(c, ok(invoke("--data", data, *c, "--json")).stdout)
                for c in READ_COMMANDS}
    reader = DROP_DAC if os.geteuid() == 0 else []
    _make_read_only(store)
    try:
        before = _digest(store)
        for command in READ_COMMANDS:
            proc = subprocess.run([*reader, partq_script, "--data", data, *command, "--json"],
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
            assert _comparable(command, proc.stdout) == expected[" ".join(command)], command
            # told once, on stderr, what reading without a reader lock means
            assert proc.stderr.startswith("Warning: reading ") and "may not write" in \
                proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
            quiet = subprocess.run([*reader, partq_script, "--data", data, *command,
                                    "--read-only"], capture_output=True, text=True, timeout=60)
            assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
        show = subprocess.run([*reader, partq_script, "--data", data, "queue", "show", "q"],
                              capture_output=True, text=True, timeout=60)
        assert "delivery owner" in show.stdout
        # copy-out to a file only reads the store, so it works too
        export = tmp_path / "export.jsonl"
        copied = subprocess.run([*reader, partq_script, "--data", data, "copy-out", "q",
                                 "--to-file", str(export), "--json"],
                                capture_output=True, text=True, timeout=60)
        assert copied.returncode == 0, copied.stderr
        assert json_lines(copied.stdout)[0]["copied"] == 150
        # writing is refused with one line
        refused = subprocess.run([*reader, partq_script, "--data", data, "queue", "create", "x"],
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("Error: this user may not write") and \
            refused.stderr.count("\n") == 1, refused.stderr
        assert _digest(store) == before
    finally:
        _make_writable(store)
