"""docs/cli.md's command reference, generated from the commands' own ``--help``, so the two
cannot drift apart (a test compares them).

The page keeps what people wrote above the ``MARK`` line (the rules: --data, exit status,
--json shapes, read-only access); everything below it is the help of every command, rendered at
a fixed width. After changing a command's help, regenerate it:

    python -m partq.tools.clidoc --write docs/cli.md
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

from partq.tools.cli import CONTEXT, cli

MARK = "<!-- The reference below is generated: python -m partq.tools.clidoc --write docs/cli.md -->"
# what --help prints on a terminal of 100 columns or more: click leaves 2 of the 100 unused
WIDTH = CONTEXT["max_content_width"] - 2


def commands(group: click.Group = cli, path: tuple[str, ...] = ("partq",),
             parent: click.Context | None = None) -> Iterator[tuple[str, click.Context]]:
    """``(command path, context)`` of the root and every command below it, in help order."""
    ctx = click.Context(group, info_name=path[-1], parent=parent, terminal_width=WIDTH,
                        max_content_width=WIDTH,
                        help_option_names=CONTEXT["help_option_names"])
    yield " ".join(path), ctx
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name), ctx)
        else:
            yield " ".join((*path, name)), click.Context(command, info_name=name, parent=ctx)


def help_text(ctx: click.Context) -> str:
    """What ``--help`` prints for the command of ``ctx``, at ``WIDTH`` columns."""
    return ctx.get_help().rstrip() + "\n"


def reference() -> str:
    """The generated part of docs/cli.md: one section per command with its help."""
    parts = [MARK, "", "## Command reference", ""]
    for path, ctx in commands():
        parts += [f"### `{path}`", "", "```text", help_text(ctx).rstrip(), "```", ""]
    return "\n".join(parts)


def render(current: str) -> str:
    """docs/cli.md with its reference regenerated: the text above ``MARK`` kept as it is."""
    head = current.split(MARK, 1)[0].rstrip() + "\n\n" if MARK in current else current.rstrip() + "\n\n"
    return head + reference()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--write":
        page = Path(args[1])
        page.write_text(render(page.read_text() if page.exists() else ""))
        return 0
    if not args:
        sys.stdout.write(reference())
        return 0
    sys.stderr.write("usage: python -m partq.tools.clidoc [--write docs/cli.md]\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
