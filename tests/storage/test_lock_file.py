"""LMDB's lock on lock.mdb outlives everything partq reads from that file: a process that has
the store open keeps its reader slots and writer mutex while another process opens it.

LMDB holds an fcntl lock on lock.mdb for as long as an environment is open; a process opening
the store that finds none takes itself for the only user and resets the reader table (and the
writer mutex). POSIX drops a process's fcntl locks on a file when it closes any descriptor of
that file, so partq must never open and close lock.mdb while its environment is open (it reads
the writer mutex there, for ``Store.usage``'s ``writer_stopped_pid``).
"""
from __future__ import annotations

import json

from helpers import run_child

from partq.storage import Store

READERS = """
    import json, lmdb, sys
    env = lmdb.open(sys.argv[1], max_dbs=16)
    print(json.dumps(env.readers()))
"""


def test_usage_keeps_this_process_known_to_the_next_one_that_opens(tmp_path):
    path = tmp_path / "d"
    store = Store.open(path)
    try:
        with store.read() as r:
            first = r.version()
            seen = run_child(READERS, path)
            assert seen.returncode == 0, seen.stderr
            assert f" {first}\n" in json.loads(seen.stdout)       # this read's slot is listed
            usage = store.usage()
            assert usage["writer_stopped_pid"] is None
            after = run_child(READERS, path)
            assert after.returncode == 0, after.stderr
            assert f" {first}\n" in json.loads(after.stdout), \
                f"the next process reset LMDB's reader table: {json.loads(after.stdout)!r}"
    finally:
        store.close()
