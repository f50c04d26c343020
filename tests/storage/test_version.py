"""``Store.version()`` is what a snapshot begun after it shows, or newer: never a commit that a
read begun right after cannot see yet. Waiting receivers and the ticker compare it with what
they last read ("nothing new since version V"); a version ahead of the snapshot made them skip
a commit until the next one (found by a CLI test whose queue config change was never applied:
LMDB's env info names a commit once its meta page is written, which with a synchronous meta
write is the whole flush before new readers are pointed at it)."""
from __future__ import annotations

import threading

from store_helpers import append, make_queue


def test_a_snapshot_begun_after_version_shows_at_least_that_version(tmp_path, opened):
    store = opened(tmp_path / "d", durability="sync")
    qid = make_queue(store)
    done = threading.Event()

    def writer() -> None:
        for i in range(300):
            append(store, qid, 0, [b"%d" % i])
        done.set()
    t = threading.Thread(target=writer)
    t.start()
    ahead = reads = 0
    while not done.is_set() and reads < 300_000:
        version = store.version()
        with store.read() as r:
            ahead += r.version() < version
        reads += 1
    t.join(60)
    assert reads > 100
    assert ahead == 0, f"{ahead} of {reads} snapshots were older than the version read before"
