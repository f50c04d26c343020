"""A real ``partq serve --listen 127.0.0.1:0`` subprocess for the tests of administering a host
over the network (``partq.connect``'s queue verbs, ``partq --address``)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

PARTQ_SCRIPT = os.path.join(os.path.dirname(sys.executable), "partq")
TOKEN = "an-admin-test-token-of-32-bytes!"


@dataclass
class Served:
    address: str
    token_file: str
    proc: subprocess.Popen
    log: str = ""           # the server's stderr, once it stopped


@contextlib.contextmanager
def serving(data: str, token: str = TOKEN, *extra: str) -> Iterator[Served]:
    """``partq --data DATA serve --listen 127.0.0.1:0 --token-file F EXTRA``, stopped (SIGTERM)
    at the end; its log is in ``Served.log`` then."""
    token_file = os.path.join(os.path.dirname(os.path.abspath(data)), "serve-token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(token + "\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([PARTQ_SCRIPT, "--data", data, "serve", "--listen", "127.0.0.1:0",
                             "--token-file", token_file, "--json", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    served = None
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            raise AssertionError(f"partq serve did not start: {proc.communicate(timeout=30)}")
        served = Served(json.loads(line)["listen"], token_file, proc)
        yield served
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        if served is not None:
            served.log = err
