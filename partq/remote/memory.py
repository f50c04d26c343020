"""How ``partq serve`` keeps its memory from only growing: large blocks in mappings of their
own, and freed memory handed back when a connection ends (glibc; elsewhere nothing is done)."""
from __future__ import annotations

import ctypes
import ctypes.util


def _libc():
    try:
        name = ctypes.util.find_library("c")
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


_LIBC = _libc()
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)
_MALLOPT = getattr(_LIBC, "mallopt", None)
M_MMAP_THRESHOLD = -3
# above msgpack's 256 KiB packing buffer, which every packb allocates and frees: at 256 KiB each
# would be a mmap and munmap of its own (two system calls per frame and per ack state)
MMAP_THRESHOLD = 1 << 20


def keep_large_blocks_apart() -> None:
    """Serve large blocks (frames, payloads) from their own mappings, returned to the system
    when freed. glibc raises its threshold for that after the first large block is freed, so
    later ones (a 14 MiB frame, 4 MiB deliveries) land in the heap between small live objects
    and stay there: the server's memory would only grow under large frames. A fixed threshold
    turns that off."""
    if _MALLOPT is not None:
        _MALLOPT(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def give_back_freed_memory() -> None:
    """After a connection ends: hand the C allocator's freed memory back to the system.
    Payloads of many threads leave freed blocks in glibc's per-thread arenas, which it keeps
    otherwise (a consumer's large messages would keep the server's RSS up after it left)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
