"""The names the docs give an operator exist: every `partq ...` command written in README,
docs/ and the commands' own help is a command of the CLI, and every logger docs/operations.md
lists is one the code logs to. A name that drifts sends an operator to something that is not
there (`partq dr standby`, the logger `partq.remote.server`)."""
from __future__ import annotations

import re
from pathlib import Path

from partq.tools import clidoc

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SOURCES = [p for root in ("partq", "storage", "tools", "spark") for p in (REPO / root).rglob("*.py")]
COMMANDS = {path for path, _ in clidoc.commands()}
# `partq` then words, inside backticks: the start of a command line as the docs write it
WRITTEN = re.compile(r"`(partq(?: [a-z][a-z-]*)+)")


def _known(words: list[str]) -> str | None:
    """The command that ``partq WORDS...`` runs, or None when a word names no subcommand."""
    path = "partq"
    for word in words:
        if f"{path} {word}" in COMMANDS:
            path = f"{path} {word}"
        elif any(c.startswith(f"{path} ") for c in COMMANDS):
            return None              # a group, and the word is none of its commands
        else:
            return path              # a command: the rest are its arguments
    return path


def test_every_command_the_docs_and_help_name_exists():
    texts = {str(p.relative_to(REPO)): p.read_text() for p in PAGES}
    texts.update({path: clidoc.help_text(ctx) for path, ctx in clidoc.commands()})
    wrong = []
    for where, text in texts.items():
        for match in WRITTEN.finditer(text.replace("\n", " ")):
            words = re.sub(r"\s+", " ", match.group(1)).split()[1:]
            if _known(words) is None:
                wrong.append(f"{where}: `{match.group(1)}`")
    assert wrong == []


def test_every_logger_operations_md_lists_is_one_the_code_logs_to():
    page = (REPO / "docs" / "operations.md").read_text()
    table = page.split("| logger | lines |", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"`(partq[a-z.]*)`", "\n".join(
        row.split("|")[1] for row in table.splitlines() if row.startswith("| `"))))
    used = set()
    for path in SOURCES:
        used |= set(re.findall(r'getLogger\("(partq[a-z.]*)"\)', path.read_text()))
    assert listed and listed <= used, sorted(listed - used)
