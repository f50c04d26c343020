"""Runs crash-point cases for ``test_crash_points``: a fork server, so that the ~150 worker and
drain processes do not each pay for starting Python and importing partq.

    python sweep_runner.py BASE_DIR JOBS < cases.json   # prints one JSON result per line

This process imports partq, opens nothing and starts no thread; for each case it forks a worker
child that arms the crash point exactly as ``PARTQ_CRASH_AT=point:N`` would at import, runs
``crash_worker`` and is SIGKILLed by the point (or finishes). Then it forks a drain child (a
fresh process: nothing of the dead worker's LMDB environment is inherited, the parent never had
one), and runs the checker on both logs. Up to JOBS cases run at once.

A case is ``{"id": ..., "point": name, "n": N}``; ``point`` None runs the workload with every
point armed at an unreachable N, to count how often each point is passed (calibration).
"""
from __future__ import annotations

import json
import os
import sys
import time

import checker
import crash_worker
import drain

import partq  # noqa: F401  (imported before forking: the children start warm)
from partq.storage import crashpoints

NEVER = 10 ** 9


def _child(fn, err_path: str) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.dup2(fd, 1)
        code = fn()
    except BaseException:  # reported through the exit status and stderr
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code if isinstance(code, int) else 0)


def start_worker(case: dict, root: str) -> int:
    spec = (f"{case['point']}:{case['n']}" if case["point"]
            else ",".join(f"{p}:{NEVER}" for p in crashpoints.POINTS))

    def run():
        os.environ["PARTQ_CRASH_AT"] = spec
        crashpoints.arm(spec)
        return crash_worker.main(os.path.join(root, "data"), os.path.join(root, "worker.jsonl"))
    return _child(run, os.path.join(root, "worker.err"))


def start_drain(root: str) -> int:
    def run():
        os.environ.pop("PARTQ_CRASH_AT", None)
        crashpoints.arm("")
        return drain.main([os.path.join(root, "data"), os.path.join(root, "drain.jsonl"),
                           "--names", "a,b", "--timeout", "30"])
    return _child(run, os.path.join(root, "drain.err"))


def _status(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-2500:].decode(errors="replace")
    except FileNotFoundError:
        return ""


def finish(case: dict, root: str, worker_rc: int, drain_rc: int, started: float) -> dict:
    result = {"id": case["id"], "point": case["point"], "n": case["n"], "dir": root,
              "worker_rc": worker_rc, "drain_rc": drain_rc,
              "seconds": round(time.monotonic() - started, 3)}
    worker_log = checker.read_log(os.path.join(root, "worker.jsonl"))
    done = [e for e in worker_log if e.get("op") == "done"]
    result["passes"] = done[0]["passes"] if done else None
    if worker_rc not in (0, -9):
        result["worker_err"] = _tail(os.path.join(root, "worker.err"))
    try:
        drain_log = checker.read_log(os.path.join(root, "drain.jsonl"))
    except FileNotFoundError:
        drain_log = []
    result["opened"] = drain_log[0] if drain_log and drain_log[0].get("op") == "opened" else None
    if drain_rc != 0:
        result["drain_err"] = _tail(os.path.join(root, "drain.err"))
        return result
    report = checker.check([worker_log, drain_log])
    result["report"] = report
    result["summary"] = checker.summary(report)
    return result


def main() -> int:
    base, jobs = sys.argv[1], int(sys.argv[2])
    cases = json.load(sys.stdin)
    queue = list(cases)
    running: dict[int, tuple] = {}   # pid -> (stage, case, root, worker_rc, started)
    while queue or running:
        while queue and len(running) < jobs:
            case = queue.pop(0)
            root = os.path.join(base, case["id"])
            os.makedirs(root)
            running[start_worker(case, root)] = ("worker", case, root, None, time.monotonic())
        pid, status = os.waitpid(-1, 0)
        stage, case, root, worker_rc, started = running.pop(pid)
        if stage == "worker":
            running[start_drain(root)] = ("drain", case, root, _status(status), started)
        else:
            print(json.dumps(finish(case, root, worker_rc, _status(status), started)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
