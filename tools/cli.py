"""The ``partq`` command: root group, ``main``, and the one place errors become exit status 1.

Exit status: 0 success; 1 a user error (one "Error: ..." line on stderr, no traceback): every
``partq.PartqError``, an ``OSError`` on a file, a failed check; 2 a usage error (click's own:
unknown option, missing argument, a value of the wrong type).
"""
from __future__ import annotations

import logging
import os
import sys

import click

import partq
from partq.tools.common import App, translate


class PartqGroup(click.Group):
    """A group whose commands' library and OS errors end as one line and exit status 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except BrokenPipeError:
            # the reader of our output stopped (`partq copy-out ... | head`): a normal end.
            # Point stdout at /dev/null so the flush at exit does not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise click.exceptions.Exit(0) from None
        except Exception as exc:
            error = translate(exc)
            if error is None:
                raise
            raise error from None


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


DATA_HELP = "The partq store directory (also from $PARTQ_DATA)."


@click.group("partq", cls=PartqGroup, context_settings=CONTEXT)
@click.option("--data", envvar="PARTQ_DATA", default="partq-data", show_default=True,
              metavar="DIR", help=DATA_HELP)
@click.version_option(partq.__version__, "--version", prog_name="partq",
                      message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, data: str) -> None:
    """Administer a partq store: queues, messages, scaling, checks; run workers.

    --data DIR (or $PARTQ_DATA) names the store; it may also follow the command (partq queue
    list --data DIR). Every command takes --json for machine output: one JSON object, or one
    object per line for the commands that stream (inspect, consume, scale, standby, worker). Exit
    status: 0 success, 1 an error (one line on stderr saying what to do), 2 a usage error (an
    unknown option, a missing argument, or a value an option refuses on its own: --partitions
    0, --max -1, --ttl nan).
    """
    ctx.obj = App(data)
    show_warnings()


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as Python's last-resort
    handler does), so a command run in-process under a swapped stderr still shows them."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def show_warnings() -> None:
    """The library's warnings on stderr, as plain lines (``partq serve`` sets its own format);
    the library itself only has a NullHandler."""
    root = logging.getLogger("partq")
    if not any(isinstance(h, logging.StreamHandler) for h in root.handlers):
        handler = _Stderr()
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)


def _set_data(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(App).data = value


def _leaves(group: click.Group):
    for command in group.commands.values():
        if isinstance(command, click.Group):
            yield from _leaves(command)
        else:
            yield command


def _add_data_option(command: click.Command) -> None:
    """``--data DIR`` after the command too (``partq queue list --data DIR``): the same setting
    as the group's, which it overrides. A command with a --data of its own (demo) keeps it."""
    if any("--data" in getattr(p, "opts", ()) for p in command.params):
        return
    command.params.append(click.Option(["--data"], metavar="DIR", expose_value=False,
                                       callback=_set_data, help=DATA_HELP))


def _register() -> None:
    from partq.tools import (
        consume_cmds,
        copy_cmds,
        dead_cmds,
        dr_cmds,
        inspect_cmds,
        publish_cmds,
        queue_cmds,
        rebalance_cmds,
        scale_cmds,
        serve_cmds,
        store_cmds,
        top_cmds,
        verify_cmds,
        worker_cmds,
    )
    for command in (store_cmds.init, queue_cmds.queue, publish_cmds.publish,
                    consume_cmds.consume, inspect_cmds.inspect, copy_cmds.copy_out,
                    copy_cmds.copy_in, dead_cmds.message, dead_cmds.dead, scale_cmds.scale,
                    rebalance_cmds.rebalance, verify_cmds.verify, store_cmds.stats,
                    store_cmds.demo, dr_cmds.standby, dr_cmds.dr, serve_cmds.serve,
                    top_cmds.top, worker_cmds.worker):
        cli.add_command(command)
    for command in _leaves(cli):
        _add_data_option(command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``partq = "partq.tools.cli:main"``)."""
    cli.main(args=argv, prog_name="partq")
