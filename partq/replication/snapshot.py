"""Snapshots: the copy of a primary's store a new standby (or one whose slot was invalidated)
starts from.

Primary side (``SnapshotSender``): at most one snapshot in flight per listener. A compact copy
is taken from one read transaction (``Store.snapshot``: writers go on) into a private temporary
directory inside the primary's own data directory (mode 0700, removed when sent), then streamed
in chunks with its size up front and its crc32c at the end, beside a random proof whose hash
the standby's slot records first (``slots.note_snapshot``): the standby keeps the proof, so
once promoted it can show its old primary that it read that snapshot whole (``supersede``),
even when the primary never heard its ack. A standby waiting for its turn, or
for the copy, gets ``wait`` frames, so neither side mistakes the pause for a dead link; one that
stops reading loses its connection, and its turn, after ``SEND_TIMEOUT``.

Standby side (``receive_snapshot``): the file is written into a temporary directory inside the
standby's data directory (never the system's), refused before a byte is written when the
announced size passes the standby's ``max_map_size`` or its free disk, and abandoned as soon as
more bytes arrive than announced; then its checksum is checked and ``install_snapshot`` loads
it in one transaction (a crash leaves the previous state).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading

import msgpack

from partq.errors import FrameError
from partq.replication import slots
from partq.replication.protocol import (
    MAX_FRAME,
    SECRET_BYTES,
    SNAPSHOT_CHUNK,
    bytes_field,
    expect,
    int_field,
    lsn_field,
)
from partq.replication.supersede import SNAPSHOT_PROOF, verifier
from partq.storage.checksum import crc32c
from partq.storage.encoding import pack_u64
from partq.wire.frames import recv_frame, send_frame

log = logging.getLogger("partq.replication")

PREFIX = ".snapshot-"
SEND_TIMEOUT = 10.0         # seconds one chunk (1 MiB) may take to leave: at least ~100 KB/s
WAIT_FRAME_EVERY = 1.0      # seconds between ``wait`` frames while a snapshot is prepared


def _temp_dir(store_path: str) -> str:
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=store_path)


def remove_leftovers(store_path: str) -> None:
    """Remove snapshot directories left by processes that died while they made one."""
    try:
        names = os.listdir(store_path)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue                    # its process still runs
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        elif pid.isdigit():
            continue                        # one of this process's own, in use
        shutil.rmtree(os.path.join(store_path, name), ignore_errors=True)


class SnapshotSender:
    """Sends snapshots of ``store``, one at a time."""

    def __init__(self, store, stop: threading.Event) -> None:
        self.store = store
        self._stop = stop
        self._turn = threading.Lock()

    def send(self, sock: socket.socket, standby_id: str) -> int:
        """Send a snapshot to standby ``standby_id``; return the LSN it holds (the standby
        continues after it)."""
        while not self._turn.acquire(timeout=WAIT_FRAME_EVERY):
            if self._stop.is_set():
                raise FrameError("the primary is closing")
            send_frame(sock, {"type": "wait"})
        tmp = None
        try:
            tmp = _temp_dir(self.store.path)
            lsn = self._copy(sock, tmp)
            proof = os.urandom(SECRET_BYTES)
            self.store.write(lambda w: slots.note_snapshot(w, standby_id, lsn, verifier(proof)))
            return self._stream(sock, os.path.join(tmp, "data.mdb"), lsn, proof)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self._turn.release()

    def _copy(self, sock: socket.socket, tmp: str) -> int:
        result: list = []

        def copy() -> None:
            try:
                result.append(self.store.snapshot(tmp))
            except BaseException as exc:     # handed to the link's thread below
                result.append(exc)

        worker = threading.Thread(target=copy, name="partq-snapshot-copy", daemon=True)
        worker.start()
        failed: OSError | None = None
        while True:
            worker.join(WAIT_FRAME_EVERY)
            if not worker.is_alive():
                break
            if failed is None:
                try:
                    send_frame(sock, {"type": "wait"})
                except OSError as exc:       # wait for the copy all the same: it owns tmp
                    failed = exc
        if failed is not None:
            raise failed
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def _stream(self, sock: socket.socket, path: str, lsn: int, proof: bytes) -> int:
        size = os.path.getsize(path)
        with self.store.read() as r:
            entry = r.change(lsn) if lsn else None
        send_frame(sock, {"type": "snapshot", "size": size, "lsn": lsn,
                          "crc_at_lsn": None if entry is None else crc32c(entry)})
        crc = 0
        previous = sock.gettimeout()
        sock.settimeout(SEND_TIMEOUT)    # a standby that stops reading gives up its turn
        with open(path, "rb") as f:
            while chunk := f.read(SNAPSHOT_CHUNK):
                crc = crc32c(chunk, crc)
                send_frame(sock, {"type": "chunk", "data": chunk})
        send_frame(sock, {"type": "snapshot_end", "crc": crc, "proof": proof})
        sock.settimeout(previous)
        log.info("sent a %d-byte snapshot at LSN %d", size, lsn)
        return lsn


def receive_snapshot(sock: socket.socket, header: dict, store) \
        -> tuple[str, int, int | None, bytes | None]:
    """Receive the snapshot ``header`` announced into a new temporary directory of the standby's
    store; return (directory, LSN, crc32c of the change-log entry at that LSN or None, the
    snapshot's proof or None). The caller installs it and removes the directory."""
    size = int_field(header, "size", 1, 1 << 62)
    if size > store.max_map_size:
        raise FrameError(f"the primary's snapshot of {size} bytes passes this standby's "
                         f"max_map_size={store.max_map_size}; open the standby with a larger "
                         f"max_map_size")
    lsn = lsn_field(header, "lsn") or 0
    crc_at = header.get("crc_at_lsn")
    if crc_at is not None:
        crc_at = int_field(header, "crc_at_lsn", 0, (1 << 32) - 1)
    free = shutil.disk_usage(store.path).free
    if size > free:
        raise FrameError(f"the primary's snapshot of {size} bytes does not fit in the {free} "
                         f"bytes free under {store.path}; free space on that disk")
    tmp = _temp_dir(store.path)
    try:
        path = os.path.join(tmp, "data.mdb")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     store.file_mode)
        crc, got = 0, 0
        with os.fdopen(fd, "wb") as f:
            while True:
                frame = expect(recv_frame(sock, MAX_FRAME), "chunk", "snapshot_end")
                if frame["type"] == "snapshot_end":
                    break
                data = bytes_field(frame, "data")
                got += len(data)
                if got > size:
                    raise FrameError(f"the snapshot is longer than the {size} bytes announced")
                crc = crc32c(data, crc)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if got != size or crc != int_field(frame, "crc", 0, (1 << 32) - 1):
            raise FrameError("snapshot failed its checksum")
        proof = frame.get("proof")
        if proof is not None and (not isinstance(proof, bytes) or len(proof) != SECRET_BYTES):
            raise FrameError("malformed snapshot proof")
        return tmp, lsn, crc_at, proof
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def install_snapshot(store, snapshot_dir: str, lsn: int, crc_at: int | None = None,
                     proof: bytes | None = None) -> None:
    """Load a received snapshot. It is copied into the live store in one transaction (readers
    never see a closed or half-loaded store, and a crash leaves the previous state), together
    with this standby's own meta keys (its id and slot secret stay its own); the snapshot
    brings the primary's timeline history."""
    with store.read() as r:
        standby_id, followed = r.meta(b"standby_id"), r.meta(b"followed")
        secret = r.meta(b"supersede_secret")
    store.install_snapshot(snapshot_dir, {
        b"slots": None, b"slots_invalidated": None, b"role": b"standby",
        b"applied_lsn": pack_u64(lsn), b"standby_id": standby_id, b"followed": followed,
        b"applied_crc": None if crc_at is None else pack_u64(crc_at),
        b"superseded": None, b"fence_primary": None, b"fence_error": None,
        b"supersede_secret": secret,
        SNAPSHOT_PROOF: None if proof is None else msgpack.packb([lsn, proof])})


@contextlib.contextmanager
def received(sock: socket.socket, header: dict, store):
    """``receive_snapshot`` as a context: yields (directory, LSN, crc, proof) and removes it
    after."""
    tmp, lsn, crc_at, proof = receive_snapshot(sock, header, store)
    try:
        yield tmp, lsn, crc_at, proof
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
