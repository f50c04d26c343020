"""The ``partq`` commands by name, loaded when a command line names them: ``partq --version``,
``partq --help`` and ``partq publish`` import only what they use (a command's module imports
the library rooms it needs: ``serve`` the server, ``top`` the metrics, ``scale`` scaling).

``COMMANDS`` maps each name to where the command lives and the first sentence of its help,
which is what ``partq --help`` lists beside the name (click shortens it to the terminal as it
does a loaded command's help); tests/tools/test_lazy_commands.py checks each sentence against
the command's own help.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, MutableMapping

import click

COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("partq.tools.store_cmds:init",
             "Create the store in --data DIR (reports whether it was already there)."),
    "queue": ("partq.tools.queue_cmds:queue", "Create, list, show, update and delete queues."),
    "publish": ("partq.tools.publish_cmds:publish",
                "Publish messages to QUEUE: each PAYLOAD argument, or without any, each line of "
                "standard input (without its line feed)."),
    "consume": ("partq.tools.consume_cmds:consume",
                "Receive messages of QUEUE as one more consumer and print them, one per line."),
    "inspect": ("partq.tools.inspect_cmds:inspect",
                "Browse the messages of QUEUE without consuming them (acked ones still stored "
                "included)."),
    "copy-out": ("partq.tools.copy_cmds:copy_out",
                 "Copy the unacked messages of QUEUE to --to-queue DEST or --to-file PATH."),
    "copy-in": ("partq.tools.copy_cmds:copy_in",
                "Publish the messages of FILE, an export `partq copy-out --to-file` wrote, into "
                "QUEUE."),
    "message": ("partq.tools.dead_cmds:message",
                "Kill or ack one message by its position: unblock a partition held by a message "
                "nobody can process."),
    "dead": ("partq.tools.dead_cmds:dead",
             "Send the messages of a dead message queue back to be processed again."),
    "scale": ("partq.tools.scale_cmds:scale",
              "Change the partition count of QUEUE, online unless --offline."),
    "rebalance": ("partq.tools.rebalance_cmds:rebalance",
                  "Show what the rebalancer of QUEUE would do now, or for other consumers."),
    "verify": ("partq.tools.verify_cmds:verify",
               "Check the store's pages and every stored record of QUEUE (default: every "
               "queue)."),
    "stats": ("partq.tools.store_cmds:stats",
              "Per-queue depth, discards, dead messages, quota refusals, statuses and flows, and "
              "the store's sizes."),
    "demo": ("partq.tools.store_cmds:demo",
             "Run a short story (7 partitions, 4 consumers, a graceful handoff) in a fresh "
             "store."),
    "standby": ("partq.tools.dr_cmds:standby",
                "Run a DR-standby of PRIMARY in --data DIR until SIGTERM or Ctrl-C."),
    "dr": ("partq.tools.dr_cmds:dr",
           "DR-standby replication: status, promotion and the primary's replication slots."),
    "serve": ("partq.tools.serve_cmds:serve",
              "Run delivery (and, with --listen, publishing) of every queue in --data DIR until "
              "SIGTERM or Ctrl-C."),
    "worker": ("partq.tools.worker_cmds:worker",
               "Run the handlers of the partq.Worker MODULE:ATTR (say, tasks:worker) until "
               "SIGTERM or Ctrl-C."),
    "console": ("partq.tools.console_cmds:console",
                "Serve a web console of --data DIR on --listen until SIGTERM or Ctrl-C: every "
                "queue with its depth, bytes, rates (a chart of the last minutes) and dead "
                "messages; a queue's partitions, flows, what blocks a partition and the "
                "rebalance dry-run; its messages."),
    "top": ("partq.tools.top_cmds:top",
            "A live view of QUEUES (default: every queue), refreshed every second: queues, "
            "partitions (depth, status, owning flow), flows (process, unacked, ack rate) and "
            "replication, with publish and ack rates between refreshes; dead messages by "
            "reason, partitions waiting out a nack's delay and publishes the quota refused or "
            "discarded, of the queues that have any."),
}


def load(where: str) -> click.Command:
    """The command at ``"module:attr"``."""
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr)


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands (``click.Group.commands``), each imported at its first lookup and
    then passed to ``prepare`` (which may add options); iterating lists the names without
    importing anything. Commands added later (``add_command``) are kept as given."""

    def __init__(self, table: dict[str, tuple[str, str]],
                 prepare: Callable[[click.Command], None]) -> None:
        self._where = {name: where for name, (where, _) in table.items()}
        self._loaded: dict[str, click.Command] = {}
        self._prepare = prepare

    def loaded(self, name: str) -> click.Command | None:
        """The command ``name`` if it is loaded already (None: not yet, or no such command)."""
        return self._loaded.get(name)

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            command = load(self._where[name])       # (KeyError: no such command)
            self._prepare(command)
            self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._where.setdefault(name, "")
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._where[name]
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where
