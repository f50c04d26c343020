"""The ``partq`` command: root group, ``main``, and the one place errors become exit status 1.

Exit status: 0 success; 1 a user error (one "Error: ..." line on stderr, no traceback): every
``partq.PartqError``, an ``OSError`` on a file, a failed check; 2 a usage error (click's own:
unknown option, missing argument, a value of the wrong type).
"""
from __future__ import annotations

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
        except Exception as exc:
            error = translate(exc)
            if error is None:
                raise
            raise error from None


CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group("partq", cls=PartqGroup, context_settings=CONTEXT)
@click.option("--data", envvar="PARTQ_DATA", default="partq-data", show_default=True,
              metavar="DIR", help="The partq store directory (also from $PARTQ_DATA).")
@click.version_option(partq.__version__, "--version", prog_name="partq",
                      message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx: click.Context, data: str) -> None:
    """Administer a partq store: queues, messages, scaling, checks.

    Every command takes --json for machine output. Exit status: 0 success, 1 an error (one line
    on stderr saying what to do), 2 a usage error.
    """
    ctx.obj = App(data)


def _register() -> None:
    from partq.tools import (
        copy_cmds,
        dr_cmds,
        inspect_cmds,
        queue_cmds,
        scale_cmds,
        serve_cmds,
        store_cmds,
        verify_cmds,
    )
    for command in (store_cmds.init, queue_cmds.queue, inspect_cmds.inspect, copy_cmds.copy_out,
                    scale_cmds.scale, verify_cmds.verify, store_cmds.stats, store_cmds.demo,
                    dr_cmds.standby, dr_cmds.dr, serve_cmds.serve):
        cli.add_command(command)


_register()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``partq = "partq.tools.cli:main"``)."""
    cli.main(args=argv, prog_name="partq")
