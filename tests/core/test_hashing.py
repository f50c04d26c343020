"""The key hash (rule `key-hash`) is part of the on-disk contract; these values must never change."""
import pytest

from partq import key_partition

# crc32c(utf8(key)) computed independently (RFC 3720 test vectors and pinned values).
PINNED = [
    ("customer-42", 0x3C909C8C),
    ("A", 0xE16DCDEE),
    ("B", 0xF23D3E1A),
    ("", 0x0),
]


@pytest.mark.parametrize("key,crc", PINNED)
@pytest.mark.parametrize("n", [1, 2, 4, 7, 1000])
def test_key_partition_is_crc32c_mod_n(key, crc, n):
    assert key_partition(key, n) == crc % n


def test_rfc3720_vector():
    # 32 bytes of zeros hash to 0x8A9136AA in RFC 3720 B.4; the key is their utf-8 text.
    assert key_partition("\x00" * 32, 1 << 32) == 0x8A9136AA


def test_non_ascii_keys_hash_their_utf8_bytes():
    import crc32c
    assert key_partition("clé-ü", 97) == crc32c.crc32c("clé-ü".encode()) % 97
