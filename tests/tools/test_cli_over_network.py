"""``partq --address HOST:PORT --token-file F``: the commands that read or administer queues,
run through a real ``partq serve`` subprocess on 127.0.0.1, give what they give on ``--data
DIR`` (the server runs the same library calls on its broker), the same one-line errors for a
missing queue, one line for a wrong token, and one line saying so for a command that works on a
directory only."""
from __future__ import annotations

import json

import pytest
import trustme
from serve_process import TOKEN, serving
from tools_helpers import invoke, json_lines, ok, user_error

import partq


@pytest.fixture
def host(data):
    """``(remote, local, served)``: ``remote(*args)`` runs ``partq --address A --token-file F
    ARGS``, ``local(*args)`` runs ``partq --data DATA ARGS``, on the served directory."""
    with serving(data) as served:
        def remote(*args, input: str | None = None):
            return invoke("--address", served.address, "--token-file", served.token_file,
                          *args, input=input)

        def local(*args, input: str | None = None):
            return invoke("--data", data, *args, input=input)
        yield remote, local, served


def test_queue_create_list_show_update_delete(host, data):
    remote, local, served = host
    assert ok(remote("queue", "create", "orders", "--partitions", "3", "--max-redelivery",
                     "2")).stdout == "created queue 'orders' with 3 partitions\n"
    with partq.Broker.open(data) as broker:
        assert broker.queue_config("orders").max_redelivery == 2
    # --address after the command, as --data may be
    shown = json.loads(ok(invoke("queue", "show", "orders", "--json", "--address",
                                 served.address, "--token-file", served.token_file)).stdout)
    assert shown["config"] == json.loads(ok(local("queue", "show", "orders", "--json")).stdout)[
        "config"]
    assert shown["status"]["partition_count"] == 3
    listed = json.loads(ok(remote("queue", "list", "--json")).stdout)["queues"]
    assert [q["name"] for q in listed] == ["orders"] and listed[0]["partitions"] == 3
    text = ok(remote("queue", "update", "orders", "--max-redelivery", "5")).stdout
    assert "updated queue 'orders'" in text and "max_redelivery" in text
    assert json.loads(ok(local("queue", "show", "orders", "--json")).stdout)["config"][
        "max_redelivery"] == 5
    assert ok(remote("queue", "delete", "orders", "--yes")).stdout == "deleted queue 'orders'\n"
    assert ok(local("queue", "list", "--json")).stdout == '{"queues": []}\n'


def test_publish_inspect_consume_stats(host, data):
    remote, local, _ = host
    ok(local("queue", "create", "q", "--partitions", "2"))
    published = ok(remote("publish", "q", "a", "b", "c", "--key", "k", "--ttl", "600",
                          "--json"))
    assert json.loads(published.stdout)["published"] == 3
    seen = json_lines(ok(remote("inspect", "q", "--json")).stdout)
    assert [r["payload"] for r in seen] == ["a", "b", "c"]
    assert seen == json_lines(ok(local("inspect", "q", "--json")).stdout)
    assert json_lines(ok(remote("inspect", "q", "--json", "--limit", "2", "--from-seq",
                                "1")).stdout) == seen[1:3]
    got = json_lines(ok(remote("consume", "q", "--max", "2", "--ack", "--timeout", "20",
                               "--json")).stdout)
    assert [m["payload"] for m in got] == ["a", "b"]
    doc = json.loads(ok(remote("stats", "--json")).stdout)
    assert doc["store"]["path"] == data
    assert [(q["name"], q["depth"]) for q in doc["queues"]] == [("q", 1)]
    assert "(through partq serve at" in ok(remote("stats")).stdout


def test_many_messages_are_browsed_in_parts(host):
    remote, local, _ = host
    ok(local("queue", "create", "q", "--partitions", "2"))
    ok(local("publish", "q", "--batch", "5000", input="".join(f"m{i}\n" for i in range(2500))))
    seen = json_lines(ok(remote("inspect", "q", "--json", "--limit", "0")).stdout)
    assert len(seen) == 2500        # more than one part of 1,000
    assert seen == json_lines(ok(local("inspect", "q", "--json", "--limit", "0")).stdout)
    assert len(json_lines(ok(remote("inspect", "q", "--json", "--limit", "1500")).stdout)) == 1500


def test_message_kill_and_dead_requeue(host, data):
    remote, local, served = host
    ok(local("queue", "create", "jobs", "--dead-message-queue", "jobs.dead"))
    ok(local("queue", "create", "jobs.dead"))
    ok(local("publish", "jobs", "poison", "fine", "third"))
    killed = ok(remote("message", "kill", "jobs", "0", "0", "--yes")).stdout
    assert killed.startswith("killed message 0 of partition 0 of queue 'jobs' (no key, "
                             "delivered 0 times): moved to dead message queue 'jobs.dead'; "
                             "partition 0 unblocked: next is seq 1")
    again = json.loads(ok(remote("message", "kill", "jobs", "0", "0", "--yes", "--json")).stdout)
    assert again["outcome"] == "already_acked"
    acked = json.loads(ok(remote("message", "ack", "jobs", "0", "1", "--yes", "--json")).stdout)
    assert acked["outcome"] == "acked"
    user_error(remote("message", "kill", "jobs", "0", "2"), "not confirmed")
    requeued = json.loads(ok(remote("dead", "requeue", "jobs.dead", "--json")).stdout)
    assert requeued["requeued"] == 1 and requeued["destinations"] == {"jobs": 1}
    with partq.Broker.open(data) as broker:
        assert [r for r in (broker.queue_status("jobs").depth,
                            broker.queue_status("jobs.dead").depth)] == [2, 0]
    served.proc.terminate()
    served.proc.wait(timeout=60)
    log = served.proc.stderr.read() if served.proc.stderr else ""
    for line in ("killed message 0 of partition 0 of queue 'jobs'",
                 "acked message 1 of partition 0 of queue 'jobs'",
                 "requeued 1 message(s) of dead message queue 'jobs.dead'"):
        assert any(line in entry and "client 127.0.0.1" in entry for entry in log.splitlines())


def test_scale_online_over_the_network(host, data):
    remote, local, _ = host
    ok(local("queue", "create", "q", "--partitions", "2"))
    text = ok(remote("scale", "q", "--partitions", "4")).stdout
    assert "queue 'q' scaled from 2 to 4 partitions" in text
    with partq.Broker.open(data) as broker:
        assert broker.queue_config("q").partitions == 4
    assert "already has 4 partitions" in ok(remote("scale", "q", "--partitions", "4")).stdout
    user_error(remote("scale", "q", "--partitions", "2"), "not confirmed")
    user_error(remote("scale", "q", "--partitions", "3", "--offline"), "store's host")


def test_copy_out_into_a_queue_of_the_server(host, data):
    remote, local, _ = host
    ok(local("queue", "create", "src", "--partitions", "2"))
    ok(local("queue", "create", "dst"))
    ok(local("publish", "src", "a", "b", "c"))
    doc = json.loads(ok(remote("copy-out", "src", "--to-queue", "dst", "--json")).stdout)
    assert doc == json.loads(ok(local("copy-out", "src", "--to-queue", "dst", "--json"))
                             .stdout) | {"copied": 3, "partitions": doc["partitions"]}
    assert doc["copied"] == 3 and doc["to_queue"] == "dst"
    again = json.loads(ok(remote("copy-out", "src", "--to-queue", "dst", "--json")).stdout)
    assert again["copied"] == 0                 # resumable: nothing copied twice
    assert "copied 0 messages of queue 'src' to queue 'dst'" in ok(
        remote("copy-out", "src", "--to-queue", "dst")).stdout
    with partq.Broker.open(data) as broker:
        assert broker.queue_status("dst").depth == 3


def test_tls_with_tls_ca(data, tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    with serving(data, TOKEN, "--tls-cert", str(tmp_path / "cert.pem"), "--tls-key",
                 str(tmp_path / "key.pem")) as served:
        base = ("--address", served.address, "--token-file", served.token_file)
        assert ok(invoke(*base, "--tls-ca", tmp_path / "ca.pem", "queue", "create", "q")
                  ).stdout == "created queue 'q' with 1 partition\n"
        assert "q" in ok(invoke(*base, "queue", "list", "--tls-ca", tmp_path / "ca.pem")).stdout


ON_A_MISSING_QUEUE = [("queue", "show", "nope"), ("queue", "update", "nope", "--ingress", "off"),
                      ("queue", "delete", "nope", "--yes"), ("inspect", "nope"),
                      ("publish", "nope", "x"), ("stats", "nope"),
                      ("message", "kill", "nope", "0", "0", "--yes"),
                      ("dead", "requeue", "nope"), ("scale", "nope", "--partitions", "2"),
                      ("copy-out", "nope", "--to-queue", "q")]


def test_a_missing_queue_gives_the_error_it_gives_on_the_directory(host):
    remote, local, _ = host
    ok(local("queue", "create", "q"))
    for args in ON_A_MISSING_QUEUE:
        want = user_error(local(*args), "nope")
        assert user_error(remote(*args)) == want, args


def test_a_wrong_token_an_unreachable_host_and_directory_only_commands(host, tmp_path):
    remote, _, served = host
    wrong = tmp_path / "wrong-token"
    wrong.write_text("a-wrong-token-that-is-long-enough\n")
    wrong.chmod(0o600)
    for args in (("queue", "list"), ("publish", "q", "x"), ("inspect", "q")):
        user_error(invoke("--address", served.address, "--token-file", wrong, *args),
                   "the server refused the token")
    user_error(invoke("--address", "127.0.0.1:1", "queue", "list"), "cannot reach partq serve")
    for args in (("verify",), ("init",), ("copy-in", "q", tmp_path / "x"),
                 ("rebalance", "q", "--dry-run")):
        user_error(remote(*args), "works on a store directory (--data DIR), not over --address")
    user_error(remote("copy-out", "q", "--to-file", tmp_path / "x"), "--to-queue")
    result = invoke("--token-file", wrong, "queue", "list")      # a usage error
    assert result.exit_code == 2 and "--token-file and --tls-ca apply to --address" in result.stderr
