"""Byte layouts of everything partq stores: log keys, records, partition state.

Log key: ``>IIQ`` = queue id (u32), partition (u32), sequence (u64), all big-endian so that LMDB's
byte order is log order and one partition's records are one contiguous key range.

The log stores *chunks*: the records one append placed in one partition, up to
``CHUNK_RECORDS`` of them, under the key of the chunk's **last** sequence::

    chunk value = msgpack [first_seq: int, record, record, ...]     (records as bin)

Keyed by the last sequence, "the chunk holding seq s" is the first key >= s (one ``set_range``),
and truncating below a floor deletes exactly the keys below it: every chunk whose records are
all acked. One LMDB entry per chunk instead of per message is most of what a batch costs LMDB
(format 2; format 1 stored one entry per record).

Record (inside a chunk)::

    crc32c (u32, big-endian, over the body) || body
    body = msgpack [publish_time_ns: int, key: str | None, headers: dict | None, payload: bytes]
         | msgpack [publish_time_ns, key, headers, payload, expires_ns: int]

The five-field form carries the time a message published with a TTL expires; a record without
one never expires by itself (every record written before TTLs existed has four fields).

The checksum is verified *before* the body is decoded: msgpack decodes many damaged buffers into
well-formed objects, so the checksum is what tells damage apart from data. Any failure becomes
``CorruptRecord`` with queue, partition and sequence.
"""
from __future__ import annotations

import dataclasses
import struct
from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

import msgpack

from partq.storage.checksum import crc32c
from partq.storage.errors import PARENT as PARENT  # re-exported: the parent queue's log
from partq.storage.errors import CorruptRecord, CorruptStore

# Format 3 (delivery counts in ack states, TTLs in records) reads every store of format 2 as it
# is; a process that writes to a format-2 store stamps it 3 first, so that a partq of format 2
# refuses it with FormatVersionMismatch instead of finding ack states and records it cannot read.
FORMAT_VERSION = 3
READS_FORMATS = (2, 3)
CHUNK_RECORDS = 512          # records per chunk at most
CHUNK_BYTES = 256 << 10      # a chunk closes once its records reach this size
FORMAT_STAMP = b"partq-format/%d" % FORMAT_VERSION
READABLE_STAMPS = frozenset(b"partq-format/%d" % v for v in READS_FORMATS)

_LOG_KEY = struct.Struct(">IIQ")
_PART_KEY = struct.Struct(">II")
_CRC = struct.Struct(">I")
_U64 = struct.Struct(">Q")

# The log of a queue's parent queue (``PARENT``, from ``errors``, which names it in messages):
# where messages of a non-partitioned (exclusive) queue live. It shares the queue's key space with
# partitions 0..N-1 and outlives changes of access type.

log_key = _LOG_KEY.pack
partition_key = _PART_KEY.pack
pack_u64 = _U64.pack


def unpack_u64(raw: bytes) -> int:
    return _U64.unpack(raw)[0]


_packer = msgpack.Packer(use_bin_type=True)
_crc = crc32c
_crc_pack = _CRC.pack
_crc_unpack = _CRC.unpack_from
_unpack = msgpack.unpackb

# The parts of ``encode_record`` for callers that encode many records in one loop (the broker's
# publish path): ``frame_crc(crc32c(body)) + pack_record_body((ts, key, headers, payload))``.
pack_record_body = _packer.pack
frame_crc = _crc_pack


_HEADER_SCALARS = (type(None), bool, int, float, str, bytes)


def check_headers(value, depth: int = 0) -> None:
    """Headers are a dict of str to JSON-like values (plus bytes); raise TypeError otherwise, so
    that nothing is stored that would not decode back to what was given."""
    if depth > 32:
        raise TypeError("headers nest deeper than 32 levels")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"header names must be str, not {type(k).__name__}")
            check_headers(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_headers(v, depth + 1)
    elif not isinstance(value, _HEADER_SCALARS):
        raise TypeError(f"header values must be None, bool, int, float, str, bytes, list or "
                        f"dict, not {type(value).__name__}")


def chunks(first: int, records: list[bytes]):
    """Split an append into chunks: ``(last_seq, value)`` pairs, in sequence order."""
    n = len(records)
    if n <= CHUNK_RECORDS and sum(map(len, records)) <= CHUNK_BYTES:
        yield first + n - 1, _packer.pack([first, *records])
        return
    ends = list(accumulate(map(len, records)))      # bytes of records[:i + 1]
    start = 0
    while start < n:        # a chunk ends at its CHUNK_RECORDS-th record, at the record that
        before = ends[start - 1] if start else 0    # brings it to CHUNK_BYTES, or at the last
        end = min(start + CHUNK_RECORDS, bisect_left(ends, before + CHUNK_BYTES, start) + 1, n)
        yield first + end - 1, _packer.pack([first + start, *records[start:end]])
        start = end


def unpack_chunk(value: bytes, last: int) -> tuple[int, list[bytes]]:
    """``(first_seq, records)`` of a stored chunk; ValueError when it is damaged."""
    try:
        chunk = _unpack(value)
    except Exception as exc:  # msgpack raises a zoo of types on bad input
        raise ValueError(f"undecodable chunk ({type(exc).__name__})") from None
    if type(chunk) is not list or len(chunk) < 2 or type(chunk[0]) is not int \
            or chunk[0] + len(chunk) - 2 != last:
        raise ValueError("chunk does not match its key")
    first = chunk[0]
    del chunk[0]
    return first, chunk


def chunk_span(value: bytes) -> tuple[int, int] | None:
    """``(first_seq, records)`` of a stored chunk, from its header alone; None when the header
    is not a chunk's (the records themselves are checked by ``unpack_chunk``)."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(value[:18])
    try:
        n, first = unpacker.read_array_header(), unpacker.unpack()
    except Exception:  # msgpack raises a zoo of types on bad input
        return None
    return (first, n - 1) if type(first) is int and first >= 0 and n >= 2 else None


def chunk_length(value: bytes) -> int:
    """Records in a stored chunk, from its array header alone (0 if it is damaged)."""
    unpacker = msgpack.Unpacker()
    unpacker.feed(value[:9])
    try:
        return max(unpacker.read_array_header() - 1, 0)
    except Exception:  # a damaged header counts nothing
        return 0


def encode_record(publish_time_ns: int, key: str | None, headers: dict | None, payload: bytes,
                  expires_ns: int | None = None) -> bytes:
    """Encode one record (raises TypeError for headers that would not decode back as given).
    Safe from any thread: the packer holds no state between calls (autoreset)."""
    if headers is not None:
        if not isinstance(headers, dict):
            raise TypeError(f"headers must be a dict, not {type(headers).__name__}")
        check_headers(headers)
    body = _packer.pack((publish_time_ns, key, headers, payload) if expires_ns is None
                        else (publish_time_ns, key, headers, payload, expires_ns))
    return _crc_pack(_crc(body)) + body


class Record(NamedTuple):
    publish_time_ns: int
    key: str | None
    headers: dict | None
    payload: bytes


def record_fields(raw: bytes) -> list | None:
    """``[publish_time_ns, key, headers, payload]`` of a sound record, with ``expires_ns`` as a
    fifth item when it has one; None for a damaged one (``decode_record`` says what is wrong).
    The checksum is checked before decoding. This is the hot path of delivery, so it returns
    the decoded list itself, not a ``Record``."""
    body = raw[4:]
    if len(raw) < 5 or _crc(body) != _crc_unpack(raw)[0]:
        return None
    try:
        f = _unpack(body, raw=False, strict_map_key=False)
    except Exception:  # msgpack raises a zoo of types on bad input
        return None
    if (type(f) is list and 4 <= len(f) <= 5 and type(f[0]) is int and type(f[3]) is bytes
            and (f[1] is None or type(f[1]) is str) and (f[2] is None or type(f[2]) is dict)
            and (len(f) == 4 or type(f[4]) is int)):
        return f
    return None


def expires_ns(fields: list) -> int | None:
    """When the record of ``fields`` (``record_fields``) expires by its own TTL (None: never)."""
    return fields[4] if len(fields) == 5 else None


def decode_record(raw: bytes, queue: str, partition: int, seq: int) -> Record:
    """Check the crc32c, then decode. Raises only ``CorruptRecord``."""
    fields = record_fields(raw)
    if fields is None:
        raise corruption(raw, queue, partition, seq)
    return Record(*fields[:4])


def corruption(raw: bytes, queue: str, partition: int, seq: int) -> CorruptRecord:
    """The error for a record ``record_fields`` refused, saying what is wrong with it."""
    return CorruptRecord(queue, partition, seq, _damage(raw))


def _damage(raw: bytes) -> str:
    if not raw:     # what ``Reader.records`` yields for a sequence it found no chunk for
        return ("record is 0 bytes, shorter than a header: the log chunk that held it is "
                "damaged or missing")
    if len(raw) < 5:
        return f"record is {len(raw)} bytes, shorter than a header"
    body = raw[4:]
    if _crc(body) != _CRC.unpack_from(raw)[0]:
        return "crc32c mismatch"
    try:
        fields = _unpack(body, raw=False, strict_map_key=False)
    except Exception as exc:
        return f"undecodable body ({type(exc).__name__})"
    if type(fields) is not list or not 4 <= len(fields) <= 5:
        return "body is not a 4- or 5-field record"
    return "record fields have the wrong types"


DELAYS_KEPT = 10_000     # nack delays an AckState keeps per partition


@dataclass(slots=True)
class AckState:
    """Durable consumer state of one partition (vocabulary borrowed from nats' ConsumerStore).

    Invariants: every seq < ``floor`` is acked (and truncated from the log, chunk by chunk:
    a chunk that also holds seqs >= floor stays until they are acked too); ``above`` holds the
    acked seqs > floor, so ``floor`` itself is never in it; ``delivered_mark`` >= every seq ever
    handed to a consumer (it may run ahead of real deliveries: see ``partq.broker``), so after a
    restart every unacked seq <= delivered_mark is marked redelivered.
    """

    floor: int = 0
    above: set[int] = dataclasses.field(default_factory=set)
    delivered_mark: int = -1
    # seq -> times the message came back unacked (its delivery count is one more), for unacked
    # seqs only: an ack drops its entry. Encoded as a fourth item only when not empty, so the
    # three-item states of stores written before delivery counts decode as they are.
    failures: dict[int, int] = dataclasses.field(default_factory=dict)
    # Every delivery at or below ``counted`` is in ``failures`` already, and the delivered mark is
    # exact: the last holder of the partition let it go gracefully (``Writer.settle``). -1 once a
    # holder hands messages out again. The next holder counts one lost delivery for each unacked
    # seq in (counted, delivered_mark]: after a crash, more than were really delivered (at most
    # one per message), never fewer.
    counted: int = -1
    # seq -> wall-clock ns before which it is not delivered again: a nack's delay (rule
    # `retry-delay`), so that it holds across a restart or a move to another process. Unacked
    # seqs only; at most ``DELAYS_KEPT`` (those ending first go). A sixth item when not empty.
    delays: dict[int, int] = dataclasses.field(default_factory=dict)

    def encode(self) -> bytes:
        failures, delays = self.failures, self.delays
        floor, above = self.floor, self.above
        for kept in (failures, delays):
            if kept:
                for seq in [s for s in kept if s < floor or s in above]:
                    del kept[seq]
        head = (self.floor, sorted(self.above), self.delivered_mark)
        if delays:
            return msgpack.packb((*head, sorted(failures.items()), self.counted,
                                  sorted(delays.items())))
        if failures or self.counted >= 0:
            return msgpack.packb((*head, sorted(failures.items()), self.counted))
        return msgpack.packb(head)

    def delay(self, seqs: list[tuple[int, int]]) -> bool:
        """Keep ``(seq, not_before_ns)`` for unacked seqs (a later end replaces an earlier
        one); past ``DELAYS_KEPT`` those ending first go. True when anything changed."""
        delays, changed = self.delays, False
        for seq, until in seqs:
            if until > delays.get(seq, 0) and not self.is_acked(seq):
                delays[seq] = until
                changed = True
        if len(delays) > DELAYS_KEPT:
            for seq, _ in sorted(delays.items(), key=lambda kv: kv[1])[:len(delays) - DELAYS_KEPT]:
                del delays[seq]
        return changed

    @classmethod
    def decode(cls, raw: bytes | None, where: str) -> AckState:
        if raw is None:
            return cls(above=set())
        try:
            fields = msgpack.unpackb(raw)
            floor, above, mark = fields[:3]
            failures = {int(s): int(n) for s, n in fields[3]} if len(fields) > 3 else {}
            counted = int(fields[4]) if len(fields) > 4 else -1
            delays = {int(s): int(t) for s, t in fields[5]} if len(fields) > 5 else {}
            return cls(int(floor), set(above), int(mark), failures, counted, delays)
        except Exception:
            raise CorruptStore(f"ack state of {where} is damaged; restore from a DR-standby or "
                               f"backup") from None

    def failed(self, seq: int) -> int:
        """Times ``seq`` came back unacked."""
        return self.failures.get(seq, 0) if self.failures else 0

    def retry_at_ns(self, seq: int) -> int | None:
        """The wall-clock ns before which a nack's delay keeps ``seq`` from being delivered
        again (None: no delay was set; it may have ended already)."""
        return self.delays.get(seq) if self.delays else None

    def retried_seqs(self) -> list[int]:
        """The unacked seqs that came back unacked at least once or wait out a nack's delay,
        in order."""
        return sorted(s for s in {*self.failures, *self.delays} if not self.is_acked(s))

    def backlog(self, head: int) -> int:
        """Messages published and not acked, for a partition whose next sequence is ``head``."""
        return head - self.floor - len(self.above)

    def is_acked(self, seq: int) -> bool:
        return seq < self.floor or seq in self.above

    def add_through(self, seq: int) -> int:
        """Mark every seq up to ``seq`` acked; return the new floor."""
        if seq >= self.floor:
            self.above = {s for s in self.above if s > seq}
            self.floor = seq + 1
            while self.floor in self.above:
                self.above.discard(self.floor)
                self.floor += 1
        return self.floor

    def add(self, seqs) -> int:
        """Mark seqs acked; return the new floor (records below it may be truncated)."""
        above = self.above
        floor = self.floor
        if not above and seqs:
            # The common case, worked example: floor 100, acks 100..199 in any order -> floor 200.
            ordered = sorted(seqs)
            if ordered[0] == floor and ordered[-1] - floor == len(ordered) - 1 \
                    and len(set(ordered)) == len(ordered):
                self.floor = ordered[-1] + 1
                return self.floor
        for s in seqs:
            if s >= floor:
                above.add(s)
        while floor in above:
            above.discard(floor)
            floor += 1
        self.floor = floor
        return floor


def encode_meta(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def decode_meta(raw: bytes, what: str):
    try:
        return msgpack.unpackb(raw, raw=False)
    except Exception:  # msgpack raises a zoo of types on bad input
        raise CorruptStore(f"{what} is damaged; restore from a DR-standby or backup") from None
