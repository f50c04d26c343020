"""Another user must not reach the processes of a directory through its delivery-locks folder or
its files (rules `peer-flows` and `owner-takeover`): a ``delivery-locks`` folder others may write to,
or a ``data.mdb`` another user owns, is refused when the directory is opened, with what to fix;
and no process talks over a control socket whose other end runs as another user (SO_PEERCRED),
neither a consumer that connects to the socket a delivery owner serves, nor the owner to a
process that connects to it. The case from the review: a group member planted a lock and a
socket in a group-writable ``delivery-locks``, and a bind of the directory's owner connected to
it (and said hello) before failing with ``DeliveryLocked`` 5 s later.

Real chmod and chown; the other user is uid 65534 (nobody), taken with a real setuid, so those
tests need root."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from helpers import wait_until

import partq
from partq.delivery.lock import LOCK_DIR
from partq.delivery.peers.owner_channel import socket_path

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="acting as another user (chown, setuid) needs root")

# Another user's process: holds the queue's delivery lock and serves its control socket (made
# while the folder was writable by others; the lock file its own or, when it could only read
# ours, ours), and logs how many bytes each connection to it sent. It runs as root only until
# the files are made.
PLANTED = """
    import fcntl, json, os, socket, sys
    folder, qid, log_path, lock_too = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    log = open(log_path, "a")
    os.chdir(folder)
    fd = os.open(f"{qid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since now".encode())
    if lock_too == "yes":
        os.fchown(fd, NOBODY, NOBODY)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(f"{qid}.sock")
    os.chown(f"{qid}.sock", NOBODY, NOBODY)
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    server.listen(8)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        conn.settimeout(30)
        got = 0
        try:
            while chunk := conn.recv(65536):
                got += len(chunk)
        except OSError:
            pass
        conn.close()
        log.write(json.dumps({"bytes": got}) + "\\n")
        log.flush()
""".replace("NOBODY", str(NOBODY))

# Another user's process (uid 65534; allowed through the folder's modes so that only the
# owner's own check stands in its way) that connects to the owner's socket and says hello.
INTRUDER = """
    import json, os, socket, sys
    from partq.wire.frames import recv_frame, send_frame
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    os.chdir(os.path.dirname(sys.argv[1]))
    sock.connect(os.path.basename(sys.argv[1]))
    try:
        send_frame(sock, {"op": "hello", "v": 1, "pid": os.getpid(), "host": "intruder"})
        print(json.dumps({"uid": os.getuid(), "answer": recv_frame(sock)}))
    except Exception as exc:
        print(json.dumps({"uid": os.getuid(), "error": type(exc).__name__}))
"""


def make_store(data: str, **options) -> int:
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, rebalance_delay=0.0, **options)
        broker.bind("q").unbind()               # makes the delivery-locks folder
        return broker.queue_config("q").qid


def test_a_delivery_locks_folder_others_may_write_is_refused_until_fixed(tmp_path):
    data = str(tmp_path / "data")
    make_store(data)
    folder = os.path.join(data, LOCK_DIR)
    os.chmod(folder, os.stat(folder).st_mode | stat.S_IWGRP)          # chmod g+w
    with pytest.raises(partq.UnsafeDirectory, match=r"delivery-locks may be written by other "
                                                    r"users \(mode 0720\).*chmod 700"):
        partq.Broker.open(data)
    os.chmod(folder, 0o700)
    with partq.Broker.open(data) as broker:
        assert broker.bind("q").partitions == frozenset({0, 1})


@needs_root
def test_a_data_file_another_user_owns_is_refused_until_given_back(tmp_path):
    data = str(tmp_path / "data")
    make_store(data)
    data_file = os.path.join(data, "data.mdb")
    os.chown(data_file, NOBODY, NOBODY)
    with pytest.raises(partq.UnsafeDirectory, match=r"data.mdb is owned by .*uid 65534.*chown"):
        partq.Broker.open(data)
    os.chown(data_file, os.geteuid(), os.getegid())
    with partq.Broker.open(data) as broker:
        assert broker.queue_status("q").partition_count == 2


class Planted:
    """A ``PLANTED`` process for queue id ``qid`` of ``data``."""

    def __init__(self, data: str, qid: int, tmp_path, lock_too: bool) -> None:
        self.log = tmp_path / "planted.jsonl"
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PLANTED),
                                      os.path.join(data, LOCK_DIR), str(qid), str(self.log),
                                      "yes" if lock_too else "no"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"

    def connections(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@needs_root
def test_a_socket_another_user_serves_is_never_talked_to(tmp_path):
    data = str(tmp_path / "data")
    qid = make_store(data, consumer_timeout=600.0)    # the planted lock's lease holds
    planted = Planted(data, qid, tmp_path, lock_too=False)
    try:
        with partq.Broker.open(data) as broker:
            status = broker.queue_status("q")
            assert any(f"{socket_path(data, qid)} belongs to uid {NOBODY}" in w
                       for w in status.warnings), status.warnings
            with pytest.raises(partq.UnsafeDirectory, match=f"served by a process of uid {NOBODY}"):
                broker.bind("q", name="mine")
        seen = wait_until(lambda: len(planted.connections()) >= 2 and planted.connections(),
                          timeout=30, what="the planted socket saw both connections end")
        assert seen == [{"bytes": 0}, {"bytes": 0}], seen
    finally:
        planted.stop()


@needs_root
def test_a_lock_file_another_user_owns_is_refused(tmp_path):
    data = str(tmp_path / "data")
    qid = make_store(data, consumer_timeout=600.0)
    planted = Planted(data, qid, tmp_path, lock_too=True)
    try:
        with partq.Broker.open(data) as broker:
            with pytest.raises(partq.UnsafeDirectory,
                               match=rf"lock file .*{qid}.lock belongs to uid {NOBODY}"):
                broker.bind("q", name="mine")
        assert planted.connections() == []          # its socket was not even tried
    finally:
        planted.stop()


@needs_root
def test_the_owner_refuses_a_peer_of_another_user(tmp_path):
    data = str(tmp_path / "data")
    make_store(data)
    with partq.Broker.open(data) as broker:
        flow = broker.bind("q", name="owner")         # this process runs delivery
        path = socket_path(data, broker.queue_config("q").qid)
        intruder = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "--inh-caps=+dac_override", "--ambient-caps=+dac_override",   # past the modes
             sys.executable, "-c", textwrap.dedent(INTRUDER), path],
            capture_output=True, text=True, timeout=60)
        assert intruder.returncode == 0, intruder.stderr
        seen = json.loads(intruder.stdout)
        assert seen["uid"] == NOBODY and "answer" not in seen, seen     # closed, unanswered
        assert [f.name for f in broker.queue_status("q").flows if f.bound] == ["owner"]
        flow.unbind()
