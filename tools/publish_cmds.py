"""``partq publish``: publish messages from arguments, or from lines of standard input, as text
or JSON Lines (``partq.ops.message_input``)."""
from __future__ import annotations

import sys

import click

from partq.ops.message_input import (
    INPUT_FORMATS,
    json_items,
    parse_header,
    publish_batches,
    text_items,
)
from partq.tools.common import App, UserError, pass_app, stop_on_signals
from partq.tools.output import Output, output_options


@click.command()
@click.argument("queue")
@click.argument("payloads", metavar="[PAYLOAD]...", nargs=-1)
@click.option("--key", "-k", help="The key of every message (messages of one key keep their "
                                  "order in one partition) [default: none].")
@click.option("--header", "-H", "headers", multiple=True, metavar="NAME=VALUE",
              help="A header of every message (a string value); repeat for more.")
@click.option("--format", "fmt", type=click.Choice(INPUT_FORMATS), default="text",
              show_default=True,
              help="text: each PAYLOAD, or each line of standard input, is a payload. jsonl: "
                   "each is a JSON object with payload (text) or payload_b64, and optionally "
                   "key and headers (they override --key and --header).")
@click.option("--batch", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Messages per commit: a batch is stored whole or not at all.")
@output_options
@pass_app
def publish(app: App, queue: str, payloads: tuple[str, ...], key: str | None,
            headers: tuple[str, ...], fmt: str, batch: int, out: Output) -> None:
    """Publish messages to QUEUE: each PAYLOAD argument, or without any, each line of standard
    input (without its line feed).

    A message published has been stored durably when its batch is reported. Messages the
    queue discards (its ingress is off) are counted, and the command ends with exit status 1.

    \b
    Examples:
      partq publish orders hello world --key customer-42
      seq 1000 | partq publish orders
      partq publish orders --format jsonl < messages.jsonl
    """
    given = dict(parse_header(h) for h in headers) or None
    items_of = json_items if fmt == "jsonl" else text_items
    if payloads:
        lines = [p.encode("utf-8", "surrogateescape") for p in payloads]
        items = items_of(lines, key, given, unit="argument")
    else:
        items = items_of(sys.stdin.buffer, key, given, unit="line")
    with app.broker() as broker, stop_on_signals() as stop:
        report = publish_batches(broker, queue, items, batch, stop=stop.is_set)
    if out.json:
        out.doc(report.as_dict())
    else:
        n = report.published
        ranges = sorted(report.partitions.values(), key=lambda r: r.partition)
        if n == 1:
            out.echo(f"published 1 message to queue {queue!r}: partition {ranges[0].partition}, "
                     f"seq {ranges[0].first_seq}")
        else:
            out.echo(f"published {n} messages to queue {queue!r}"
                     + (f" in {len(ranges)} partition{'s' if len(ranges) != 1 else ''}"
                        if ranges else ""))
            if len(ranges) > 0 and n > 1:
                out.table(["PARTITION", "MESSAGES", "FIRST SEQ", "LAST SEQ"],
                          [[r.partition, r.count, r.first_seq, r.last_seq] for r in ranges],
                          indent="  ")
    if report.discarded:
        raise UserError(f"queue {queue!r} discarded {report.discarded} message"
                        f"{'s' if report.discarded != 1 else ''}: its ingress is off; enable it "
                        f"with `partq queue update {queue} --ingress on` (or have publishes "
                        f"rejected with --reject-when-shutdown on) and publish them again")
    if not report.complete:
        raise UserError(f"publish interrupted after {report.published} messages; the rest of the "
                        f"input was not published")
