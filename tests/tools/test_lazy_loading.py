"""A command loads what it uses (issue 42): ``partq --version``, ``partq --help``, ``partq
publish`` and ``import partq`` run in fresh processes, which then list the modules they loaded;
none of the heavy ones a publisher or a version check does not need may be among them. The
command table's help sentences are those of the commands themselves."""
from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from partq.tools.cli import cli
from partq.tools.command_table import COMMANDS, load

# what no short command should load: metrics (prometheus_client, http.server), the server, the
# replication listener and follower (hmac, ssl), the delivery dispatcher, scaling, jobs, Spark,
# and crc32c's importlib.metadata version lookup
HEAVY = ["prometheus_client", "http.server", "partq.metrics", "partq.remote.server",
         "partq.replication.primary", "partq.replication.standby", "partq.replication.fencer",
         "partq.wire.listener", "partq.wire.handshake", "hmac", "ssl",
         "partq.delivery.dispatcher", "partq.delivery.queue_delivery", "partq.delivery.peers.link",
         "partq.scaling.count", "partq.scaling.procedure", "partq.jobs.staging", "partq.ops.copy_in",
         "partq.ops.read_only", "partq.status_report", "pyspark", "importlib.metadata", "crc32c"]
# and the command line's own: a command's module loads only when it is named
COMMAND_MODULES = sorted({where.partition(":")[0] for where, _ in COMMANDS.values()})

RUN_CLI = """\
import json, sys
from partq.tools.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
open(sys.argv[1], "w").write(json.dumps(sorted(sys.modules)))
"""


def loaded_by(tmp_path, *args: str, code: str = RUN_CLI) -> set[str]:
    out = tmp_path / "modules.json"
    proc = subprocess.run([sys.executable, "-c", code, str(out), *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(out.read_text()))


def test_version_loads_no_command_and_no_store(tmp_path):
    mods = loaded_by(tmp_path, "--version")
    assert not mods & {*HEAVY, *COMMAND_MODULES, "partq.broker", "lmdb", "msgpack"}, \
        sorted(mods & {*HEAVY, *COMMAND_MODULES, "partq.broker", "lmdb", "msgpack"})


def test_help_lists_every_command_without_loading_one(tmp_path):
    mods = loaded_by(tmp_path, "--help")
    assert not mods & {*HEAVY, *COMMAND_MODULES}, sorted(mods & {*HEAVY, *COMMAND_MODULES})


def test_publish_loads_neither_delivery_nor_replication_nor_metrics(tmp_path):
    data = str(tmp_path / "data")
    for args in (("init",), ("queue", "create", "q", "--partitions", "2")):
        subprocess.run([sys.executable, "-m", "partq.tools", "--data", data, *args],
                       check=True, capture_output=True, timeout=60)
    mods = loaded_by(tmp_path, "--data", data, "publish", "q", "hello", "--key", "k")
    assert "partq.publish.publisher" in mods          # (it did publish)
    others = {m for m in COMMAND_MODULES if m != "partq.tools.publish_cmds"}
    assert not mods & {*HEAVY, *others}, sorted(mods & {*HEAVY, *others})


def test_import_partq_loads_neither_the_broker_nor_the_store(tmp_path):
    code = "import json, sys\nimport partq\nopen(sys.argv[1], 'w').write(json.dumps(sorted(sys.modules)))"
    mods = loaded_by(tmp_path, code=code)
    assert not mods & {*HEAVY, "partq.broker", "partq.storage.store", "lmdb", "msgpack"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_table_says_what_the_command_says(name):
    where, sentence = COMMANDS[name]
    command = load(where)
    assert command.name == name and cli.commands[name] is command
    stub = click.Command(name, help=sentence)
    for limit in (30, 45, 60, 80, 10_000):
        assert stub.get_short_help_str(limit) == command.get_short_help_str(limit), (
            f"COMMANDS[{name!r}] must hold the first sentence of the command's help")


def test_every_command_of_the_group_is_in_the_table():
    assert sorted(cli.commands) == sorted(COMMANDS)
    assert all("--data" in [o for p in c.params for o in getattr(p, "opts", ())]
               for c in (cli.commands["publish"], cli.commands["queue"].commands["list"]))
