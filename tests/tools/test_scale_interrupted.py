"""Regression tests (operator issue, finding 2): a `partq scale` stopped by a signal or killed
outright must not leave the queue's ingress disabled for good. SIGTERM and SIGHUP end it like
Ctrl-C (ingress restored); SIGKILL leaves a record that `queue show` and `stats` warn about and
that the next run resumes or `--abort` undoes. Every test runs the installed script in a separate
process and signals it for real."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from helpers import wait_until
from tools_helpers import run_script

import partq


def _start_scale(script: str, data: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([script, "--data", data, "scale", "q", "--partitions", "4", "--yes",
                             "--offline", "--allow-discard", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _queue_with_backlog(data: str) -> None:
    """Two partitions with messages and no consumer: step 2 (drain) waits."""
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2)
        broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(20)])


def _ingress(data: str) -> bool:
    with partq.Broker.open(data) as broker:
        return broker.queue_config("q").ingress_enabled


def _at_step_2(data: str) -> bool:
    """The procedure's record says step 2 (drain): ingress off comes a commit before it."""
    with partq.Broker.open(data) as broker:
        procedure = broker.queue_status("q").procedure
        return procedure is not None and procedure["step"] == 2


def _drain(data: str) -> None:
    with partq.Broker.open(data) as broker:
        flow = broker.bind("q")
        while msgs := flow.receive(max_messages=100, timeout=0.2):
            flow.ack_many(msgs)
        flow.unbind()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_stops_scale_with_ingress_restored(partq_script, data, sig):
    _queue_with_backlog(data)
    proc = _start_scale(partq_script, data)
    try:
        wait_until(lambda: _at_step_2(data), timeout=30, what="step 2 (drain) recorded")
        assert not _ingress(data)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert err.splitlines()[-1].startswith("Error: ") and "interrupted at step 2" in err
    assert _ingress(data)
    with partq.Broker.open(data) as broker:
        st = broker.queue_status("q")
        assert st.procedure is None and st.warnings == [] and st.partition_count == 2
        assert not broker.publish("q", b"after", key="k").discarded


def test_a_killed_scale_is_reported_and_resumed(partq_script, data):
    _queue_with_backlog(data)
    proc = _start_scale(partq_script, data)
    wait_until(lambda: _at_step_2(data), timeout=30, what="step 2 (drain) recorded")
    proc.kill()
    proc.wait(timeout=30)
    assert not _ingress(data)
    for args in (["queue", "show", "q"], ["stats"], ["queue", "list"]):
        shown = run_script(partq_script, data, *args)
        assert shown.returncode == 0, shown.stderr
        assert "INTERRUPTED at step 2" in shown.stderr, (args, shown.stderr)
        assert "partq scale q --partitions 4" in shown.stderr
    doc = json.loads(run_script(partq_script, data, "queue", "show", "q", "--json").stdout)
    assert doc["status"]["procedure"]["state"] == "interrupted"
    assert doc["status"]["procedure"]["ingress_before"] is True
    _drain(data)
    resumed = run_script(partq_script, data, "scale", "q", "--partitions", "4", "--yes")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming the procedure interrupted at step 2" in resumed.stdout
    with partq.Broker.open(data) as broker:
        st = broker.queue_status("q")
        assert st.ingress_enabled and st.partition_count == 4 and st.procedure is None


def test_a_scale_killed_inside_the_count_change_is_finished_by_a_rerun(partq_script, data):
    """Killed in step 4 (a crash point inside the scaling), the queue already has the new count
    when the next process opens it: the rerun must not say "nothing to do" and leave ingress
    off, but finish the procedure."""
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2)
    env = {**os.environ, "PARTQ_CRASH_AT": "during_scaling:1"}
    proc = subprocess.run([partq_script, "--data", data, "scale", "q", "--partitions", "4",
                           "--yes", "--offline", "--allow-discard"], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not _ingress(data)
    rerun = run_script(partq_script, data, "scale", "q", "--partitions", "4", "--yes", "--json")
    assert rerun.returncode == 0, rerun.stderr
    steps = [json.loads(line) for line in rerun.stdout.splitlines()]
    assert [s["step"] for s in steps] == [5, 6, 7]
    assert _ingress(data)


def test_abort_undoes_a_killed_scale(partq_script, data):
    _queue_with_backlog(data)
    proc = _start_scale(partq_script, data)
    wait_until(lambda: _at_step_2(data), timeout=30, what="step 2 (drain) recorded")
    proc.kill()
    proc.wait(timeout=30)
    undone = run_script(partq_script, data, "scale", "q", "--abort", "--json")
    assert undone.returncode == 0, undone.stderr
    doc = json.loads(undone.stdout)
    assert doc["aborted"]["to_partitions"] == 4 and doc["ingress_enabled"] is True
    assert _ingress(data)
    again = run_script(partq_script, data, "scale", "q", "--abort")
    assert again.returncode == 1 and "nothing to undo" in again.stderr


def test_a_queue_whose_ingress_was_off_keeps_it_off(partq_script, data):
    with partq.Broker.open(data) as broker:
        broker.create_queue("q", partitions=2, ingress_enabled=False)
    proc = run_script(partq_script, data, "scale", "q", "--partitions", "3", "--yes", "--offline",
                      "--allow-discard")
    assert proc.returncode == 0, proc.stderr
    assert "left off" in proc.stdout
    assert not _ingress(data)


def test_step_one_says_publishes_are_discarded_and_names_the_options(run, broker):
    broker.create_queue("q", partitions=2, reject_msg_to_sender=False)
    result = run("scale", "q", "-p", "3", "--yes", "--offline", "--allow-discard")
    assert result.exit_code == 0, result.output
    assert "DISCARDED" in result.stdout
    assert "--reject-msg-to-sender on --reject-when-shutdown on" in result.stdout
