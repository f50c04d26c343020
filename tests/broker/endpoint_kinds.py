"""The three places a flow can be bound, for the contract suite of ``partq.flow.FlowEndpoint``
(``test_endpoint_contract.py``). Each kind opens real parts on a fresh directory: a Broker that
creates queues, publishes and reads statuses, and ``bind(queue, name)`` giving a ``Flow`` whose
endpoint is

* ``local``: a ``LocalEndpoint``, bound in the process that owns the queue's delivery;
* ``peer``: a ``PeerFlow``, bound by a second Broker of the same directory (this process, as
  ``test_delivery.py`` does it) while the first Broker owns the queue's delivery (rule
  `peer-flows`);
* ``remote``: a ``RemoteEndpoint``, bound by ``partq.connect`` through a real ``partq serve``
  process listening on 127.0.0.1 (rule `serve`).
"""
from __future__ import annotations

import json
import subprocess

from tools_helpers import PARTQ_SCRIPT

import partq

KINDS = ("local", "peer", "remote")
TOKEN = "a-contract-test-token-32-bytes!!"


class Endpoints:
    """One kind's parts; ``close()`` ends every one of them."""

    def __init__(self, kind: str, tmp_path) -> None:
        self.kind = kind
        self.data = str(tmp_path / "data")
        self.broker = partq.Broker.open(self.data)     # the owner of delivery, but for remote
        self._peer: partq.Broker | None = None
        self._client = None
        self._serve: subprocess.Popen | None = None
        if kind == "peer":
            self._peer = partq.Broker.open(self.data)
        elif kind == "remote":
            token_file = tmp_path / "token"
            token_file.write_text(TOKEN + "\n")
            self._serve = subprocess.Popen(
                [PARTQ_SCRIPT, "--data", self.data, "serve", "--listen", "127.0.0.1:0",
                 "--token-file", str(token_file), "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = self._serve.stdout.readline()
            assert line, f"partq serve exited: {self._serve.communicate(timeout=30)}"
            self._client = partq.connect(json.loads(line)["listen"], token=TOKEN)

    def bind(self, queue: str, name: str | None = None) -> partq.Flow:
        if self.kind == "local":
            return self.broker.bind(queue, name=name)
        if self.kind == "peer":
            assert self._peer is not None
            self.broker.dispatcher.take_over(queue)       # idempotent once it owns it
            flow = self._peer.bind(queue, name=name)
            assert self.broker.dispatcher.owns(queue) and not self._peer.dispatcher.owns(queue)
            return flow
        assert self._client is not None
        return self._client.bind(queue, name=name)

    def binder(self):
        """The broker (or client) whose ``bind`` made this kind's flows: its
        ``transaction()`` takes their messages."""
        if self.kind == "local":
            return self.broker
        return self._peer if self.kind == "peer" else self._client

    def close(self) -> None:
        try:
            if self._client is not None:
                self._client.close()
            if self._peer is not None:
                self._peer.close()
            self.broker.close()
        finally:
            if self._serve is not None:
                self._serve.terminate()
                _, err = self._serve.communicate(timeout=60)
                assert self._serve.returncode == 0, err
