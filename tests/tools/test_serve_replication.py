"""`partq serve --replication-listen` makes a DR primary from the command line (rule
`replication`): a standby that proves the token follows it; the options check each other."""
from __future__ import annotations

import json
import subprocess

import pytest
from helpers import wait_until
from tools_helpers import PARTQ_SCRIPT, usage_error

import partq

TOKEN = "a-replication-test-token-32-bytes"


@pytest.mark.timeout(120)
def test_serve_is_a_dr_primary_a_standby_follows(tmp_path):
    data, token_file = tmp_path / "primary", tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    serve = subprocess.Popen([PARTQ_SCRIPT, "--data", str(data), "serve", "--json",
                              "--replication-listen", "127.0.0.1:0",
                              "--replication-token-file", str(token_file)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    standby = None
    try:
        line = serve.stdout.readline()
        assert line, f"partq serve exited: {serve.communicate(timeout=30)}"
        address = json.loads(line)["replication"]
        assert address.startswith("127.0.0.1:")
        standby = partq.Broker.open(tmp_path / "standby", standby_of=address,
                                    replication_token=TOKEN)
        with partq.Broker.open(data) as writer:      # another process of the primary's host
            writer.create_queue("orders", partitions=2)
            writer.publish_many("orders", [(b"m%d" % i, f"k{i}") for i in range(50)])
        wait_until(lambda: standby.queue_status("orders").depth == 50
                   if "orders" in {c.name for c in standby.queues()} else False,
                   30, "the standby to have every message")
    finally:
        if standby is not None:
            standby.close()
        serve.terminate()
        serve.wait(timeout=30)
    with partq.Broker.open(tmp_path / "standby") as promoted:
        promoted.promote()
        assert promoted.queue_status("orders").depth == 50


def test_replication_options_need_replication_listen(run):
    result = run("serve", "--replication-token-file", "t")
    usage_error(result)
    assert "apply to --replication-listen" in result.output
