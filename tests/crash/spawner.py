"""A fork server for the random-kill harness: starting Python and importing partq costs far more
than a fork, and the harness restarts hundreds of processes a minute.

    python spawner.py     # one JSON command per line on stdin, one JSON reply per line

Commands:

* ``{"op": "spawn", "script": "publisher", "argv": [...], "crash_at": "point:N" | null,
  "stderr": path}`` -> ``{"pid": P}``. The child is a real process: it arms the crash point as
  ``PARTQ_CRASH_AT`` would at import, points stdin/stdout at /dev/null and stderr at the file,
  and runs ``<script>.main(argv)``.
* ``{"op": "poll"}`` -> ``{"exited": [[P, status], ...]}`` for children that ended since.
* ``{"op": "kill", "pid": P}`` -> ``{"status": S}``: SIGKILL and reap. Only this process reaps
  its children, so a pid it has not reaped is still its child (running or a zombie): a kill can
  never hit an unrelated process that reused the pid.

``status`` is the exit code, or minus the signal number. This process opens no LMDB
environment and starts no thread, so forking it is safe.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback

import consumer
import drain
import publisher
import scaler

import partq  # noqa: F401  (imported before forking: children start warm)
from partq.storage import crashpoints

SCRIPTS = {"publisher": publisher, "consumer": consumer, "scaler": scaler, "drain": drain}


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def spawn(cmd: dict) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(cmd["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        sys.stdin = open(os.devnull)
        spec = cmd.get("crash_at") or ""
        os.environ.pop("PARTQ_CRASH_AT", None)
        if spec:
            os.environ["PARTQ_CRASH_AT"] = spec
        crashpoints.arm(spec)
        code = SCRIPTS[cmd["script"]].main(cmd["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # reported through stderr and the exit status
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0)


def main() -> int:
    live: set[int] = set()
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "spawn":
            pid = spawn(cmd)
            live.add(pid)
            reply = {"pid": pid}
        elif op == "poll":
            exited = []
            while live:
                pid, raw = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                live.discard(pid)
                exited.append([pid, _status(raw)])
            reply = {"exited": exited}
        elif op == "kill":
            pid = cmd["pid"]
            if pid in live:
                os.kill(pid, signal.SIGKILL)
                _, raw = os.waitpid(pid, 0)
                live.discard(pid)
                reply = {"status": _status(raw)}
            else:
                reply = {"status": None}
        else:
            reply = {"error": f"unknown op {op!r}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    for pid in list(live):          # stdin closed: the harness is done or gone
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
