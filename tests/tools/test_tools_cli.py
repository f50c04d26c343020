"""The shape of the tool: help everywhere, --version, --json everywhere, exit codes, and every bad
input ending as exit 1 with one "Error: ..." line (never a traceback)."""
from __future__ import annotations

import os

import click
import pytest
from tools_helpers import invoke, ok, option_error, run_script, script_user_error, usage_error, user_error

import partq
from partq.config import USER_SETTABLE
from partq.tools import queue_settings
from partq.tools.cli import cli


def _commands(group: click.Group, path=()):
    for name, cmd in sorted(group.commands.items()):
        yield path + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, path + (name,))


ALL = list(_commands(cli))
LEAVES = [(path, cmd) for path, cmd in ALL if not isinstance(cmd, click.Group)]


def test_the_command_set_is_complete():
    names = {" ".join(path) for path, _ in ALL}
    assert {"init", "queue", "queue create", "queue list", "queue show", "queue update",
            "queue delete", "inspect", "copy-out", "scale", "verify", "stats", "demo",
            "publish", "consume", "copy-in"} <= names


@pytest.mark.parametrize("path,cmd", ALL, ids=[" ".join(p) for p, _ in ALL])
def test_every_command_has_help(path, cmd):
    assert (cmd.help or "").strip(), f"`partq {' '.join(path)}` has no help text"
    assert cmd.get_short_help_str().strip()
    for flag in ("-h", "--help"):
        result = ok(invoke(*path, flag))
        assert "Usage: partq " + " ".join(path) in result.stdout
    if not isinstance(cmd, click.Group):
        for param in cmd.params:
            if isinstance(param, click.Option):
                assert param.help, f"option {param.opts} of `partq {' '.join(path)}` has no help"


@pytest.mark.parametrize("path,cmd", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
def test_every_command_has_json(path, cmd):
    assert any("--json" in p.opts for p in cmd.params), f"`partq {' '.join(path)}` lacks --json"


def test_root_help_and_version():
    result = ok(invoke("-h"))
    for name in ("init", "queue", "inspect", "copy-out", "scale", "verify", "stats", "demo"):
        assert name in result.stdout
    assert ok(invoke("--version")).stdout.strip() == f"partq {partq.__version__}"


def test_no_command_prints_usage():
    result = invoke()
    assert result.exit_code in (0, 2)
    assert "Usage:" in result.output


def test_queue_options_cover_every_user_settable_field():
    assert {field for _, field, _, _ in queue_settings.SETTINGS} == set(USER_SETTABLE)


@pytest.mark.parametrize("args", [
    ["nosuchcommand"],
    ["queue", "create"],                              # missing NAME
    ["queue", "create", "q", "--partitions", "x"],    # not an integer
    ["queue", "create", "q", "--ingress", "maybe"],
    ["queue", "create", "q", "--partitioner", "roundrobin"],
    ["queue", "update", "orders"],                    # nothing to update
    ["inspect", "orders", "--payload", "rot13"],
    ["copy-out", "orders"],                           # no destination
    ["copy-out", "orders", "--to-queue", "a", "--to-file", "b"],
    ["scale", "orders"],                              # --partitions is required
    ["queue", "show", "orders", "--bogus"],
])
def test_usage_errors_exit_2(run, args):
    ok(run("queue", "create", "orders", "-p", "2"))
    usage_error(run(*args))


# ---------------------------------------------------------------------- bad inputs: exit 1
@pytest.mark.parametrize("args,fragment", [
    (["queue", "show", "nope"], "no queue named 'nope'"),
    (["queue", "update", "nope", "--ingress", "off"], "no queue named 'nope'"),
    (["queue", "delete", "nope", "--yes"], "no queue named 'nope'"),
    (["inspect", "nope"], "no queue named 'nope'"),
    (["copy-out", "nope", "--to-queue", "orders"], "no queue named 'nope'"),
    (["scale", "nope", "--partitions", "2", "--yes"], "no queue named 'nope'"),
    (["verify", "nope"], "no queue named 'nope'"),
    (["stats", "nope"], "no queue named 'nope'"),
    (["queue", "create", "orders"], "already exists"),
    (["queue", "create", "bad name!"], "queue name"),
    (["queue", "create", "ordérs"], "ASCII"),
    (["queue", "create", "orders\n"], "ASCII"),
    (["publish", "orders", "x" * 2000, "--key", "k" * 2000], "--max-key-size"),
    (["publish", "nope", "x"], "no queue named 'nope'"),
    (["consume", "nope", "--timeout", "0"], "no queue named 'nope'"),
    (["copy-in", "nope", "x.jsonl"], "no queue named 'nope'"),
    (["copy-in", "orders", "missing.jsonl"], "No such file or directory"),
    (["publish", "orders", "--header", "novalue", "x"], "NAME=VALUE"),
    (["publish", "orders", "--format", "jsonl", "{}"], "argument 1"),
    (["publish", "orders", "--format", "jsonl", "not json"], "argument 1: not JSON"),
    (["scale", "orders", "--partitions", "1"], "pass --yes"),     # a scale-down asks
    (["queue", "delete", "orders"], "pass --yes"),
    (["inspect", "orders", "--partition", "2"], "partitions 0 to 1"),
    (["inspect", "orders", "--partition", "-1"], "partitions 0 to 1"),
    (["copy-out", "orders", "--to-queue", "missing"], "no queue named 'missing'"),
    (["copy-out", "orders", "--to-file", "x.jsonl", "--partition", "7"], "partitions 0 to 1"),
])
def test_bad_input_is_one_line_and_exit_1(run, args, fragment):
    ok(run("queue", "create", "orders", "-p", "2"))
    user_error(run(*args), fragment)


# ------------------------------------------------------------- bad option values: exit 2, one line
@pytest.mark.parametrize("args,fragment", [
    (["queue", "create", "q", "--partitions", "0"], "partitions must be an integer from 1"),
    (["queue", "create", "q", "--partitions", "-3"], "partitions must be an integer from 1"),
    (["queue", "create", "q", "--partitions", "70000"], "partitions must be an integer from 1"),
    (["queue", "create", "q", "--rebalance-delay", "-1"], "--rebalance-delay must be"),
    (["queue", "create", "q", "--max-unacked", "0"], "--max-unacked must be"),
    (["queue", "update", "orders", "--max-handoff-time", "nan"], "--max-handoff-time must be"),
    (["queue", "create", "q", "--consumer-timeout", "0"], "--consumer-timeout must be"),
    (["queue", "create", "q", "--max-key-size", "0"], "--max-key-size must be"),
    (["queue", "create", "q", "--sticky-batch-size", "0"], "--sticky-batch-size must be"),
    (["queue", "create", "q", "--availability-timeout", "-1"], "--availability-timeout must be"),
    (["queue", "create", "q", "--max-message-size", "0"], "--max-message-size must be"),
    (["scale", "orders", "--partitions", "0", "--yes"], "partitions must be an integer from 1"),
    (["scale", "orders", "--partitions", "-1", "--yes"], "partitions must be an integer from 1"),
    (["scale", "orders", "--partitions", "4", "--yes", "--drain-timeout", "-1"], "--drain-timeout"),
    (["inspect", "orders", "--limit", "-1"], "--limit"),
    (["inspect", "orders", "--from-seq", "5", "--to-seq", "2"], "--to-seq"),
    (["copy-out", "orders", "--to-file", "x.jsonl", "--batch", "0"], "--batch"),
    (["copy-out", "orders", "--to-queue", "orders"], "another queue"),
])
def test_a_bad_option_value_is_one_line_and_exit_2(run, args, fragment):
    """One rule for bad numbers: a value an option refuses on its own (negative, zero where one
    is needed, not finite, past its limit) is a usage error, as click's own checks make it
    (``--max -1``); an error about the store's state (no such queue or partition) exits 1."""
    ok(run("queue", "create", "orders", "-p", "2"))
    option_error(run(*args), fragment)


def test_failed_scale_validation_leaves_ingress_alone(run, broker):
    ok(run("queue", "create", "orders", "-p", "2"))
    assert run("scale", "orders", "-p", "0", "--yes").exit_code == 2
    assert broker.queue_config("orders").ingress_enabled


@pytest.mark.parametrize("command", [["queue", "list"], ["inspect", "q"], ["verify"], ["stats"],
                                     ["queue", "create", "q"], ["copy-out", "q", "--to-file", "f"],
                                     ["scale", "q", "-p", "2", "--yes"]])
@pytest.mark.parametrize("kind", ["missing", "empty", "file", "other-files", "not-lmdb"])
def test_not_a_store_is_one_line_and_exit_1(tmp_path, command, kind):
    path = tmp_path / "d"
    if kind == "empty":
        path.mkdir()
    elif kind == "file":
        path.write_text("hello")
    elif kind == "other-files":
        path.mkdir()
        (path / "notes.txt").write_text("mine")
    elif kind == "not-lmdb":
        path.mkdir()
        (path / "data.mdb").write_bytes(b"not an lmdb file at all" * 1000)
    user_error(invoke("--data", path, *command))
    # and nothing was created where there was no store
    if kind == "missing":
        assert not path.exists()
    if kind == "empty":
        assert os.listdir(path) == []


def test_init_refuses_a_directory_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    user_error(invoke("--data", tmp_path, "init"), "no partq store")


def test_data_from_environment(tmp_path):
    path = str(tmp_path / "envstore")
    ok(invoke("init", env={"PARTQ_DATA": path}))
    ok(invoke("queue", "create", "q", env={"PARTQ_DATA": path}))
    assert "q" in ok(invoke("--data", path, "queue", "list")).stdout


def test_errors_in_a_real_process(partq_script, tmp_path):
    """The installed script: exit codes and one-line errors without CliRunner in between."""
    data = str(tmp_path / "data")
    missing = run_script(partq_script, data, "queue", "list")
    script_user_error(missing, "does not exist", "partq --data")
    assert run_script(partq_script, data, "init").returncode == 0
    script_user_error(run_script(partq_script, data, "inspect", "nope"), "no queue named 'nope'")
    script_user_error(run_script(partq_script, data, "queue", "create", "q", "-p", "0"), status=2)
    usage = run_script(partq_script, data, "queue", "create")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
    version = run_script(partq_script, data, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"partq {partq.__version__}"
