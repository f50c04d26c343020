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
from partq.tools.command_table import COMMANDS, LazyCommands


class PartqGroup(click.Group):
    """A group whose commands' library and OS errors end as one line and exit status 1, and
    whose commands load when named (``command_table``)."""

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
            from partq.tools.common import translate
            error = translate(exc)
            if error is None:
                raise
            raise error from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of commands, with the help of each command not loaded yet taken from
        ``COMMANDS`` rather than by importing it."""
        commands = self.commands
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            command = commands.loaded(name) if isinstance(commands, LazyCommands) else None
            if command is None and name in COMMANDS:
                command = click.Command(name, help=COMMANDS[name][1])
            command = command or self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in rows])


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


DATA_HELP = "The partq store directory (also from $PARTQ_DATA)."
ADDRESS_HELP = ("Work through the `partq serve --listen` at HOST:PORT instead of on --data DIR "
                "(the commands that read or administer queues).")
TOKEN_FILE_HELP = "With --address: a file whose first line is the server's token."
TLS_CA_HELP = "With --address: speak TLS, trusting this CA file (PEM)."
REMOTE_OPTIONS = (("--address", "address", ADDRESS_HELP, None),
                  ("--token-file", "token_file", TOKEN_FILE_HELP, click.Path(dir_okay=False)),
                  ("--tls-ca", "tls_ca", TLS_CA_HELP, click.Path(dir_okay=False)))


def _add_data_options(command: click.Command) -> None:
    """``--data DIR`` on every command below the root (see ``_add_data_option``)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_data_options(sub)
    else:
        _add_data_option(command)


@click.group("partq", cls=PartqGroup, context_settings=CONTEXT,
             commands=LazyCommands(COMMANDS, _add_data_options))
@click.option("--data", envvar="PARTQ_DATA", default="partq-data", show_default=True,
              metavar="DIR", help=DATA_HELP)
@click.option("--address", metavar="HOST:PORT", expose_value=False,
              callback=lambda ctx, param, value: _set_remote(ctx, "address", value),
              help=ADDRESS_HELP)
@click.option("--token-file", type=click.Path(dir_okay=False), expose_value=False,
              callback=lambda ctx, param, value: _set_remote(ctx, "token_file", value),
              help=TOKEN_FILE_HELP)
@click.option("--tls-ca", type=click.Path(dir_okay=False), expose_value=False,
              callback=lambda ctx, param, value: _set_remote(ctx, "tls_ca", value),
              help=TLS_CA_HELP)
@click.version_option(partq.__version__, "--version", prog_name="partq",
                      message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, data: str) -> None:
    """Administer a partq store: queues, messages, scaling, checks; run workers.

    --data DIR (or $PARTQ_DATA) names the store; it may also follow the command (partq queue
    list --data DIR). --address HOST:PORT (with --token-file F and --tls-ca F) works through a
    `partq serve --listen` instead, on another host: queue, publish, consume, inspect, stats,
    message, dead requeue, scale (online), copy-out --to-queue and top; the commands that need
    the directory itself say so. Every command takes --json for machine output: one JSON object, or one
    object per line for the commands that stream (inspect, consume, scale, standby, worker). Exit
    status: 0 success, 1 an error (one line on stderr saying what to do), 2 a usage error (an
    unknown option, a missing argument, or a value an option refuses on its own: --partitions
    0, --max -1, --ttl nan).
    """
    from partq.tools.common import App
    app = ctx.ensure_object(App)
    app.data = data
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
    from partq.tools.common import App
    if value is not None:
        ctx.ensure_object(App).data = value


def _set_remote(ctx: click.Context, field: str, value: str | None) -> None:
    from partq.tools.common import App
    if value is not None:
        setattr(ctx.ensure_object(App), field, value)


def _add_data_option(command: click.Command) -> None:
    """``--data DIR`` after the command too (``partq queue list --data DIR``): the same setting
    as the group's, which it overrides. A command with a --data of its own (demo) keeps it.
    Likewise ``--address``, ``--token-file`` and ``--tls-ca``, on the commands that have none
    of them (``serve``, ``top`` and the ``dr`` commands have their own)."""
    names = {o for p in command.params for o in getattr(p, "opts", ())}
    if "--data" not in names:
        command.params.append(click.Option(["--data"], metavar="DIR", expose_value=False,
                                           callback=_set_data, help=DATA_HELP))
    if names.isdisjoint(opt for opt, _, _, _ in REMOTE_OPTIONS):
        for opt, field, text, kind in REMOTE_OPTIONS:
            command.params.append(click.Option(
                [opt], type=kind, metavar="HOST:PORT" if kind is None else None,
                expose_value=False, help=text,
                callback=lambda ctx, param, value, field=field: _set_remote(ctx, field, value)))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``partq = "partq.tools.cli:main"``)."""
    cli.main(args=argv, prog_name="partq")
