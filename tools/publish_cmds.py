"""``partq publish``: publish messages from arguments, or from lines of standard input, as text
or JSON Lines (``partq.ops.message_input``)."""
from __future__ import annotations

import sys

import click

from partq.config import MAX_TTL
from partq.ops.message_input import (
    INPUT_FORMATS,
    json_items,
    parse_header,
    publish_batches,
    text_items,
)
from partq.tools.common import App, Seconds, UserError, pass_app, stop_on_signals
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
@click.option("--ttl", type=Seconds(0, MAX_TTL), metavar="SECONDS",
              help="Time to live of every message: one not delivered within it expires, is "
                   "never delivered, and goes to the queue's dead message queue (the queue's "
                   "--max-ttl bounds it) [default: none].")
@output_options
@pass_app
def publish(app: App, queue: str, payloads: tuple[str, ...], key: str | None,
            headers: tuple[str, ...], fmt: str, batch: int, ttl: float | None,
            out: Output) -> None:
    """Publish messages to QUEUE: each PAYLOAD argument, or without any, each line of standard
    input (without its line feed).

    A message published has been stored durably when its batch is reported. Messages the
    queue discards (its ingress is off, or it is over its --max-depth or --max-bytes quota and
    discards rather than rejects) are counted, and the command ends with exit status 1.

    \b
    Examples:
      partq publish orders hello world --key customer-42
      seq 1000 | partq publish orders
      partq publish orders --format jsonl < messages.jsonl
      partq publish orders --ttl 60 "valid for a minute"
    """
    given = dict(parse_header(h) for h in headers) or None
    items_of = json_items if fmt == "jsonl" else text_items
    if payloads:
        lines = [p.encode("utf-8", "surrogateescape") for p in payloads]
        items = items_of(lines, key, given, unit="argument")
    else:
        items = items_of(sys.stdin.buffer, key, given, unit="line")
    with app.broker(network=True) as broker, stop_on_signals() as stop:
        report = publish_batches(broker, queue, items, batch, stop=stop.is_set, ttl=ttl)
        ingress = broker.queue_config(queue).ingress_enabled if report.discarded else True
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
        what = f"queue {queue!r} discarded {report.discarded} message" + \
            ("s" if report.discarded != 1 else "")
        if not ingress:
            raise UserError(f"{what}: its ingress is off; enable it with `partq queue update "
                            f"{queue} --ingress on` (or have publishes rejected with "
                            f"--reject-when-shutdown on) and publish them again")
        raise UserError(f"{what}: it is over its --max-depth or --max-bytes quota; ack messages "
                        f"or raise the quota (`partq queue update {queue} --max-depth N`), or have "
                        f"publishes refused with --reject-msg-to-sender on, and publish them again")
    if not report.complete:
        raise UserError(f"publish interrupted after {report.published} messages; the rest of the "
                        f"input was not published")
