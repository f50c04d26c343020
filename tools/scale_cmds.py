"""``partq scale``: change a queue's partition count, online (the default: ingress stays on, per-key
order kept, nothing published lost) or by the seven-step offline procedure, printed step by
step.

The procedure itself is ``partq.scaling``; this module prints it (lines, or one JSON object per
step with --json). SIGINT, SIGTERM and SIGHUP stop it between steps or while a step waits, with
ingress restored; a run that is killed outright leaves its record, which the next run resumes
(or ``--abort`` undoes).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import click

from partq import scaling
from partq.storage.encoding import unpack_u64
from partq.storage.txn import QUEUE_REMOVED
from partq.tools.common import (
    App,
    Seconds,
    UserError,
    bad_option_value,
    confirm,
    pass_app,
    require,
    stop_on_signals,
)
from partq.tools.output import Output, output_options


class HumanReporter(scaling.Reporter):
    """Lines for a person. Offline, every step of the seven, numbered; a skipped one in one
    line. Online only the steps that do something, unnumbered: the others are the offline
    procedure's, skipped by design."""

    def __init__(self, out: Output, online: bool) -> None:
        self.out = out
        self.online = online
        self._bar: Any = None          # click's progress bar while step 2 drains
        self._shown = 0
        self._last_depth: int | None = None
        self._last_line = 0.0
        self._title: tuple[int, str] | None = None     # a step's title, not printed yet
        self._skip = ""                                # why the step is skipped, if it is

    def _tag(self, step: int) -> str:
        return "" if self.online else f"[{step}/7] "

    def start(self, step: int, text: str) -> None:
        self._title, self._skip = (step, text), ""

    def _show_title(self) -> None:
        if self._title is not None:
            step, text = self._title
            self.out.echo(f"{self._tag(step)}{text} ...")
            self._title = None

    def note(self, step: int, text: str) -> None:
        if self._title is not None and not self._skip and text.startswith("skipped"):
            self._skip = text            # shown with the step's end, if at all
            return
        self._show_title()
        self.out.echo(f"      {text}")

    def done(self, step: int, status: str, seconds: float, detail: dict) -> None:
        self._close_bar()
        if status == "skipped" and self._title is not None:
            self._title = None
            if not self.online:
                self.out.echo(f"[{step}/7] {self._skip or 'skipped'}")
            return
        self._show_title()
        self.out.echo(f"{self._tag(step)}{status} in {seconds:.3f} s")

    def drain(self, depth: int, initial: int) -> None:
        if initial <= 0:
            return
        if not self.out.show_progress:
            # no terminal (a log, CI): a line when the depth changed, at most every 2 s
            now = time.monotonic()
            if depth != self._last_depth and now - self._last_line >= 2.0:
                self.out.echo(f"      depth {depth} of {initial}")
                self._last_depth, self._last_line = depth, now
            return
        if self._bar is None:
            self._bar = self.out.progress(initial, "draining").__enter__()
        drained = max(0, min(initial, initial - depth))
        if drained > self._shown:
            self._bar.update(drained - self._shown)
            self._shown = drained

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None
            self._shown = 0


class JsonReporter(scaling.Reporter):
    """One JSON object per step, written when the step ends (done, skipped, timeout, failed):
    ``step``, ``name``, ``title``, ``status``, ``seconds``, ``notes`` (every note of the step,
    a list) and the step's details. A detail named ``note`` joins ``notes``: one key, one
    meaning."""

    def __init__(self, out: Output) -> None:
        self.out = out
        self.notes: list[str] = []

    def note(self, step: int, text: str) -> None:
        self.notes.append(text)

    def done(self, step: int, status: str, seconds: float, detail: dict) -> None:
        name, title = scaling.STEPS[step]
        detail = dict(detail)
        note = detail.pop("note", None)
        if note and note not in self.notes:
            self.notes.append(note)
        self.out.line({"step": step, "name": name, "title": title, "status": status,
                       "seconds": round(seconds, 6), **detail, "notes": self.notes})
        self.notes = []


@click.command()
@click.argument("queue")
@click.option("--partitions", "-p", type=int, help="The new partition count.")
@click.option("--abort", is_flag=True,
              help="Undo a procedure that was killed: ingress back as it was, record removed.")
@click.option("--drain-timeout", type=Seconds(), default=300.0, show_default=True,
              help="Seconds step 2 waits for consumers to drain every partition.")
@click.option("--rebalance-timeout", type=Seconds(), default=60.0, show_default=True,
              help="Seconds step 5 waits for the rebalance to finish.")
@click.option("--standby-timeout", type=Seconds(), default=300.0, show_default=True,
              help="Seconds steps 3 and 6 wait for a DR-standby.")
@click.option("--no-drain", is_flag=True,
              help="Offline: skip step 2, deleting messages left in removed partitions.")
@click.option("--online/--offline", default=True, show_default=True,
              help="Online keeps ingress on and per-key order (steps 1-3 and 7 skipped); "
                   "offline runs all seven steps, ingress off meanwhile.")
@click.option("--allow-discard", is_flag=True,
              help="Offline: run although the queue discards publishes while its ingress is "
                   "off (they are lost).")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output_options
@pass_app
def scale(app: App, queue: str, partitions: int | None, abort: bool, drain_timeout: float,
          rebalance_timeout: float, standby_timeout: float, no_drain: bool, online: bool,
          allow_discard: bool, yes: bool, out: Output) -> None:
    """Change the partition count of QUEUE, online unless --offline.

    Online (the default) keeps ingress on: a message published after the change whose key
    moved to another partition is delivered only once its old partition has been acked up to
    the change, so per-key order holds (`partq queue show` lists what waits). Scaling down
    online loses nothing: the removed partitions take no new publishes, are still delivered,
    and are removed once every message of theirs is acked; the command waits for that and
    shows what is left.

    --offline runs the seven-step procedure: 1 disable ingress, 2 wait until every partition
    is drained, 3 wait for the DR-standby, 4 change the count (decreasing deletes the
    highest-numbered partitions, with what is left in them), 5 wait for the rebalance, 6 wait
    for the DR-standby again, 7 enable ingress. While ingress is off the queue discards
    publishes unless it rejects them (`partq queue update QUEUE --reject-when-shutdown on`):
    --offline refuses to start on a queue that would discard, unless --allow-discard.

    A step that times out, Ctrl-C, SIGTERM or SIGHUP restore ingress and end with exit status
    1. A procedure killed outright (SIGKILL, a crash) is recorded in the store: `partq queue
    show` warns about it, the same command run again resumes it (in the mode it was started
    in), and --abort undoes it. An exclusive (non-partitioned) queue is refused: make it
    non-exclusive first.
    """
    if app.address is not None:
        _scale_remote(app, queue, partitions, abort, online, no_drain, yes, out)
        return
    if abort:
        if partitions is not None:
            raise click.UsageError("pass either --partitions N or --abort, not both")
        with app.broker() as broker:
            undone = scaling.abort(broker, queue)
            ingress = broker.queue_config(queue).ingress_enabled
        if out.json:
            out.doc({"queue": queue, "aborted": undone.as_dict(), "ingress_enabled": ingress})
        else:
            out.echo(f"undid the scaling of queue {queue!r} to {undone.to_partitions} partitions "
                     f"(stopped at step {undone.step}); ingress is {'on' if ingress else 'off'}")
        return
    if partitions is None:
        raise click.UsageError("pass --partitions N (or --abort)")
    for name, value in (("--drain-timeout", drain_timeout), ("--rebalance-timeout", rebalance_timeout),
                        ("--standby-timeout", standby_timeout)):
        bad_option_value(value >= 0, f"{name} must be a number of seconds >= 0")
    with app.broker() as broker:
        config = broker.queue_config(queue)
        scaling.check_scalable(config)                       # exclusive: nothing to scale
        dataclasses.replace(config, partitions=partitions)  # validates the count (InvalidConfig)
        earlier = scaling.procedure_of(broker, queue)
        if partitions == config.partitions and config.scaling_status == "Ready" and earlier is None:
            if out.json:
                out.line({"queue": queue, "from": partitions, "to": partitions, "changed": False})
            else:
                out.echo(f"queue {queue!r} already has {partitions} partitions; nothing to do")
            return
        loss = (f", and messages left in partitions {partitions} to {config.partitions - 1} are "
                f"deleted" if partitions < config.partitions and no_drain else "")
        resuming = earlier is not None and earlier.to_partitions == partitions
        if resuming:
            assert earlier is not None
            online = earlier.online          # resumed as it was started
            question = f"Resume the interrupted scaling of queue {queue!r} to {partitions} partitions?"
        elif online:
            require(not no_drain, "--no-drain applies to --offline only: an online scale-down "
                                  "deletes nothing")
            retired = (f"; partitions {partitions} to {config.partitions - 1} take no new "
                       f"messages and are removed once drained" if partitions < config.partitions
                       else "")
            question = (f"Scale queue {queue!r} online from {config.partitions} to {partitions} "
                        f"partitions? Ingress stays on{retired}.")
        else:
            require(allow_discard or scaling.publishes_while_ingress_off(config) == "rejected",
                    f"the offline procedure turns ingress off, and queue {queue!r} then DISCARDS "
                    f"publishes (lost, counted); scale online (leave out --offline), or make it "
                    f"reject them first (`partq queue update {queue} --reject-when-shutdown "
                    f"on`), or pass --allow-discard")
            question = (f"Scale queue {queue!r} from {config.partitions} to {partitions} partitions? "
                        f"Its ingress is disabled until the procedure ends"
                        f"{loss}; meanwhile {scaling.describe_ingress_off(config)}.")
        if resuming or not online or partitions < config.partitions:
            # an online scale-up changes no message and stops nothing: nothing to confirm
            confirm(yes, question, f"pass --yes to scale queue {queue!r}")
        reporter = JsonReporter(out) if out.json else HumanReporter(out, online)
        removed_before = removed_messages(broker, queue)
        with stop_on_signals() as stop:
            summary = scaling.run(broker, queue, partitions, drain=not no_drain,
                                  drain_timeout=drain_timeout, rebalance_timeout=rebalance_timeout,
                                  standby_timeout=standby_timeout, reporter=reporter,
                                  stop=stop.is_set, online=online)
        removed_after = removed_messages(broker, queue)
    deleted = removed_after - removed_before      # --json: step 2's deleted_at_step_4
    out.echo(f"queue {queue!r} scaled from {summary['from']} to {summary['to']} partitions in "
             f"{summary['seconds']:.3f} s" + (f"; {deleted} message(s) left in removed partitions "
                                              f"were deleted" if deleted else ""))


def _scale_remote(app: App, queue: str, partitions: int | None, abort: bool, online: bool,
                  no_drain: bool, yes: bool, out: Output) -> None:
    """``partq scale --address``: an online scale run by ``partq serve`` (``Client.scale``);
    the offline procedure and --abort run on the store's host."""
    if abort or not online or no_drain:
        raise UserError("the offline procedure (--offline, --no-drain, --abort) runs on the "
                        "store's host: run it there with --data DIR; over --address a queue "
                        "scales online")
    if partitions is None:
        raise click.UsageError("pass --partitions N")
    with app.broker(network=True) as client:
        config = client.queue_config(queue)
        scaling.check_scalable(config)
        dataclasses.replace(config, partitions=partitions)  # validates the count (InvalidConfig)
        if partitions == config.partitions and config.scaling_status == "Ready":
            if out.json:
                out.line({"queue": queue, "from": partitions, "to": partitions, "changed": False})
            else:
                out.echo(f"queue {queue!r} already has {partitions} partitions; nothing to do")
            return
        if partitions < config.partitions:
            confirm(yes, f"Scale queue {queue!r} online from {config.partitions} to {partitions} "
                         f"partitions? Ingress stays on; partitions {partitions} to "
                         f"{config.partitions - 1} take no new messages and are removed once "
                         f"drained.", f"pass --yes to scale queue {queue!r}")
        started = time.monotonic()
        steps: list[str] = []
        scaled = client.scale(queue, partitions, progress=steps.append, online=True)
    seconds = time.monotonic() - started
    if out.json:
        out.line({"queue": queue, "from": config.partitions, "to": scaled.partitions,
                  "changed": True, "online": True, "seconds": round(seconds, 6), "notes": steps})
        return
    for step in steps:
        out.echo(f"      {step}")
    out.echo(f"queue {queue!r} scaled from {config.partitions} to {scaled.partitions} partitions "
             f"in {seconds:.3f} s")


def removed_messages(broker, queue: str) -> int:
    """Messages of ``queue`` dropped unacked with their partitions so far (a count the store
    keeps: ``QUEUE_REMOVED``)."""
    qid = broker.queue_config(queue).qid
    with broker.store.read() as r:
        raw = r.queue_meta(qid, QUEUE_REMOVED)
    return 0 if raw is None else unpack_u64(raw)
