"""Validating and encoding messages, in the caller's thread, before they are queued for a
commit: payload, key and headers checked against the queue's limits, the record built in the
storage layout (``storage.encoding``), the key hashed (rule `key-hash`: the write transaction
only takes the hash modulo the partition count it sees)."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from partq.config import MAX_TTL, QueueConfig
from partq.core.key_hash import crc32c_of
from partq.errors import InvalidConfig, InvalidMessage
from partq.storage.encoding import check_headers, frame_crc, pack_record_body, record_fields

Encoded = list[tuple[int | None, bytes]]    # (crc32c of the key or None, record bytes) per message


def expiry(now_ns: int, ttl: float | None) -> int | None:
    """When a message published at ``now_ns`` with ``ttl`` seconds to live expires (None: no
    TTL; 0 means none too, as Solace's TTL 0 does). Raises ``InvalidConfig`` for a TTL that is
    not a number of seconds from 0 to ``MAX_TTL``."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not math.isfinite(ttl) \
            or not 0 <= ttl <= MAX_TTL:
        raise InvalidConfig(f"ttl must be a number of seconds from 0 to {MAX_TTL:g} (0: none), "
                            f"not {ttl!r}")
    return now_ns + int(ttl * 1e9) if ttl > 0 else None


def encode(config: QueueConfig, items: Iterable, now: int, expires: int | None = None) -> Encoded:
    """Validate and encode messages: [(crc32c of the key or None, record bytes)]. Items are
    ``payload``, ``(payload, key)`` or ``(payload, key, headers)``. Keys are hashed here, in
    the caller's thread; the write transaction only takes them modulo the partition count it
    sees (rule `key-hash`). ``expires``: the expiry time of every message (a TTL), in ns.

    This loop is the hot path of publishing: the common items (``(payload, key)`` or
    ``(payload, key, None)`` with a str key, or a bare payload, within the queue's limits) are
    encoded inline, as ``encode_one`` would encode them; any other item goes through
    ``encode_one``, which checks it in full and raises the error that names what is wrong."""
    check_batch(items)
    max_size, max_key = config.max_message_size, config.max_key_size
    pack, crc, crc_pack = pack_record_body, crc32c_of, frame_crc
    out: Encoded = []
    append = out.append
    for item in items:
        if type(item) is tuple and (len(item) == 2 or len(item) == 3 and item[2] is None):
            payload, key = item[0], item[1]
            if type(payload) is bytes and len(payload) <= max_size:
                if type(key) is str:
                    if key.isascii() and len(key) <= max_key:
                        body = pack((now, key, None, payload) if expires is None
                                    else (now, key, None, payload, expires))
                        append((crc(key.encode()), crc_pack(crc(body)) + body))
                        continue
                elif key is None:
                    item = payload
        if type(item) is bytes and len(item) <= max_size:
            body = pack((now, None, None, item) if expires is None
                        else (now, None, None, item, expires))
            append((None, crc_pack(crc(body)) + body))
            continue
        append(encode_item(config, item, now, expires))
    return out


def replayable(items):
    """``items`` as something ``encode`` can go through twice (a batch is checked again with
    the stored config when the cached one refuses it: ``partq.publish.configs``): an iterator
    becomes a list; anything else, even what is not a batch at all (``encode`` says so), is
    returned as it is."""
    if isinstance(items, (list, tuple, bytes, str)) or not hasattr(items, "__iter__"):
        return items
    return list(items)


def encode_item(config: QueueConfig, item, now: int, expires: int | None = None) -> tuple[int | None, bytes]:
    """``encode`` of one batch item: ``payload``, ``(payload, key)`` or
    ``(payload, key, headers)``."""
    return encode_one(config, *item_fields(item), now, expires)


def check_batch(items) -> None:
    """``InvalidMessage`` unless ``items`` is an iterable of messages (not one bytes or str)."""
    if isinstance(items, (bytes, str)) or not hasattr(items, "__iter__"):
        raise InvalidMessage(f"publish_many takes an iterable of messages, not "
                             f"{type(items).__name__}")


def item_fields(item) -> tuple[Any, Any, Any]:
    """``(payload, key, headers)`` of a batch item (a tuple of the application's, a NamedTuple,
    counts as a tuple); ``InvalidMessage`` for a tuple of another length."""
    if not isinstance(item, tuple):
        return item, None, None
    n = len(item)
    if n == 3:
        return item[0], item[1], item[2]
    if n == 2:
        return item[0], item[1], None
    if n == 1:
        return item[0], None, None
    raise InvalidMessage(f"a batch item must be payload, (payload, key) or "
                         f"(payload, key, headers), not a {n}-tuple")


def check_types(payload, key, headers) -> None:
    """The checks of a message that need no queue (``encode_one`` makes them first): a payload
    of bytes, a str key or None, headers a dict of storable values or None. A client of
    ``partq serve`` makes them before it sends; raises ``InvalidMessage``."""
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise InvalidMessage(f"payload must be bytes, not {type(payload).__name__}")
    if key is not None and type(key) is not str:
        raise InvalidMessage(f"key must be a str or None, not {type(key).__name__}")
    if headers is not None:
        if type(headers) is not dict:
            raise InvalidMessage(f"headers must be a dict or None, not {type(headers).__name__}")
        try:
            check_headers(headers)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidMessage(f"headers cannot be stored: {exc}") from None


def encode_one(config: QueueConfig, payload, key, headers, now: int,
               expires: int | None = None) -> tuple[int | None, bytes]:
    """Validate and encode one message: (crc32c of its key or None, its record bytes). The
    record layout is ``storage.encoding``'s (``encode_record``, inlined here: same bytes,
    pinned by tests/broker/test_publish_encoding.py)."""
    check_types(payload, key, headers)
    if type(payload) is not bytes:
        payload = bytes(payload)
    if len(payload) > config.max_message_size:
        raise payload_too_big(config, len(payload))
    key_hash = None
    if key is not None:
        try:
            raw_key = key.encode()
        except UnicodeEncodeError:
            raise InvalidMessage("key is not encodable as UTF-8 (it holds a lone surrogate)") from None
        if len(raw_key) > config.max_key_size:
            raise key_too_long(config)
        key_hash = crc32c_of(raw_key)
    try:
        body = pack_record_body((now, key, headers, payload) if expires is None
                                else (now, key, headers, payload, expires))
    except (TypeError, ValueError, OverflowError) as exc:   # what check_headers let through
        raise InvalidMessage(f"headers cannot be stored: {exc}") from None
    return key_hash, frame_crc(crc32c_of(body)) + body


def payload_too_big(config: QueueConfig, size: int) -> InvalidMessage:
    return InvalidMessage(f"payload of {size} bytes exceeds max_message_size="
                          f"{config.max_message_size} of queue {config.name!r}")


def key_too_long(config: QueueConfig) -> InvalidMessage:
    return InvalidMessage(f"key longer than max_key_size={config.max_key_size} bytes")


def limits_lowered(then: QueueConfig, now: QueueConfig) -> bool:
    """Whether messages checked against ``then`` must be checked again against ``now``: the
    queue's config changed since they were encoded (another process, or another thread, updated
    it) and one of its message limits went down. An identity test first, so the common case
    (the config the caller cached is the one the transaction reads) costs one comparison."""
    return now is not then and (now.max_message_size < then.max_message_size
                                or now.max_key_size < then.max_key_size)


def over_limits(config: QueueConfig, record: bytes) -> InvalidMessage | None:
    """The ``InvalidMessage`` an encoded ``record`` earns under ``config``'s limits (lowered
    since it was encoded), or None when it still fits. Decodes the record: only for the rare
    publish that meets a change of the limits."""
    fields = record_fields(record)
    if fields is None:      # encoded by this process a moment ago, never stored: not damaged
        return None
    _, key, _, payload = fields[:4]
    if len(payload) > config.max_message_size:
        return payload_too_big(config, len(payload))
    if key is not None and len(key.encode()) > config.max_key_size:
        return key_too_long(config)
    return None
