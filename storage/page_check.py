"""Walking data.mdb page by page as LMDB lays it out, to find the damage LMDB itself would
stumble on: the free list (LMDB's record of reusable pages, which every commit reads and no
read ever touches), the main database and each named database, with every page header, node and
overflow run checked, and every page used once at most.

Reading records through LMDB cannot find damage in the free list: only a commit reads it, and
a commit on a damaged free list fails (MDB_CORRUPTED) or, worse, hands out a page that is still
in use. Making a commit to find out would take LMDB's write lock (holding up every writer, and
waiting forever behind a process stopped inside a commit), and would read only the part of the
free list that commit needs. So this module reads the file itself, without writing anything:
inside a read transaction, whose slot in lock.mdb keeps every page of that commit and of any
later one from being reused until it ends, it reads the newest meta page and walks the trees it
names. A store opened without LMDB's reader lock (``ReadOnlyStore``) checks afterwards that no
writer could have reused a page meanwhile (``Store.snapshot_kept``) and walks again otherwise.

The layout read here is LMDB 0.9's on a 64-bit little-endian machine (the only one partq's
LMDB builds for): a 16-byte page header (page number, key size, flags, lower and upper bounds
of free space, or an overflow run's length), 8-byte node headers, and two meta pages (pages 0
and 1; the one with the larger transaction id is current).
"""
from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from partq.storage.errors import TornRead

PAGE_HEADER = 16
NODE_HEADER = 8
_HEADER = struct.Struct("<QHHHH")           # page number, pad, flags, lower, upper
_NODE = struct.Struct("<HHHH")              # lo, hi, flags, key size
_DB = struct.Struct("<IHHQQQQQ")            # pad, flags, depth, branch, leaf, overflow, entries, root
_META = struct.Struct("<IIQQ48s48sQQ")      # magic, version, address, map size, free db, main db,
#                                             last page, transaction id (after the page header)
MAGIC, VERSION = 0xBEEFC0DE, 1
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA, F_SUBDATA = 0x01, 0x02
NO_PAGE = (1 << 64) - 1                     # the root of an empty tree
FREE_LIST, MAIN = "free list", "main"
ATTEMPTS = 5                                # walks before a lock-free store gives up (TornRead)
RETRY_PAUSE = 0.005                         # seconds before the second walk; four times longer each
_FREE = 1                                   # owner of a page the free list lists (``_Walk.owner``)


@dataclass(frozen=True)
class PageFault:
    """One piece of damage: the tree it was found in (``"free list"``, ``"main"``, or a
    database's name), the page (None for the tree as a whole), what is wrong, and whether
    reading through LMDB is still safe (``readable``): damage in the free list, or in the
    order of keys or a tree's counts, leaves reads working; a damaged page of a tree may make
    LMDB fail, or abort the process, when a read reaches it."""
    tree: str
    page: int | None
    reason: str
    readable: bool

    def as_dict(self) -> dict:
        return {"tree": self.tree, "page": self.page, "reason": self.reason}


@dataclass(frozen=True)
class _Db:
    depth: int
    branch: int
    leaf: int
    overflow: int
    entries: int
    root: int

    @classmethod
    def parse(cls, raw: bytes) -> _Db:
        _, _, depth, branch, leaf, overflow, entries, root = _DB.unpack(raw)
        return cls(depth, branch, leaf, overflow, entries, root)


@dataclass(frozen=True)
class Meta:
    """The fields of one meta page that the walk needs."""
    psize: int
    map_size: int
    free: _Db
    main: _Db
    last_pg: int
    txnid: int
    problem: str | None         # why LMDB would refuse this meta page, or None


def read_meta(fd: int, page: int, psize: int) -> Meta:
    """Meta page ``page`` (0 or 1) of the open ``data.mdb``."""
    raw = os.pread(fd, PAGE_HEADER + _META.size, page * psize)
    if len(raw) < PAGE_HEADER + _META.size:
        return _broken(psize, "data.mdb ends inside it")
    flags = _HEADER.unpack_from(raw)[2]
    magic, version, _, map_size, free, main, last_pg, txnid = _META.unpack_from(raw, PAGE_HEADER)
    psize = _DB.unpack(free)[0] or psize
    problem = None
    if magic != MAGIC or version != VERSION or not flags & P_META:
        problem = "it is not an LMDB 0.9 meta page"
    elif not 1 <= last_pg < map_size // psize:
        problem = f"its last page {last_pg} lies outside its map of {map_size} bytes"
    return Meta(psize, map_size, _Db.parse(free), _Db.parse(main), last_pg, txnid, problem)


def _broken(psize: int, problem: str) -> Meta:
    return Meta(psize, 0, _Db(0, 0, 0, 0, 0, NO_PAGE), _Db(0, 0, 0, 0, 0, NO_PAGE), 0, 0, problem)


def check_pages(store) -> list[PageFault]:
    """Every piece of damage in the pages of ``store``'s data.mdb that the newest commit uses
    (see the module's docstring). Reads only; holds one read transaction while it walks."""
    path = os.path.join(store.path, "data.mdb")
    pause = RETRY_PAUSE
    for attempt in range(ATTEMPTS):
        if attempt:
            time.sleep(pause)       # let a burst of commits pass
            pause *= 4
        with store.read_transaction() as txn:
            begun = txn.id()
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                meta = _newest_meta(fd)
                if meta is None or meta.txnid < begun:
                    continue        # a meta page read while LMDB wrote it: read again
                if meta.problem is not None:
                    return [PageFault("meta", None, meta.problem, False)]
                faults = _Walk(fd, meta).run()
            finally:
                os.close(fd)
            if store.snapshot_kept(meta.txnid):
                return faults
    raise TornRead(f"{store.path} changed under this read more often than it could retry (a "
                   f"walk of its pages without LMDB's reader lock); run the command again, or "
                   f"as a user who may write {store.path}")


def _newest_meta(fd: int) -> Meta | None:
    """The meta page LMDB uses (the larger transaction id), read twice alike; None when the
    two readings differ (a writer was writing it)."""
    psize = read_meta(fd, 0, 4096).psize
    if not 512 <= psize <= 65536 or psize & (psize - 1):
        return _broken(psize, f"its page size {psize} is not one LMDB uses")
    metas = [read_meta(fd, i, psize) for i in (0, 1)]
    if metas != [read_meta(fd, i, psize) for i in (0, 1)]:
        return None
    return metas[metas[0].txnid < metas[1].txnid]


class _Walk:
    """One walk of the trees of one meta page. ``owner`` has a byte per page: 0 unused so far,
    ``_FREE`` listed as free, else the index (plus 2) in ``trees`` of the tree using it."""

    def __init__(self, fd: int, meta: Meta) -> None:
        self.fd, self.meta, self.psize = fd, meta, meta.psize
        self.faults: list[PageFault] = []
        self.trees = ["meta", FREE_LIST, MAIN]
        self.owner = bytearray(meta.last_pg + 1)
        self.owner[0:2] = b"\x02\x02"     # the meta pages: ``trees[0]``

    def run(self) -> list[PageFault]:
        meta = self.meta
        named = self.tree(MAIN, meta.main)
        for name, db in named:
            self.trees.append(name)
            self.tree(name, db)
        # last: a page both in use and listed as free is then the free list's fault, where
        # the next commit would go wrong
        self.tree(FREE_LIST, meta.free)
        return self.faults

    def fault(self, tree: str, page: int | None, reason: str, readable: bool = False) -> None:
        self.faults.append(PageFault(tree, page, reason, readable or tree == FREE_LIST))

    def claim(self, tree: str, first: int, n: int, what: str) -> bool:
        """Mark pages ``first`` .. ``first + n - 1`` as used by ``tree`` (as listed free, for a
        ``"free page"``); False, after saying why, when one lies beyond the last page or is
        taken already."""
        if first < 2 or first + n - 1 > self.meta.last_pg:
            span = f"{first}..{first + n - 1}" if n > 1 else f"{first}"
            self.fault(tree, first, f"{what} {span} lies outside the file's pages "
                       f"2..{self.meta.last_pg}")
            return False
        code = _FREE if what == "free page" else self.trees.index(tree) + 2
        taken = next((i for i in range(first, first + n) if self.owner[i]), None)
        if taken is not None:
            self.fault(tree, taken, f"{what} {taken} is {self._holder(self.owner[taken])} as "
                       f"well: a commit could overwrite a page in use", readable=True)
            return False
        self.owner[first:first + n] = bytes([code]) * n
        return True

    def _holder(self, code: int) -> str:
        if code == _FREE:
            return "listed as free"
        name = self.trees[code - 2]
        return ("a meta page" if name == "meta" else
                "used by LMDB's free list" if name == FREE_LIST else f"used by {name!r}")

    def page(self, tree: str, pgno: int, length: int | None = None) -> bytes | None:
        raw = os.pread(self.fd, length or self.psize, pgno * self.psize)
        if len(raw) < (length or self.psize):
            self.fault(tree, pgno, "the page lies past the end of data.mdb")
            return None
        return raw

    def tree(self, tree: str, db: _Db) -> list[tuple[str, _Db]]:
        """Walk one tree; return the named databases its leaves hold (the main database's)."""
        named: list[tuple[str, _Db]] = []
        if db.root == NO_PAGE:
            if db.entries or db.leaf or db.branch or db.depth:
                self.fault(tree, None, "the tree is empty but its record counts entries",
                           readable=True)
            return named
        counted = [0, 0, 0, 0]          # branch pages, leaf pages, overflow pages, entries
        faults_before = len(self.faults)    # counts are compared only after a clean walk
        last_key: bytes | None = None
        stack = [(db.root, db.depth)]
        while stack:
            pgno, level = stack.pop()
            if not self.claim(tree, pgno, 1, "page"):
                continue
            raw = self.page(tree, pgno)
            if raw is None:
                continue
            nodes = self.nodes(tree, pgno, raw, level)
            if nodes is None:
                continue
            if raw[10] & P_BRANCH:
                counted[0] += 1
                stack += [(child, level - 1) for _, child in reversed(nodes)]
                continue
            counted[1] += 1
            for key, (flags, dsize, at) in nodes:
                counted[3] += 1
                if last_key is not None and not _in_order(tree, key, last_key):
                    self.fault(tree, pgno, f"key {key.hex()} sorts at or before the key before "
                               f"it ({last_key.hex()})", readable=True)
                last_key = key
                data = self.value(tree, pgno, raw, flags, dsize, at, counted)
                if data is None:
                    continue
                if tree == FREE_LIST:
                    self.free_entry(pgno, key, data)
                elif tree == MAIN and flags & F_SUBDATA:
                    if len(data) != _DB.size:
                        self.fault(tree, pgno, f"the record of database {key!r} is damaged")
                    else:
                        named.append((key.decode(errors="replace"), _Db.parse(data)))
        found = (db.branch, db.leaf, db.overflow, db.entries)
        if tuple(counted) != found and faults_before == len(self.faults):
            self.fault(tree, None, f"its record counts {found[0]} branch, {found[1]} leaf and "
                       f"{found[2]} overflow pages and {found[3]} entries; the walk found "
                       f"{counted[0]}, {counted[1]}, {counted[2]} and {counted[3]}",
                       readable=True)
        return named

    def nodes(self, tree: str, pgno: int, raw: bytes, level: int) -> list | None:
        """The nodes of a branch or leaf page: (key, child page) on a branch page, (key, (flags,
        data size, offset of the data)) on a leaf page; None (after saying why) when the page
        is damaged."""
        number, _, flags, lower, upper = _HEADER.unpack_from(raw)
        kind = flags & ~0x8000        # P_KEEP may be left on a page written out
        problem = None
        if number != pgno:
            problem = f"its header names page {number}"
        elif kind not in (P_BRANCH, P_LEAF):
            problem = f"its flags 0x{flags:04x} mark no branch or leaf page"
        elif (kind == P_LEAF) != (level == 1):
            problem = (f"a {'leaf' if kind == P_LEAF else 'branch'} page where the tree's depth "
                       f"puts a {'leaf' if level == 1 else 'branch'} page")
        elif not PAGE_HEADER + 2 <= lower <= upper <= self.psize or lower % 2:
            problem = f"its free space bounds {lower}..{upper} are impossible"
        if problem is not None:
            self.fault(tree, pgno, problem)
            return None
        out: list = []
        for i, at in enumerate(struct.unpack_from(f"<{(lower - PAGE_HEADER) // 2}H", raw,
                                                  PAGE_HEADER)):
            if at < upper or at % 2 or at + NODE_HEADER > self.psize:
                self.fault(tree, pgno, f"node {i} lies at offset {at}, outside the page's nodes")
                return None
            lo, hi, nflags, ksize = _NODE.unpack_from(raw, at)
            key_end = at + NODE_HEADER + ksize
            if key_end > self.psize:
                self.fault(tree, pgno, f"the key of node {i} runs past the end of the page")
                return None
            key = raw[at + NODE_HEADER:key_end]
            if kind == P_BRANCH:
                out.append((key, lo | hi << 16 | nflags << 32))
                continue
            dsize = lo | hi << 16
            inline = 8 if nflags & F_BIGDATA else dsize
            if nflags & ~(F_BIGDATA | F_SUBDATA) or key_end + inline > self.psize:
                self.fault(tree, pgno, f"node {i} (key {key.hex()}) is damaged: its flags "
                           f"0x{nflags:x} or data size {dsize} do not fit the page")
                return None
            out.append((key, (nflags, dsize, key_end)))
        return out

    def value(self, tree: str, pgno: int, raw: bytes, flags: int, dsize: int, at: int,
              counted: list[int]) -> bytes | None:
        """A leaf node's data: inline, or on its overflow pages (checked and claimed; read
        whole only where the walk needs it: the free list's entries)."""
        if not flags & F_BIGDATA:
            return raw[at:at + dsize]
        first = int.from_bytes(raw[at:at + 8], "little")
        want = (PAGE_HEADER - 1 + dsize) // self.psize + 1
        head = self.page(tree, first, PAGE_HEADER) if 2 <= first <= self.meta.last_pg else None
        if head is None:
            self.fault(tree, pgno, f"a value's overflow page {first} is not one of the file's "
                       f"pages")
            return None
        number, _, oflags, _, _ = _HEADER.unpack_from(head)
        pages = int.from_bytes(head[12:16], "little")
        # (a run may be longer than its value needs: LMDB rewrites a value in place, keeping
        # the run, when the new one fits in it)
        if number != first or not oflags & P_OVERFLOW or pages < want:
            self.fault(tree, first, f"overflow page {first} (of page {pgno}) is damaged: its "
                       f"header names page {number}, flags 0x{oflags:04x}, {pages} pages for "
                       f"{dsize} bytes")
            return None
        if not self.claim(tree, first, pages, "overflow page"):
            return None
        counted[2] += pages
        if tree != FREE_LIST:
            return b""
        whole = self.page(tree, first, PAGE_HEADER + dsize)
        return None if whole is None else whole[PAGE_HEADER:]

    def free_entry(self, pgno: int, key: bytes, data: bytes) -> None:
        """One entry of the free list: a transaction id, and the pages it freed (a count, then
        the page numbers in descending order), each claimed as free."""
        if len(key) != 8 or len(data) < 8 or len(data) % 8:
            self.fault(FREE_LIST, pgno, f"entry {key.hex()} has a key of {len(key)} bytes and "
                       f"{len(data)} bytes of page numbers")
            return
        txnid = int.from_bytes(key, "little")
        count = int.from_bytes(data[:8], "little")
        if txnid > self.meta.txnid or (count + 1) * 8 > len(data):
            self.fault(FREE_LIST, pgno, f"entry of transaction {txnid} (the store is at "
                       f"{self.meta.txnid}) lists {count} pages in {len(data)} bytes")
            return
        pages = struct.unpack_from(f"<{count}Q", data, 8)
        for i, page in enumerate(pages):
            if i and page >= pages[i - 1]:
                self.fault(FREE_LIST, pgno, f"entry of transaction {txnid} lists its pages out "
                           f"of order ({pages[i - 1]} before {page})")
                return
        for page in pages:
            self.claim(FREE_LIST, page, 1, "free page")


def _in_order(tree: str, key: bytes, before: bytes) -> bool:
    """Whether ``key`` sorts after ``before``, in the order LMDB keeps keys: the free list's
    are native integers (transaction ids), every other database's compare as bytes."""
    if tree == FREE_LIST:
        return int.from_bytes(key, "little") > int.from_bytes(before, "little")
    return key > before
