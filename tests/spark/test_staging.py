"""partq.jobs.staging without Spark: stage per attempt, publish exactly once on commit, abort, orphans."""
from __future__ import annotations

import threading

import pytest
from spark_helpers import all_messages, read_queue

import partq
from partq.jobs import staged, staging
from partq.jobs.staging import (
    JobAborted,
    JobFinished,
    StagedRowsMismatch,
    abort_job,
    commit_job,
    list_stages,
    new_job_id,
    orphaned_stages,
    stage_rows,
)


@pytest.fixture
def broker(broker):
    """The shared broker (tests/conftest.py: ``data_dir``, a ManualClock) with queue "q"."""
    broker.create_queue("q", partitions=4, rebalance_delay=0.0)
    return broker


def commits(broker) -> int:
    """Commits this process's group commit made on the broker's store since it opened."""
    return broker.store.commit_counts()[0]


def rows(prefix: str, n: int, keys: int = 5):
    return [(f"{prefix}-{i}".encode(), f"k{i % keys}") for i in range(n)]


def test_staged_rows_are_invisible_until_commit_then_land_by_key(broker, data_dir):
    job = new_job_id()
    assert stage_rows(broker, "q", job, 0, 100, rows("a", 30)) == 30
    assert stage_rows(broker, "q", job, 1, 101, rows("b", 20)) == 20
    flow = broker.bind("q")
    assert flow.receive(100) == []
    assert broker.queue_status("q").depth == 0
    assert all_messages(data_dir, "q") == []

    result = commit_job(broker, "q", job, [(1, 101, 20), (0, 100, 30)])
    assert result == staging.JobCommit(job, 50, 0, already_committed=False)
    got = all_messages(data_dir, "q")
    assert sorted(v for _, _, v in got) == sorted(p for p, _ in rows("a", 30) + rows("b", 20))
    for partition, key, _ in got:
        assert partition == partq.key_partition(key, 4)
    assert list_stages(broker) == []
    assert staging.job_state(broker, job)["state"] == "committed"
    assert staging.job_state(broker, job)["rows"] == 50


def test_commit_keeps_staging_order_per_key_and_task_partition_order(broker, data_dir):
    job = new_job_id()
    # Task partition 1 is staged first but must be published after task partition 0.
    stage_rows(broker, "q", job, 1, 7, [(f"t1-{i}".encode(), "same") for i in range(50)], batch_rows=7)
    stage_rows(broker, "q", job, 0, 3, [(f"t0-{i}".encode(), "same") for i in range(50)], batch_rows=7)
    commit_job(broker, "q", job, [(0, 3), (1, 7)])
    payloads = [v for _, k, v in all_messages(data_dir, "q")]
    assert payloads == [f"t0-{i}".encode() for i in range(50)] + [f"t1-{i}".encode() for i in range(50)]


def test_second_commit_of_a_job_publishes_nothing(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 10))
    first = commit_job(broker, "q", job, [(0, 1, 10)])
    again = commit_job(broker, "q", job, [(0, 1, 10)])
    assert (first.published, first.already_committed) == (10, False)
    assert (again.published, again.already_committed) == (0, True)
    assert len(all_messages(data_dir, "q")) == 10


def test_commit_drops_failed_and_speculative_attempts(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("failed", 10))       # attempt 1 failed
    stage_rows(broker, "q", job, 0, 2, rows("ok0", 10))          # attempt 2 succeeded
    stage_rows(broker, "q", job, 1, 3, rows("ok1", 10))
    stage_rows(broker, "q", job, 1, 4, rows("spec", 10))         # speculative copy, not chosen
    assert {(s.task_partition, s.attempt_id, s.rows) for s in list_stages(broker)} == {
        (0, 1, 10), (0, 2, 10), (1, 3, 10), (1, 4, 10)}
    commit_job(broker, "q", job, [(0, 2, 10), (1, 3, 10)])
    assert sorted(v for _, _, v in all_messages(data_dir, "q")) == sorted(
        p for p, _ in rows("ok0", 10) + rows("ok1", 10))
    assert list_stages(broker) == []


def test_abort_drops_the_job_and_refuses_later_staging_and_commit(broker, data_dir):
    job, other = new_job_id(), new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 25), batch_rows=10)
    stage_rows(broker, "q", job, 1, 2, rows("b", 5))
    stage_rows(broker, "q", other, 0, 9, rows("c", 3))
    assert abort_job(broker, job) == 30
    assert [(s.job_id, s.rows) for s in list_stages(broker)] == [(other, 3)]
    assert staging.job_state(broker, job)["state"] == "aborted"
    with pytest.raises(JobFinished, match="already aborted"):
        stage_rows(broker, "q", job, 2, 3, rows("late", 5))
    with pytest.raises(JobAborted, match="run the job again"):
        commit_job(broker, "q", job, [(0, 1, 25), (1, 2, 5)])
    assert all_messages(data_dir, "q") == []
    assert abort_job(broker, job) == 0     # idempotent


def test_a_late_attempt_cannot_stage_after_commit(broker):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 5))
    commit_job(broker, "q", job, [(0, 1, 5)])
    with pytest.raises(JobFinished, match="already committed"):
        stage_rows(broker, "q", job, 0, 2, rows("zombie", 5))
    assert list_stages(broker) == []
    assert abort_job(broker, job) == 0     # a committed job stays committed
    assert staging.job_state(broker, job)["state"] == "committed"


def test_row_count_mismatch_publishes_nothing(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 10))
    with pytest.raises(StagedRowsMismatch, match="reported 11 rows but 10 are staged"):
        commit_job(broker, "q", job, [(0, 1, 11)])
    assert all_messages(data_dir, "q") == []
    assert [s.rows for s in list_stages(broker)] == [10]
    assert staging.job_state(broker, job) is None


def test_each_batch_is_one_transaction(broker):
    job = new_job_id()
    before = commits(broker)
    stage_rows(broker, "q", job, 0, 1, rows("a", 95), batch_rows=10)
    assert commits(broker) - before == 10
    appended: list[int] = []
    broker.store.on_commit(appended.append)
    try:
        commit_job(broker, "q", job, [(0, 1, 95)], slice_rows=10)
    finally:
        broker.store.remove_commit_hook(appended.append)
    # one short transaction begins the commit, then no transaction moves more than a batch
    assert sum(appended) == 95 and max(appended) <= 10
    assert len([n for n in appended if n]) >= 10


def test_keyed_rows_are_staged_in_their_partition_and_appended_as_they_are(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 40, keys=40))
    with broker.store.read() as r:
        chunks = [staged.decode_chunk(raw, "test") for raw in r.staged(staged.TAG)]
    assert {c.partition_count for c in chunks} == {4}
    for c in chunks:
        assert {(h % 4) for h in c.hashes("test")} == {c.partition}
    commit_job(broker, "q", job, [(0, 1, 40)])
    for partition, key, _ in all_messages(data_dir, "q"):
        assert partition == partq.key_partition(key, 4)


def test_an_interrupted_commit_is_finished_once_by_resume(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 30), batch_rows=5)
    stage_rows(broker, "q", job, 1, 2, rows("b", 30), batch_rows=5)
    stage_rows(broker, "q", job, 1, 3, rows("spec", 7))            # not accepted
    # ingress is turned off with reject after the commit began: the slices stop part way
    stop_after = 2
    hook = []

    def turn_off(appended: int) -> None:
        hook.append(appended)
        if len([n for n in hook if n]) == stop_after:
            broker.store.remove_commit_hook(turn_off)
            threading.Thread(target=broker.update_queue, args=("q",),
                             kwargs={"ingress_enabled": False,
                                     "reject_msg_to_sender_when_shutdown": True}).start()
    broker.store.on_commit(turn_off)
    with pytest.raises(partq.IngressDisabled, match="resume_commits"):
        commit_job(broker, "q", job, [(0, 1, 30), (1, 2, 30)], slice_rows=5)
    state = staging.job_state(broker, job)
    assert state["state"] == "committing" and 0 < state["rows"] < 60
    published = len(all_messages(data_dir, "q"))
    assert published == state["rows"]
    with pytest.raises(JobFinished, match="already committing"):
        stage_rows(broker, "q", job, 2, 4, rows("zombie", 3))
    assert abort_job(broker, job) == 0          # keeps a committing job's rows
    broker.update_queue("q", ingress_enabled=True)
    [done] = staging.resume_commits(broker, slice_rows=5)
    assert (done.job_id, done.published) == (job, 60)
    assert sorted(v for _, _, v in all_messages(data_dir, "q")) == sorted(
        p for p, _ in rows("a", 30) + rows("b", 30))
    assert list_stages(broker) == []
    assert staging.resume_commits(broker) == []
    assert commit_job(broker, "q", job, [(0, 1, 30), (1, 2, 30)]).already_committed


def test_big_payloads_cap_the_staging_transaction_by_bytes(broker, monkeypatch):
    monkeypatch.setattr(staging, "BATCH_BYTES", 1 << 20)
    before = commits(broker)
    big = [(b"x" * 300_000, "k") for _ in range(10)]       # 3 MB in batches of about 1 MB
    stage_rows(broker, "q", new_job_id(), 0, 1, big, batch_rows=1000)
    assert 3 <= commits(broker) - before <= 4


def test_large_rows_span_several_chunks(broker, data_dir):
    job = new_job_id()
    big = [(bytes([i % 256]) * 100_000, f"k{i}") for i in range(12)]    # ~1.2 MB, several chunks
    stage_rows(broker, "q", job, 0, 1, big, batch_rows=1000)
    [stage] = list_stages(broker)
    assert stage.chunks > 1 and stage.rows == 12
    commit_job(broker, "q", job, [(0, 1, 12)])
    assert sorted(v for _, _, v in all_messages(data_dir, "q")) == sorted(p for p, _ in big)


def test_partition_count_is_the_one_seen_at_commit(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 40, keys=40))
    broker.scale("q", 7)
    commit_job(broker, "q", job, [(0, 1, 40)])
    for partition, key, _ in all_messages(data_dir, "q"):
        assert partition == partq.key_partition(key, 7)


def test_unkeyed_rows_and_headers(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, [b"plain", (b"with-headers", None, {"h": "v"})])
    commit_job(broker, "q", job, [(0, 1, 2)])
    got = sorted(v for _, k, v in all_messages(data_dir, "q") if k is None)
    assert got == [b"plain", b"with-headers"]


def test_empty_job_commits(broker, data_dir):
    job = new_job_id()
    assert stage_rows(broker, "q", job, 0, 1, []) == 0
    assert commit_job(broker, "q", job, [(0, 1, 0), (1, 2, 0)]).published == 0
    assert staging.job_state(broker, job)["state"] == "committed"


def test_ingress_rejected_at_commit_keeps_the_stage_for_abort(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 5))
    broker.update_queue("q", ingress_enabled=False, reject_msg_to_sender_when_shutdown=True)
    with pytest.raises(partq.IngressDisabled):
        commit_job(broker, "q", job, [(0, 1, 5)])
    assert [s.rows for s in list_stages(broker)] == [5]
    assert abort_job(broker, job) == 5
    assert all_messages(data_dir, "q") == []


def test_ingress_discarding_counts_the_rows(broker, data_dir):
    job = new_job_id()
    stage_rows(broker, "q", job, 0, 1, rows("a", 5))
    broker.update_queue("q", ingress_enabled=False)
    result = commit_job(broker, "q", job, [(0, 1, 5)])
    assert (result.published, result.discarded) == (0, 5)
    assert broker.queue_status("q").discarded == 5
    assert all_messages(data_dir, "q") == []


def test_bad_input_is_refused_before_anything_is_staged(broker):
    job = new_job_id()
    with pytest.raises(partq.InvalidMessage, match="payload must be bytes"):
        stage_rows(broker, "q", job, 0, 1, [(b"ok", "k"), ("not-bytes", "k")])
    with pytest.raises(partq.InvalidMessage, match="key must be a str"):
        stage_rows(broker, "q", job, 0, 1, [(b"ok", 42)])
    with pytest.raises(partq.QueueNotFound):
        stage_rows(broker, "nope", job, 0, 1, [b"x"])
    with pytest.raises(partq.InvalidConfig, match="32 lowercase hex"):
        stage_rows(broker, "q", "job-1", 0, 1, [b"x"])
    with pytest.raises(partq.InvalidConfig, match="batch_rows"):
        stage_rows(broker, "q", job, 0, 1, [b"x"], batch_rows=0)
    with pytest.raises(partq.InvalidConfig, match="listed twice"):
        commit_job(broker, "q", job, [(0, 1), (0, 2)])
    assert list_stages(broker) == []


def test_orphaned_stages_are_old_or_belong_to_finished_jobs(broker, clock):
    old, fresh = new_job_id(), new_job_id()
    stage_rows(broker, "q", old, 0, 1, rows("old", 3))              # staged at t=1000 s
    clock.advance(7200)
    stage_rows(broker, "q", fresh, 0, 1, rows("fresh", 4))          # staged at t=8200 s
    now_ns = int((1000 + 7200 + 10) * 1e9)
    stages = {s.job_id: s for s in list_stages(broker)}
    assert stages[old].staged_at_ns == int(1000 * 1e9)
    assert stages[old].job_state is None
    assert [s.job_id for s in orphaned_stages(broker, older_than=3600, now_ns=now_ns)] == [old]
    assert orphaned_stages(broker, older_than=1, now_ns=now_ns) != []
    abort_job(broker, old)
    assert orphaned_stages(broker, older_than=3600, now_ns=now_ns) == []
    assert [s.job_id for s in list_stages(broker)] == [fresh]


def test_stages_survive_reopen_and_commit_from_another_broker(broker, data_dir, clock):
    job = new_job_id()
    stage_rows(broker, "q", job, 3, 1, rows("a", 8))
    broker.close()
    with partq.Broker.open(data_dir, clock=clock) as again:
        assert [s.rows for s in list_stages(again)] == [8]
        commit_job(again, "q", job, [(3, 1, 8)])
    assert sum(len(v) for v in read_queue(data_dir, "q").values()) == 8
