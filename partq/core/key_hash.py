"""The key-to-partition hash (rule `key-hash`). Part of the on-disk contract: never change it silently."""
from __future__ import annotations

from partq.storage.checksum import crc32c

_crc = crc32c
crc32c_of = crc32c    # the key hash of already-encoded key bytes: key_partition's numerator


def key_partition(key: str, partition_count: int) -> int:
    """``crc32c(utf8(key)) % partition_count``. Worked example: crc32c(b"customer-42") is
    0x3C909C8C = 1016110220, so with 7 partitions the key lands in 1016110220 % 7 = 6 and with 4 in
    partition 0. ``tests/core/test_hashing.py`` pins a table of such values."""
    return _crc(key.encode()) % partition_count
