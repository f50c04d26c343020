"""The LMDB store shared: group commit of many threads' writes (rule `durable-publish`), a
failing write that fails only its caller, and a store used across fork().

Every test runs against a real LMDB environment in its own ``tmp_path`` directory (fixtures in
tests/storage/conftest.py); the main write/read tests run once per durability mode.
"""
from __future__ import annotations

import os
import threading

import pytest
from helpers import wait_until
from store_helpers import append, head, make_queue, payloads_of, rec

from partq.errors import UsedAcrossFork
from partq.storage import Store


# ------------------------------------------------------------ group commit (rule `durable-publish`)
def test_group_commit_from_8_threads(tmp_path, opened, durability):
    store = opened(tmp_path / "d", durability=durability)
    qid = make_queue(store)
    commits_before, _ = store.commit_counts()
    results: dict[int, list[int]] = {}
    errors = []
    start = threading.Barrier(8)

    def publisher(t):
        try:
            start.wait()
            results[t] = [store.write(lambda w, i=i: w.append(qid, 0, [rec(b"%d:%d" % (t, i))]))
                          for i in range(200)]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=publisher, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors
    seqs = [s for t in range(8) for s in results[t]]
    assert len(set(seqs)) == 1600 and set(seqs) == set(range(1600))
    for t in range(8):
        assert results[t] == sorted(results[t])  # one thread's appends keep their order
    stored = payloads_of(store, qid, 0)
    for t in range(8):
        for i, seq in enumerate(results[t]):
            assert stored[seq] == b"%d:%d" % (t, i)
    commits = store.commit_counts()[0] - commits_before
    assert commits < 1600, "no commit was shared"
    assert head(store, qid) == 1600


def test_failing_op_leaves_nothing_and_fails_only_its_caller(tmp_path, opened, durability):
    store = opened(tmp_path / "d", durability=durability)
    qid = make_queue(store)

    def bad(w):
        w.append(qid, 0, [rec(b"never")])
        raise ValueError("refused")

    for _ in range(20):  # submit bursts so that good and bad ops share a commit
        futs = [store.submit(lambda w: w.append(qid, 0, [rec(b"good")])), store.submit(bad),
                store.submit(lambda w: w.append(qid, 0, [rec(b"good")]))]
        with pytest.raises(ValueError, match="refused"):
            futs[1].result()
        assert futs[0].result() != futs[2].result()
    got = payloads_of(store, qid, 0)
    assert sorted(got) == list(range(40)) and set(got.values()) == {b"good"}
    assert head(store, qid) == 40


# ---------------------------------------------------------------------------- fork
def _in_child(body) -> int:
    """Run ``body()`` in a forked child; return its exit status (its return value, 255 on error)."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 255
        try:
            code = body()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status)
    return os.WEXITSTATUS(status)


def test_store_used_across_fork_raises(tmp_path, opened):
    store = opened(tmp_path / "d")
    qid = make_queue(store)
    append(store, qid, 0, [b"parent"])

    def child():
        code = 0
        for bit, use in ((1, lambda: store.write(lambda w: w.append(qid, 0, [rec(b"child")]))),
                         (2, lambda: store.read().__enter__()),
                         (4, lambda: store.submit(lambda w: w.append(qid, 0, [rec(b"child")])))):
            try:
                use()
            except UsedAcrossFork as exc:
                if "forked child" in str(exc):
                    code |= bit
        store.close()  # a no-op in the child: it must not touch the parent's environment
        return code

    assert _in_child(child) == 7, "1=write, 2=read, 4=submit must raise UsedAcrossFork"
    # The parent's store is unaffected, and the child wrote nothing.
    assert append(store, qid, 0, [b"parent-again"]) == 1
    assert payloads_of(store, qid, 0) == {0: b"parent", 1: b"parent-again"}


def test_forked_child_cannot_reopen_and_is_told_what_to_do(tmp_path, opened):
    """py-lmdb refuses a second environment on files its forked parent had open, so the child
    gets UsedAcrossFork saying to open after forking or to use 'spawn', never CorruptStore."""
    path = tmp_path / "d"
    store = opened(path)
    qid = make_queue(store)
    append(store, qid, 0, [b"parent"])

    def child():
        try:
            Store.open(path)
        except UsedAcrossFork as exc:
            return 0 if "spawn" in str(exc) else 2
        return 1

    assert _in_child(child) == 0
    assert payloads_of(store, qid, 0) == {0: b"parent"}


def test_a_lone_synchronous_write_commits_in_its_callers_thread(tmp_path, opened):
    """A write whose caller waits for it, finding no commit under way and nothing queued, is
    committed in the caller's thread (no hand-off to the writer thread and back); one that
    finds a commit under way is queued and goes in the writer thread's next commit."""
    store = opened(tmp_path / "d", durability="sync")
    qid = make_queue(store)
    committed_in: list[threading.Thread] = []
    store.on_commit(lambda appended: committed_in.append(threading.current_thread()))
    append(store, qid, 0, [b"alone"])
    assert committed_in[-1] is threading.current_thread()
    inside, release = threading.Event(), threading.Event()
    blocked = store.submit(lambda w: (inside.set(), release.wait(30)))   # the writer thread's
    assert inside.wait(30)
    done: list = []
    caller = threading.Thread(target=lambda: done.append(append(store, qid, 0, [b"queued"])))
    caller.start()
    wait_until(lambda: store._writer._pending, 30, "the caller's write to be queued")
    release.set()
    blocked.result()
    caller.join(30)
    assert done and committed_in[-1] not in (caller, threading.current_thread())
    assert payloads_of(store, qid, 0) == {0: b"alone", 1: b"queued"}


def test_a_claimed_commit_goes_before_every_write_submitted_after_the_claim(tmp_path, opened):
    """A caller that must order its write under a lock of its own (the dispatcher's acks)
    claims the next commit under that lock and commits after leaving it: what others submit
    meanwhile queues behind it, and no second claim is granted until it committed. Nor is
    one granted while callers are many (the writer thread's last commit was shared)."""
    store = opened(tmp_path / "d", durability="sync")
    make_queue(store)
    order: list[str] = []
    assert store.claim_commit()
    assert not store.claim_commit()                 # one claim at a time
    later = store.submit(lambda w: order.append("submitted after the claim"))
    queued = threading.Event()
    waiter = threading.Thread(target=lambda: (queued.set(),
                                              store.write(lambda w: order.append("written"))))
    waiter.start()
    assert queued.wait(30)
    wait_until(lambda: len(store._writer._pending) == 2, 30, "both writes queued")
    assert order == []                              # nothing commits ahead of the claim
    claimed = store.commit_claimed(lambda w: order.append("claimed"))
    assert claimed.done()
    later.result()
    waiter.join(30)
    assert order == ["claimed", "submitted after the claim", "written"]
    assert not store.claim_commit()     # idle, but the writer's last commit carried two
    store.write(lambda w: order.append("alone"))    # callers' writes: it takes this one too
    assert order[-1] == "alone"
    assert store.claim_commit()                     # idle again, and the last commit a lone one
    store.commit_claimed(lambda w: None).result()


def test_the_commit_changes_hook_names_the_version_made_and_the_queues_appended_to(tmp_path,
                                                                                   opened):
    """``on_commit_changes``: after each commit of this process, the store version it made
    (what ``version()`` reads until the next commit) and the qids it appended to; a commit
    that appended nothing names none (delivery wakes a queue's receives by it)."""
    store = opened(tmp_path / "d", durability="sync")
    a, b = make_queue(store, "a"), make_queue(store, "b")
    seen: list[tuple[int, frozenset[int]]] = []
    store.on_commit_changes(lambda version, qids: seen.append((version, qids)))
    append(store, a, 0, [b"x"])
    assert seen[-1] == (store.version(), frozenset({a}))
    store.submit(lambda w: (w.append(a, 0, [rec(b"y")]), w.append(b, 0, [rec(b"z")]))).result()
    assert seen[-1] == (store.version(), frozenset({a, b}))
    store.submit(lambda w: w.put_meta(b"x-test", b"1")).result()
    assert seen[-1] == (store.version(), frozenset())
    versions = [v for v, _ in seen]
    assert versions == list(range(versions[0], versions[0] + 3))
