"""The tool as users meet it: docs/cli.md is the commands' own help, help speaks to users (no
design-document references), --json follows one rule, --data works before or after the command
and from PARTQ_DATA, and errors name options, not library fields."""
from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from tools_helpers import invoke, json_lines, ok, option_error, usage_error, user_error

import partq
from partq.tools import clidoc
from partq.tools.cli import cli
from partq.tools.common import option_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
PATHS = [path for path, _ in clidoc.commands()]
LEAVES = [path for path, ctx in clidoc.commands() if not isinstance(ctx.command, click.Group)]


# ---------------------------------------------------------------------- docs/cli.md
def test_docs_cli_md_is_the_commands_help():
    current = DOC.read_text()
    assert clidoc.MARK in current, "docs/cli.md lost its generated reference"
    assert clidoc.render(current) == current, (
        "docs/cli.md differs from the commands' --help: run "
        "`python -m partq.tools.clidoc --write docs/cli.md` and review the change")


def test_docs_cli_md_has_every_command_and_its_json_shape():
    current = DOC.read_text()
    for path in PATHS:
        assert f"### `{path}`" in current
    head = current.split(clidoc.MARK)[0]
    for path in LEAVES:
        assert f"| `{path}` |" in head, f"docs/cli.md's --json table lacks `{path}`"


def test_the_reference_is_what_help_prints(tmp_path, monkeypatch, capsys):
    """What `partq ... --help` prints on a terminal of 100 columns or more (not CliRunner,
    which forces 80)."""
    monkeypatch.setenv("COLUMNS", "200")
    for path, ctx in clidoc.commands():
        with pytest.raises(SystemExit) as ended:
            cli.main([*path.split()[1:], "--help"], prog_name="partq")
        assert ended.value.code == 0
        assert capsys.readouterr().out == clidoc.help_text(ctx), path
    page = tmp_path / "cli.md"
    page.write_text("# mine\n\nprose\n")
    assert clidoc.main(["--write", str(page)]) == 0
    written = page.read_text()
    assert written.startswith("# mine\n\nprose\n\n" + clidoc.MARK)
    page.write_text(written.replace("Usage: partq init", "Usage: stale"))
    clidoc.main(["--write", str(page)])
    assert page.read_text() == written


@pytest.mark.parametrize("path", PATHS)
def test_help_is_for_users(path):
    text = ok(invoke(*path.split()[1:], "--help")).stdout
    assert not re.search(r"\bS\d{1,2}\b", text), f"`{path} --help` cites a design rule"
    assert "seed" not in text.lower(), f"`{path} --help` cites a seed document"


# ---------------------------------------------------------------------- --json: one rule
STREAMS = {"partq inspect", "partq consume", "partq scale", "partq standby"}
ELSEWHERE = {"partq demo": "test_tools_queue.py", "partq standby": "test_tools_dr.py",
             "partq serve": "tests/consumers/test_serve.py", "partq dr promote": "test_tools_dr.py",
             "partq dr drop-slot": "tests/replication/test_repl_slots.py",
             "partq dr clear-superseded": "tests/replication/test_repl_supersede_proof.py",
             "partq top": "tests/metrics/test_serve_metrics.py",
             "partq worker": "tests/worker/test_worker_processes.py",
             "partq console": "tests/console/test_console_browser.py"}


def _scenario(run, broker, tmp_path) -> dict[str, list]:
    ok(run("queue", "create", "dmq"))
    ok(run("queue", "create", "q", "-p", "2", "--rebalance-delay", "0", "--dead-message-queue",
           "dmq"))
    ok(run("queue", "create", "gone"))
    ok(run("queue", "create", "empty"))
    results = broker.publish_many("q", [(b"m%d" % i, f"k{i}") for i in range(10)])
    broker.kill_message("q", results[0].partition, results[0].seq)    # a dead message to requeue
    kill, ack = results[1], results[2]
    export = tmp_path / "q.jsonl"
    return {
        "partq init": ["init"],
        "partq queue create": ["queue", "create", "new", "-p", "3"],
        "partq queue list": ["queue", "list"],
        "partq queue show": ["queue", "show", "q"],
        "partq queue update": ["queue", "update", "q", "--max-unacked", "50"],
        "partq queue delete": ["queue", "delete", "gone", "--yes"],
        "partq publish": ["publish", "q", "a", "b"],
        "partq consume": ["consume", "q", "--max", "3", "--timeout", "5"],
        "partq inspect": ["inspect", "q"],
        "partq copy-out": ["copy-out", "q", "--to-file", export],
        "partq copy-in": ["copy-in", "new", export],
        "partq scale": ["scale", "empty", "-p", "3", "--yes"],
        "partq verify": ["verify"],
        "partq stats": ["stats"],
        "partq dr status": ["dr", "status"],
        "partq message kill": ["message", "kill", "q", kill.partition, kill.seq, "--yes"],
        "partq message ack": ["message", "ack", "q", ack.partition, ack.seq, "--yes"],
        "partq dead requeue": ["dead", "requeue", "dmq"],
    }


def test_every_command_prints_one_object_or_json_lines(run, broker, tmp_path):
    scenario = _scenario(run, broker, tmp_path)
    scenario["partq dr slots"] = ["dr", "slots"]
    scenario["partq rebalance"] = ["rebalance", "q", "--dry-run", "--consumers", "2"]
    assert set(LEAVES) <= set(scenario) | set(ELSEWHERE), \
        f"no --json check for {sorted(set(LEAVES) - set(scenario) - set(ELSEWHERE))}"
    for path, args in scenario.items():
        result = ok(run(*args, "--json"))
        if path in STREAMS:
            rows = json_lines(result.stdout)
            assert rows and all(isinstance(r, dict) for r in rows), path
        else:
            assert isinstance(json.loads(result.stdout), dict), f"{path}: not one JSON object"


def test_partitions_is_the_operating_count_everywhere(run, broker):
    created = json.loads(ok(run("queue", "create", "x", "-p", "4", "--access-type", "exclusive",
                                "--json")).stdout)
    assert (created["partitions"], created["configured_partitions"]) == (0, 4)
    listed = json.loads(ok(run("queue", "list", "--json")).stdout)["queues"][0]
    stats = json.loads(ok(run("stats", "--json")).stdout)["queues"][0]
    shown = json.loads(ok(run("queue", "show", "x", "--json")).stdout)
    updated = json.loads(ok(run("queue", "update", "x", "--egress", "off", "--json")).stdout)
    assert listed["partitions"] == stats["partitions"] == shown["status"]["partition_count"] == 0
    assert shown["config"]["partitions"] == updated["config"]["partitions"] == 0
    assert shown["config"]["configured_partitions"] == 4
    changed = json.loads(ok(run("queue", "update", "x", "--access-type", "non-exclusive", "--yes",
                                "--json")).stdout)
    assert (changed["config"]["partitions"], changed["config"]["configured_partitions"]) == (4, 4)
    deleted = json.loads(ok(run("queue", "delete", "x", "--yes", "--json")).stdout)
    assert deleted["partitions"] == 4


def test_scale_json_lines_have_notes_never_note(run, broker):
    ok(run("queue", "create", "q", "-p", "2"))
    steps = json_lines(ok(run("scale", "q", "-p", "3", "--offline", "--allow-discard", "--yes",
                              "--json")).stdout)
    assert [s["step"] for s in steps] == list(range(1, 8))
    for s in steps:
        assert "note" not in s and isinstance(s["notes"], list), s
    assert any("no DR-standby attached" in n for n in steps[2]["notes"])


# ---------------------------------------------------------------------- --data
@pytest.mark.parametrize("path", [p for p in LEAVES if p != "partq demo"])
def test_data_may_follow_every_command(path):
    assert "--data DIR" in ok(invoke(*path.split()[1:], "--help")).stdout


def test_data_after_the_command_and_from_the_environment(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    ok(invoke("init", "--data", a))
    ok(invoke("init", env={"PARTQ_DATA": b}))
    ok(invoke("queue", "create", "in-a", "--data", a))
    ok(invoke("queue", "create", "in-b", env={"PARTQ_DATA": b}))
    ok(invoke("publish", "in-a", "x", "--data", a))

    def names(*args, env=None):
        return [r["name"] for r in json.loads(ok(invoke(*args, env=env)).stdout)["queues"]]
    assert names("queue", "list", "--json", "--data", a) == ["in-a"]
    assert names("queue", "list", "--json", env={"PARTQ_DATA": b}) == ["in-b"]
    # after the command wins over the group's option and over PARTQ_DATA
    assert names("--data", b, "queue", "list", "--data", a, "--json") == ["in-a"]
    assert names("queue", "list", "--json", "--data", a, env={"PARTQ_DATA": b}) == ["in-a"]
    assert names("stats", "--json", "--data", a) == ["in-a"]
    assert json.loads(ok(invoke("verify", "--json", "--data", a)).stdout)["checked"] == 1
    user_error(invoke("queue", "list", "--data", str(tmp_path / "none")), "does not exist")
    usage_error(invoke("queue", "list", "--data"))


# ---------------------------------------------------------------------- errors for users
@pytest.mark.parametrize("message,expected", [
    ("max_delivered_unacked_per_flow must be an integer from 1 to 2147483648, not 0",
     "--max-unacked must be an integer from 1 to 2147483648, not 0"),
    ("partitions must be an integer from 1 to 65536, not 0",
     "--partitions must be an integer from 1 to 65536, not 0"),
    ("queue 'q' has partitions 0 to 3", "queue 'q' has partitions 0 to 3"),
    ("payload of 20 bytes exceeds max_message_size=10 of queue 'q'",
     "payload of 20 bytes exceeds --max-message-size=10 of queue 'q'"),
    ("reject_msg_to_sender_when_shutdown needs reject_msg_to_sender",
     "--reject-when-shutdown needs --reject-msg-to-sender"),
    ("partition_availability_timeout must be a number of seconds >= 0, not -1",
     "--availability-timeout must be a number of seconds >= 0, not -1"),
])
def test_option_names_in_errors(message, expected):
    assert option_names(message) == expected


def test_errors_name_options_in_every_queue_command(run):
    ok(run("queue", "create", "q"))
    line = option_error(run("queue", "update", "q", "--max-unacked", "0"), "--max-unacked must be")
    assert "max_delivered" not in line
    line = option_error(run("queue", "create", "p", "--consumer-timeout", "9999"),
                        "--consumer-timeout must be")
    assert "consumer_timeout" not in line


@pytest.mark.parametrize("name", ["ordérs", "orders\n", "очередь", "", "_x", "a" * 201, "a b"])
def test_queue_names_are_ascii(run, name):
    line = user_error(run("queue", "create", name), "ASCII")
    assert "letters A-Z a-z" in line


def test_stats_shows_live_data_beside_the_high_water_mark(run, broker):
    ok(run("queue", "create", "q"))
    broker.publish_many("q", [b"x" * 1000] * 200)
    text = ok(run("stats")).stdout.splitlines()[0]
    assert re.search(r"file [\d.]+ \w+ \(high-water mark [\d.]+ \w+, live data [\d.]+ \w+\), "
                     r"map [\d.]+ \w+, readers \d+/\d+", text), text
    assert "used_bytes" in ok(run("stats", "--help")).stdout


# ---------------------------------------------------------------------- library items
def test_create_queue_exist_ok(broker):
    first = broker.create_queue("orders", partitions=4, rebalance_delay=1.0)
    again = broker.create_queue("orders", partitions=4, rebalance_delay=1.0, exist_ok=True)
    assert again == first
    # the stored queue wins: an operator may have scaled or changed it since
    other = broker.create_queue("orders", partitions=2, exist_ok=True)
    assert other == first and broker.queue_config("orders").partitions == 4
    with pytest.raises(partq.QueueExists):
        broker.create_queue("orders", partitions=4)
    with pytest.raises(partq.InvalidConfig):              # arguments are checked either way
        broker.create_queue("orders", partitions=0, exist_ok=True)
    assert len(broker.queues()) == 1


def test_queue_create_exist_ok_in_the_cli(run):
    doc = json.loads(ok(run("queue", "create", "q", "-p", "2", "--json")).stdout)
    assert doc["created"] is True
    user_error(run("queue", "create", "q"), "already exists")
    again = json.loads(ok(run("queue", "create", "q", "-p", "5", "--exist-ok", "--json")).stdout)
    assert again["created"] is False and again["partitions"] == 2
    assert "exists already" in ok(run("queue", "create", "q", "--exist-ok")).stdout


@pytest.mark.parametrize("position", [-1, 2 ** 64, 1.5, True, "3", None])
def test_checkpoint_positions_are_checked(broker, position):
    broker.create_queue("q")
    with pytest.raises(partq.InvalidConfig, match="checkpoint position") as raised:
        broker.publish_many("q", [b"x"], checkpoint=("c", position))
    assert "\n" not in str(raised.value)
    assert broker.queue_status("q").depth == 0


def test_checkpoint_edges_are_accepted(broker):
    broker.create_queue("q")
    assert broker.publish_many("q", [b"x"], checkpoint=("c", 0))
    assert broker.publish_many("q", [b"y"], checkpoint=("c", 2 ** 64 - 1))
    assert broker.checkpoint("q", "c") == 2 ** 64 - 1
    assert broker.publish_many("q", [b"z"], checkpoint=("c", 2 ** 64 - 1)) == []
    with pytest.raises(partq.InvalidConfig, match="tuple"):
        broker.publish_many("q", [b"x"], checkpoint=["c", 1])  # type: ignore[arg-type]


def test_no_help_text_in_tools_names_a_design_rule():
    """The source of every command's help: no S-number, no seed, in any string a user sees."""
    import partq.tools as tools_pkg
    tools = Path(tools_pkg.__file__).parent
    for command in _all_commands(cli):
        texts = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
        for text in texts:
            assert not re.search(r"\bS\d{1,2}\b|\bseeds?\b", text), (command.name, text)
    assert tools.is_dir()


def _all_commands(group: click.Group):
    for command in group.commands.values():
        yield command
        if isinstance(command, click.Group):
            yield from _all_commands(command)
