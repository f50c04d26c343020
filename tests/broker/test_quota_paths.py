"""One quota rule for every way messages enter a queue (rule `quota`): a staged job's commit
(keyed rows and unkeyed alike, in this process and through ``partq serve``), ``partq copy-in``
and ``partq dead requeue`` are refused whole with ``QueueFull`` past ``max_depth`` or
``max_bytes``, or discarded whole where the queue discards, exactly as ``publish_many`` is.
Real LMDB directories, a real ``partq serve`` listener on 127.0.0.1, the real ``partq`` command
in subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from broker_helpers import drain
from helpers import run_child

import partq
from partq.jobs.staging import (
    JobCommit,
    abort_job,
    commit_job,
    job_state,
    new_job_id,
    resume_commits,
    stage_rows,
)
from partq.publish.quota import queue_depth, quota_counts

PARTQ_SCRIPT = os.path.join(os.path.dirname(sys.executable), "partq")
TOKEN = "a-quota-test-token-of-32-bytes!!"


def depth(broker: partq.Broker, queue: str) -> int:
    with broker.store.read() as r:
        return queue_depth(r, broker.queue_config(queue).qid)


def counts(broker: partq.Broker, queue: str) -> dict:
    with broker.store.read() as r:
        return quota_counts(r, broker.queue_config(queue).qid)


def rows(n: int, keyed: bool, size: int = 8) -> list[tuple[bytes, str | None]]:
    return [(b"%0*d" % (size, i), f"k{i}" if keyed else None) for i in range(n)]


def staged_job(broker: partq.Broker, items: list, queue: str = "q") -> tuple[str, list]:
    """A job with ``items`` staged by two task attempts; returns (job id, its attempts)."""
    job, half = new_job_id(), len(items) // 2
    assert stage_rows(broker, queue, job, 0, 1, items[:half]) == half
    assert stage_rows(broker, queue, job, 1, 2, items[half:]) == len(items) - half
    return job, [(0, 1, half), (1, 2, len(items) - half)]


def partq_cli(data, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PARTQ_CRASH_AT"}
    return subprocess.run([PARTQ_SCRIPT, "--data", str(data), *map(str, args)],
                          capture_output=True, text=True, timeout=120, env=env)


# ---------------------------------------------------------------------- a staged job's commit
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
def test_a_job_commit_past_max_depth_is_refused_whole_and_stays_open(broker, keyed):
    broker.create_queue("q", partitions=4, max_depth=10)
    job, attempts = staged_job(broker, rows(1_000, keyed))
    with pytest.raises(partq.QueueFull) as info:
        commit_job(broker, "q", job, attempts, slice_rows=100)
    full = info.value
    assert (full.queue, full.limit, full.limit_value, full.now) == ("q", "max_depth", 10, 0)
    assert f"job {job}" in str(full) and "abort" in str(full)
    assert depth(broker, "q") == 0 and broker.queue_status("q").depth == 0
    assert job_state(broker, job) is None            # not begun: its rows stay staged
    assert counts(broker, "q") == {"refused": 1_000, "discarded": 0}
    assert abort_job(broker, job) == 1_000


def test_a_job_that_fits_is_published_and_the_next_one_is_refused(broker):
    broker.create_queue("q", partitions=4, max_depth=10)
    job, attempts = staged_job(broker, rows(10, True))
    assert commit_job(broker, "q", job, attempts) == JobCommit(job, 10, 0)
    late, attempts = staged_job(broker, rows(2, True))
    with pytest.raises(partq.QueueFull) as info:
        commit_job(broker, "q", late, attempts)
    assert info.value.now == 10
    flow = broker.bind("q")
    flow.ack_many(flow.receive(2))
    assert commit_job(broker, "q", late, attempts) == JobCommit(late, 2, 0)   # room again
    assert depth(broker, "q") == 10


def test_a_job_commit_past_max_bytes_is_refused_whole(broker):
    broker.create_queue("q", partitions=4, max_bytes=50_000)
    job, attempts = staged_job(broker, rows(1_000, True, size=100))
    with pytest.raises(partq.QueueFull) as info:
        commit_job(broker, "q", job, attempts)
    assert (info.value.limit, info.value.now) == ("max_bytes", 0)
    assert depth(broker, "q") == 0
    small, attempts = staged_job(broker, rows(100, True, size=100))
    assert commit_job(broker, "q", small, attempts).published == 100


def test_a_queue_that_discards_discards_the_whole_job_and_counts_it(broker):
    broker.create_queue("q", partitions=4, max_depth=10, reject_msg_to_sender=False)
    job, attempts = staged_job(broker, rows(1_000, True))
    assert commit_job(broker, "q", job, attempts) == JobCommit(job, 0, 1_000)
    assert depth(broker, "q") == 0
    assert counts(broker, "q") == {"refused": 0, "discarded": 1_000}
    assert job_state(broker, job)["state"] == "committed"
    assert commit_job(broker, "q", job, attempts).already_committed


PUBLISHER = """
    import sys
    import partq
    with partq.Broker.open(sys.argv[1], create=False) as b:
        b.publish_many("q", [b"other"] * int(sys.argv[2]))
"""


@pytest.mark.timeout(120)
def test_a_slice_past_the_quota_stops_the_commit_which_resume_finishes(broker, data_dir):
    """The job fits when its commit begins; another process fills the queue between two of its
    slices: the next slice is refused whole, the job stays committing with the rest staged, and
    once consumers make room ``resume_commits`` publishes the rest, exactly once."""
    broker.create_queue("q", partitions=4, max_depth=100)
    job, attempts = staged_job(broker, rows(60, True))
    data_commits: list[int] = []

    def fill_after_two_slices(appended: int) -> None:
        if appended:
            data_commits.append(appended)
        if len(data_commits) == 2:      # 20 of the job's rows are in: the other process fills
            broker.store.remove_commit_hook(fill_after_two_slices)
            done = run_child(PUBLISHER, data_dir, 80)
            assert done.returncode == 0, done.stderr
    broker.store.on_commit(fill_after_two_slices)
    with pytest.raises(partq.QueueFull) as info:
        commit_job(broker, "q", job, attempts, slice_rows=10)
    assert info.value.now == 100
    assert "20 of 60 rows" in str(info.value) and "resume_commits" in str(info.value)
    state = job_state(broker, job)
    assert (state["state"], state["rows"]) == ("committing", 20)
    assert depth(broker, "q") == 100
    flow = broker.bind("q")
    got = drain(flow, at_least=100)
    assert len(got) == 100
    [done] = resume_commits(broker, slice_rows=10)
    assert (done.job_id, done.published) == (job, 60)
    assert depth(broker, "q") == 40
    job_rows = [m.payload for m in got if m.payload != b"other"] + \
        [m.payload for m in drain(flow, at_least=40)]
    assert sorted(job_rows) == sorted(p for p, _ in rows(60, True))


# ---------------------------------------------------------------------- through partq serve
@pytest.mark.timeout(60)
def test_a_job_committed_through_partq_serve_obeys_the_quota(broker):
    from partq.remote.server import Server
    from partq.spark.access import RemoteJobs
    from partq.spark.options import Where
    broker.create_queue("q", partitions=4, max_depth=10)
    server = Server(broker, "127.0.0.1:0", token=TOKEN.encode())
    try:
        with RemoteJobs(Where("q", address=server.address, token=TOKEN.encode())) as jobs:
            job = new_job_id()
            stager = jobs.stager(job, 0, 1, 250)
            payloads = [p for p, _ in rows(1_000, True)]
            stager.add_many(payloads, [k for _, k in rows(1_000, True)])
            assert stager.close() == 1_000
            with pytest.raises(partq.QueueFull) as info:
                jobs.commit(job, [(0, 1, 1_000)], 100)
            assert (info.value.queue, info.value.limit, info.value.limit_value,
                    info.value.now) == ("q", "max_depth", 10, 0)
            assert depth(broker, "q") == 0
            assert jobs.abort(job) == 1_000
            fits = new_job_id()
            stager = jobs.stager(fits, 0, 1, 250)
            stager.add_many(payloads[:10], [k for _, k in rows(10, True)])
            assert stager.close() == 10
            assert jobs.commit(fits, [(0, 1, 10)], 100).published == 10
    finally:
        server.close()
    assert depth(broker, "q") == 10


# ---------------------------------------------------------------------- copy-in and requeue
@pytest.mark.timeout(120)
def test_copy_in_past_max_depth_is_refused_and_copies_nothing(tmp_path):
    data, export = tmp_path / "data", tmp_path / "export.jsonl"
    with partq.Broker.open(data) as b:
        b.create_queue("src", partitions=2)
        b.create_queue("dst", partitions=2, max_depth=10, reject_msg_to_sender=False)
        b.publish_many("src", [(b"m%d" % i, f"k{i}") for i in range(1_000)])
    assert partq_cli(data, "copy-out", "src", "--to-file", export).returncode == 0
    done = partq_cli(data, "copy-in", "dst", export)
    assert done.returncode == 1 and "is full: max_depth=10" in done.stderr, done.stderr
    with partq.Broker.open(data, create=False) as b:
        assert depth(b, "dst") == 0                  # refused, even where dst discards
        b.update_queue("dst", max_depth=1_000)
    done = partq_cli(data, "copy-in", "dst", export, "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["published"] == 1_000


@pytest.mark.timeout(120)
def test_requeue_past_max_depth_is_refused_and_leaves_no_interrupted_run(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("dmq", partitions=2)
        b.create_queue("orders", partitions=2, max_depth=10, dead_message_queue="dmq")
        b.publish_many("dmq", [(b"d%d" % i, f"k{i % 3}",
                                {"dead_reason": "rejected", "origin_queue": "orders",
                                 "origin_partition": 0, "origin_seq": i, "delivery_count": 1})
                               for i in range(1_000)])
    done = partq_cli(data, "dead", "requeue", "dmq")
    assert done.returncode == 1 and "is full: max_depth=10" in done.stderr, done.stderr
    with partq.Broker.open(data, create=False) as b:
        assert depth(b, "orders") == 0 and depth(b, "dmq") == 1_000
        b.update_queue("orders", max_depth=500)
    # nothing was published: a requeue with other options is not refused as interrupted
    done = partq_cli(data, "dead", "requeue", "dmq", "--key", "k1", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requeued"] == 333
