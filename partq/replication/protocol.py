"""What a primary and its standbys say to each other, on top of ``partq.wire``: the options
both sides take, the bounds of every frame, and the checks every received frame passes before
anything acts on it.

A connection starts with the handshake of ``partq.wire`` (role ``"replication"``, after TLS
when configured): the standby proves the shared token and the primary proves it back, so
neither side talks to an impostor. The standby's hello carries ``standby_id``, ``applied_lsn``,
``timeline`` and ``applied_crc`` (what it holds), and ``verifier``, the hash of the secret it
keeps for its slot (``supersede``). Then the primary sends:

    refused {reason}                                   and closes (divergence, no slot left)
    start {timelines, head}                            the primary's history (see ``timeline``)
    wait {}                                            a snapshot is being prepared: no answer
    snapshot {size, lsn, crc_at_lsn} chunk {data}* snapshot_end {crc, proof}
    changes {entries, head, head_time_ns, head_msgs}   the standby answers ack {lsn}
    part {lsn, size, offset, data, ...head fields}     one slice of an entry larger than a
                                                       frame; the last one is answered by an ack
    heartbeat {entries: [], ...head fields}            answered by an ack

A promoted standby telling its old primary it is superseded says instead, in its hello,
``supersedes`` (its timeline history), ``slot_secret`` (the secret whose hash its slot holds),
``applied_lsn`` and ``applied_crc`` (its last commit of the old primary), ``snapshot_lsn`` and
``snapshot_proof`` (the proof that ended its last snapshot), and is answered ``superseded`` or
``refused {reason}`` (``supersede``).

Bounds: a frame the standby reads is at most ``MAX_FRAME`` (8 MiB); change-log entries go in
frames of at most ``BATCH_BYTES``, and an entry larger than ``PART_BYTES`` in parts of that size,
so no commit is too large to replicate. A frame the primary reads (an ack) is at most
``ACK_FRAME``. Anything else ends the connection with a logged reason (``FrameError``).
"""
from __future__ import annotations

import re
import ssl
from dataclasses import dataclass

from partq.errors import FrameError, InvalidConfig
from partq.replication.settings import slot_keep
from partq.wire.handshake import read_token
from partq.wire.listener import Limits

ROLE = "replication"
MAX_FRAME = 8 << 20            # bytes: the largest frame a standby reads from its primary
ACK_FRAME = 4 << 10            # bytes: the largest frame a primary reads from a standby
BATCH_BYTES = 2 << 20          # change-log bytes per changes frame (one entry may pass it)
PART_BYTES = 1 << 20           # an entry larger than this travels in parts of this size
SNAPSHOT_CHUNK = 1 << 20
HEARTBEAT = 0.5                # seconds between heartbeats of an idle link
LINK_TIMEOUT = 60.0            # seconds either side waits for the other's next frame
HANDSHAKE_TIMEOUT = 5.0
MAX_LSN = (1 << 63) - 1
DEFAULT_MAX_SLOTS = 10
SECRET_BYTES = 32              # a standby's slot secret, and its verifier (a SHA-256 hash)
DEFAULT_LIMITS = Limits(max_frame=ACK_FRAME, handshake_timeout=HANDSHAKE_TIMEOUT,
                        idle_timeout=LINK_TIMEOUT, max_connections=16, max_handshakes=16)
_STANDBY_ID = re.compile(r"[0-9A-Za-z_.:-]{1,64}\Z")


@dataclass(frozen=True)
class ReplicationOptions:
    """How one side of replication authenticates and what it keeps.

    ``token``: the shared secret both sides prove (None: protected mode, loopback peers only).
    ``ssl_context``: a server context on the primary, a client context (trusting the primary's
    CA) on a standby. ``max_slot_keep``: bytes of change log the primary keeps for its slowest
    standby before it drops that standby's slot (the standby then starts again from a snapshot);
    None means 1 GiB, and never more than a quarter of ``max_map_size``. ``max_slots``: standbys
    a primary registers at most. ``limits``: the listener's (connections, handshake time).
    """
    token: bytes | None = None
    ssl_context: ssl.SSLContext | None = None
    max_slot_keep: int | None = None
    max_slots: int = DEFAULT_MAX_SLOTS
    limits: Limits = DEFAULT_LIMITS

    def slot_keep(self, max_map_size: int) -> int:
        return slot_keep(self.max_slot_keep, max_map_size)


def replication_options(token: str | bytes | None = None, token_file: str | None = None,
                        ssl_context: ssl.SSLContext | None = None,
                        max_slot_keep: int | None = None,
                        max_slots: int = DEFAULT_MAX_SLOTS,
                        limits: Limits | None = None) -> ReplicationOptions:
    """Check and gather ``Broker.open``'s replication options (typed ``InvalidConfig``)."""
    if ssl_context is not None and not isinstance(ssl_context, ssl.SSLContext):
        raise InvalidConfig(f"replication_ssl must be an ssl.SSLContext, not "
                            f"{type(ssl_context).__name__}")
    if max_slot_keep is not None and (type(max_slot_keep) is not int or max_slot_keep < 1 << 20):
        raise InvalidConfig(f"max_slot_keep must be a number of bytes of at least 1 MiB, not "
                            f"{max_slot_keep!r}")
    if type(max_slots) is not int or max_slots < 1:
        raise InvalidConfig(f"max_slots must be an integer >= 1, not {max_slots!r}")
    return ReplicationOptions(read_token(token, token_file), ssl_context, max_slot_keep, max_slots,
                              limits or DEFAULT_LIMITS)


# ---------------------------------------------------------------------- checking frames
def kind(frame) -> str | None:
    return frame.get("type") if isinstance(frame, dict) else None


def expect(frame, *kinds: str) -> dict:
    if kind(frame) not in kinds:
        raise FrameError(f"unexpected frame {kind(frame)!r} (expected {' or '.join(kinds)})")
    return frame


def lsn_field(frame: dict, name: str, optional: bool = False) -> int | None:
    value = frame.get(name)
    if value is None and optional:
        return None
    if type(value) is not int or not 0 <= value <= MAX_LSN:
        raise FrameError(f"field {name!r} must be an LSN, not {value!r:.40}")
    return value


def int_field(frame: dict, name: str, low: int, high: int) -> int:
    value = frame.get(name)
    if type(value) is not int or not low <= value <= high:
        raise FrameError(f"field {name!r} must be an integer in [{low}, {high}], not {value!r:.40}")
    return value


def bytes_field(frame: dict, name: str) -> bytes:
    value = frame.get(name)
    if not isinstance(value, bytes):
        raise FrameError(f"field {name!r} must be bytes")
    return value


@dataclass(frozen=True)
class StandbyHello:
    standby_id: str
    applied_lsn: int | None
    timeline: str | None
    applied_crc: int | None
    verifier: bytes | None = None      # hash of the standby's slot secret (None: older partq)


def standby_hello(hello: dict) -> StandbyHello:
    """The standby's part of its handshake hello, checked."""
    sid = hello.get("standby_id")
    if not isinstance(sid, str) or not _STANDBY_ID.match(sid):
        raise FrameError("the standby id must be 1-64 letters, digits or '_.:-'")
    timeline = hello.get("timeline")
    if timeline is not None and (not isinstance(timeline, str) or not _STANDBY_ID.match(timeline)):
        raise FrameError("malformed timeline id")
    crc = hello.get("applied_crc")
    if crc is not None and (type(crc) is not int or not 0 <= crc < 1 << 32):
        raise FrameError("malformed applied_crc")
    verifier = hello.get("verifier")
    if verifier is not None and (not isinstance(verifier, bytes) or len(verifier) != SECRET_BYTES):
        raise FrameError("malformed verifier")
    return StandbyHello(sid, lsn_field(hello, "applied_lsn", optional=True), timeline, crc,
                        verifier)


def head_fields(frame: dict) -> tuple[int, int, int]:
    """(head LSN, its commit time in ns, messages appended up to it) of a frame."""
    return (lsn_field(frame, "head") or 0, int_field(frame, "head_time_ns", 0, 1 << 64),
            int_field(frame, "head_msgs", 0, 1 << 64))


def batches(entries: list[bytes]) -> list[bytes]:
    """The leading entries that fit one changes frame (at least one)."""
    out: list[bytes] = []
    size = 0
    for entry in entries:
        if out and size + len(entry) > BATCH_BYTES:
            break
        out.append(entry)
        size += len(entry)
    return out
