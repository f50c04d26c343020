"""``partq rebalance Q --dry-run``: what the rebalancer would do, changing nothing (rule `rebalance-dry-run`).

The plan is ``Broker.rebalance_plan`` (``partq.core.rebalance_plan``); this module prints it.
"""
from __future__ import annotations

import click

from partq.core.rebalance_plan import MAX_PLAN_FLOWS
from partq.ops.formatting import partition_label
from partq.tools.common import App, pass_app, read_only_option
from partq.tools.output import Output, output_options

WHEN = {"now": "now", "after holddown": "after the holddown",
        "after handoff": "after the handoffs"}


@click.command()
@click.argument("queue")
@click.option("--dry-run", is_flag=True, required=True,
              help="Show the plan and change nothing (the only mode: partq rebalances by itself).")
@click.option("--consumers", type=click.IntRange(min=0, max=MAX_PLAN_FLOWS), metavar="N",
              help=f"As if N consumers were bound (adds new ones or removes the latest bound; "
                   f"at most {MAX_PLAN_FLOWS}).")
@click.option("--add", multiple=True, metavar="NAME", help="As if a consumer NAME bound (repeatable).")
@click.option("--remove", multiple=True, metavar="NAME",
              help="As if the consumer NAME (or flow id) went away (repeatable).")
@read_only_option
@output_options
@pass_app
def rebalance(app: App, queue: str, dry_run: bool, consumers: int | None, add: tuple[str, ...],
              remove: tuple[str, ...], out: Output) -> None:
    """Show what the rebalancer of QUEUE would do now, or for other consumers.

    It works the rebalancer out on a copy of the queue's delivery state, through the holddown
    and the handoffs it would start: which partitions move from which consumer to which, which
    pause and with how many unacked messages, and the counts that result. Nothing changes.
    """
    if consumers is not None and (add or remove):
        raise click.UsageError("pass either --consumers N or --add/--remove, not both")
    with app.reading() as broker:
        plan = broker.rebalance_plan(queue, consumers=consumers, add=add, remove=remove)
    if out.json:
        out.doc(plan)
        return
    change = ", ".join(f"{c['kind']} {c['name']}" for c in plan["changes"]) or "no change"
    out.echo(f"queue {queue}: rebalance {plan['rebalance_status']}, "
             f"delivery owner {plan['delivery_owner'] or 'none'}; dry run with {change}")
    if plan["holddown_seconds"]:
        out.echo(f"  the holddown lasts {plan['holddown_seconds']:g} s; a consumer set that comes "
                 f"back to how it was meanwhile moves nothing")
    out.echo()
    if plan["steps"]:
        out.table(["PARTITION", "ACTION", "WHEN", "FROM", "TO", "UNACKED", "DEPTH"],
                  [[partition_label(s["partition"]), s["action"], WHEN[s["when"]],
                    s["from_name"] or s["from_flow"] or "-", s["to_name"] or s["to_flow"] or "-",
                    s["unacked"], s["depth"]] for s in plan["steps"]], indent="  ")
        handoffs = [s for s in plan["steps"] if s["action"] == "handoff"]
        if handoffs:
            out.echo(f"  handoff: the partition pauses until its consumer acks its unacked "
                     f"messages, at most {plan['max_handoff_time']:g} s")
        for s in handoffs:
            if s["holds_keys"] is not None:
                more = s["holds_key_count"] - len(s["holds_keys"])
                out.echo(f"  under ordering=key partition {partition_label(s['partition'])} "
                         f"flows to its new consumer at once; only its {s['holds_key_count']} "
                         f"key(s) in flight wait: {', '.join(s['holds_keys']) or '-'}"
                         + (f" and {more} more" if more > 0 else ""))
    else:
        out.echo("  nothing moves")
    out.echo()
    out.table(["CONSUMER", "PARTITIONS AFTER", "COUNT"],
              [[(f["name"] or f["flow"]) + (" (new)" if f["new"] else ""),
                " ".join(partition_label(p) for p in f["partitions"]) or "- (standby)",
                len(f["partitions"])] for f in plan["after"]], indent="  ")
    if plan["unassigned"]:
        out.echo(f"  unassigned: {' '.join(partition_label(p) for p in plan['unassigned'])}")
    out.echo(f"  balanced: {'yes' if plan['balanced'] else 'no'}")
