"""``partq worker`` as real processes on a real directory (and through ``partq serve``): order
per key under concurrency with handlers of random duration, a poison message retried then dead
while its partition's other keys flow, SIGTERM (exit 0, nothing handled twice) and SIGKILL
(nothing lost) in the middle of a run."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

from helpers import drain, wait_until
from worker_procs import (
    STARTED,
    Runs,
    make_queue,
    publish,
    start_worker,
    stderr_of,
    stop,
    write_module,
)

import partq

KEYS = 16


def items(n: int, keys: int = KEYS):
    return [(f"{i}".encode(), f"k{i % keys}") for i in range(n)]


def test_per_key_order_and_no_overlap_under_concurrency(tmp_path):
    data, log = tmp_path / "data", tmp_path / "runs.log"
    write_module(tmp_path)
    make_queue(data, partitions=4)
    publish(data, items(800))
    proc = start_worker(tmp_path, data, log)
    wait_until(lambda: sum(Runs(log).ends.values()) >= 800, 120, "800 handled")
    code, events, err = stop(proc)
    assert code == 0, err
    runs = Runs(log)
    assert runs.overlaps() == []
    for k in range(KEYS):
        order = runs.start_order(f"k{k}")
        assert order == sorted(order) and len(order) == 800 // KEYS
    assert max(runs.ends.values()) == 1
    assert sum(1 for e in events if e["event"] == "handled") == 800
    assert events[-1]["event"] == "stopped" and events[-1]["clean"] is True


def test_a_poison_message_is_retried_then_dead_while_its_partition_flows(tmp_path):
    data, log = tmp_path / "data", tmp_path / "runs.log"
    write_module(tmp_path)
    make_queue(data, partitions=1)
    publish(data, [(b"poison-0", "k0")] + items(200, keys=4))
    proc = start_worker(tmp_path, data, log)
    with partq.Broker.open(data) as b:
        wait_until(lambda: b.queue_status("jobs").depth == 0, 120, "the queue emptied")
        code, events, err = stop(proc)
        assert code == 0, err
        (dead,) = drain(b.bind("jobs.dead"), timeout=1.0, at_least=1)
    runs = Runs(log)
    assert runs.starts["poison-0"] == 3           # retries=2: three runs
    assert all(runs.ends[str(i)] == 1 for i in range(200))
    # the other keys of its partition (k1..k3) did not wait for the poison message's retries
    retry_times = [s for s, _, p in runs.by_key["k0"] if p == "poison-0"]
    assert any(retry_times[0] < s < retry_times[-1] for s, _, _ in runs.by_key["k1"])
    assert dead.headers["exception_type"] == "RuntimeError"
    assert dead.headers["exception_message"] == "cannot do poison-0"
    kinds = [e["event"] for e in events]
    assert kinds.count("retry") == 2 and kinds.count("dead") == 1
    assert "created queue 'jobs.dead'" in err


def test_sigterm_in_the_middle_exits_0_and_nothing_is_handled_twice(tmp_path):
    data, log = tmp_path / "data", tmp_path / "runs.log"
    write_module(tmp_path)
    make_queue(data, partitions=4)
    publish(data, items(400))
    proc = start_worker(tmp_path, data, log, slow=0.05)
    wait_until(lambda: sum(Runs(log).ends.values()) >= 40, 60, "40 handled")
    code, _, err = stop(proc)
    assert code == 0, err
    first = Runs(log)
    assert first.ends and sum(first.ends.values()) < 400
    assert all(first.ends[p] == first.starts[p] for p in first.starts)  # all finished
    proc = start_worker(tmp_path, data, log)
    wait_until(lambda: sum(Runs(log).ends.values()) >= 400, 120, "400 handled")
    code, _, err = stop(proc)
    assert code == 0, err
    runs = Runs(log)
    assert sorted(runs.ends) == sorted(str(i) for i in range(400))
    assert set(runs.ends.values()) == {1}


def test_sigkill_in_the_middle_loses_nothing(tmp_path):
    data, log = tmp_path / "data", tmp_path / "runs.log"
    write_module(tmp_path)
    make_queue(data, partitions=4)
    publish(data, items(400))
    proc = start_worker(tmp_path, data, log, slow=0.02)
    wait_until(lambda: sum(Runs(log).ends.values()) >= 60, 60, "60 handled")
    proc.kill()
    proc.communicate(timeout=30)
    proc = start_worker(tmp_path, data, log)
    wait_until(lambda: all(Runs(log).ends[str(i)] for i in range(400)), 120, "every one handled")
    code, _, err = stop(proc)
    assert code == 0, err
    with partq.Broker.open(data) as b:
        assert b.queue_status("jobs").depth == 0


def test_the_same_through_partq_serve(tmp_path):
    data, log = tmp_path / "data", tmp_path / "runs.log"
    token = tmp_path / "token"
    token.write_text("a-test-token-of-32-bytes-or-so!!\n")
    write_module(tmp_path)
    make_queue(data, partitions=2)
    publish(data, [(b"poison-0", "k0")] + items(300, keys=8))
    serve = subprocess.Popen([sys.executable, "-m", "partq", "--data", str(data), "serve",
                              "--listen", "127.0.0.1:0", "--token-file", str(token), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    STARTED.append(serve)
    try:
        address = json.loads(serve.stdout.readline())["listen"]
        proc = start_worker(tmp_path, None, log, "--address", address, "--token-file",
                            str(token))
        wait_until(lambda: sum(Runs(log).ends.values()) >= 300
                   and Runs(log).starts["poison-0"] == 3, 120, "300 handled, poison thrice")
        client = partq.connect(address, token_file=str(token))
        try:
            wait_until(lambda: client.queue_status("jobs.dead").depth == 1, 30, "one dead")
            code, events, err = stop(proc)
            assert code == 0, err
            (dead,) = drain(client.bind("jobs.dead"), timeout=1.0, at_least=1)
        finally:
            client.close()
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=60)
    runs = Runs(log)
    assert runs.overlaps() == []
    for k in range(8):
        order = runs.start_order(f"k{k}")
        assert order == sorted(order)
    assert set(runs.ends.values()) == {1}
    assert dead.headers["exception_type"] == "RuntimeError"


def test_a_second_signal_stops_at_once_and_the_running_messages_come_back_marked(tmp_path):
    data, log = tmp_path / "data", tmp_path / "runs.log"
    write_module(tmp_path)
    make_queue(data, partitions=1)
    publish(data, items(8, keys=8))
    proc = start_worker(tmp_path, data, log, "--stop-timeout", "60", slow=120)
    wait_until(lambda: sum(Runs(log).starts.values()) == 8, 60, "8 running")
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in stderr_of(proc), 30, "the stop under way")
    code, events, err = stop(proc, timeout=30)       # the second signal
    assert code == 1, err
    assert "stopped before its handlers finished" in err
    assert Runs(log).ends == {}
    with partq.Broker.open(data) as b:
        back = drain(b.bind("jobs"), timeout=1.0, at_least=8)
        assert len(back) == 8 and all(m.redelivered for m in back)
