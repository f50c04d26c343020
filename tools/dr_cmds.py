"""`partq standby` (run a DR-standby) and `partq dr status|promote` (S27, seed 001's DR steps).

A standby process holds ``DIR/standby.lock`` (flock, "pid P on HOST since T"), so `dr status`
can say who follows and `dr promote` can stop that process before promoting the directory.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import click

from partq.broker import Broker
from partq.delivery.lock import LockHeld, OwnerLock, holder
from partq.tools.common import App, UserError
from partq.tools.output import Output, output_options

LOCK_FILE = "standby.lock"


def _status_doc(broker: Broker) -> dict:
    return broker.replication_status().as_dict()


def _show(out: Output, doc: dict, follower: str | None) -> None:
    if out.json:
        out.doc({**doc, "standby_process": follower})
        return
    out.echo(f"role {doc['role']}; head LSN {doc['head_lsn']}, applied LSN {doc['applied_lsn']}; "
             f"lag {doc['lag_messages']} messages, {doc['lag_seconds']:.3f} s")
    if doc.get("primary"):
        out.echo(f"follows {doc['primary']}" + (f" ({follower})" if follower else ""))
    elif follower:
        out.echo(f"followed by the standby process {follower}")
    if doc["standbys"]:
        out.table(["STANDBY", "ACKED LSN", "LAG CHANGES", "LAG MESSAGES", "LAG SECONDS"],
                  [[s["standby_id"], s["acked_lsn"], s["lag_changes"], s["lag_messages"],
                    f"{s['lag_seconds']:.3f}"] for s in doc["standbys"]])
    elif doc["role"] == "primary":
        out.echo("no DR-standby attached")


@click.command()
@click.option("--primary", required=True, metavar="HOST:PORT",
              help="The primary's replication address (Broker.open(..., replication_listen=...)).")
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between status lines.")
@output_options
@click.pass_obj
def standby(app: App, primary: str, interval: float, out: Output) -> None:
    """Run a DR-standby of PRIMARY in --data DIR until SIGTERM or Ctrl-C.

    DIR must be new (or an earlier standby of the same primary). The standby refuses publishes
    and binds until `partq dr promote`. Prints its status every --interval seconds.
    """
    os.makedirs(app.path, exist_ok=True)
    lock = _take_lock(app.path)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())   # handlers only set flags
    broker = Broker.open(app.path, standby_of=primary)
    try:
        while not stop.wait(interval):
            doc = _status_doc(broker)
            if out.json:
                out.doc({"time": time.time(), **doc})
            else:
                state = "connected" if doc["connected"] else "connecting"
                out.echo(f"{time.strftime('%H:%M:%S')} {state} to {primary}: applied LSN "
                         f"{doc['applied_lsn']}, lag {doc['lag_messages']} messages")
    finally:
        broker.close()
        lock.release()


def _take_lock(path: str) -> OwnerLock:
    try:
        return OwnerLock(os.path.join(path, LOCK_FILE))
    except LockHeld as exc:
        raise UserError(f"{path} is already followed by the standby process {exc.holder}; stop "
                        f"it first") from None


@click.group()
def dr() -> None:
    """DR-standby replication: status and promotion."""


@dr.command("status")
@output_options
@click.pass_obj
def dr_status(app: App, out: Output) -> None:
    """Role, standbys and lag, as stored in --data DIR (primary or standby)."""
    follower = holder(os.path.join(app.path, LOCK_FILE))
    with app.broker() as broker:
        _show(out, _status_doc(broker), follower)


@dr.command("promote")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds to wait for a running standby process to stop.")
@output_options
@click.pass_obj
def dr_promote(app: App, timeout: float, out: Output) -> None:
    """Make the DR-standby in --data DIR a primary.

    A running `partq standby` process on DIR is stopped first (SIGTERM). Afterwards services
    open DIR as usual (with replication_listen to serve a new standby); consumers that rebind
    with their names or hints within the rebalance delay keep their partitions.
    """
    lock_path = os.path.join(app.path, LOCK_FILE)
    follower = holder(lock_path)
    if follower is not None:
        pid = int(follower.split()[1])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while holder(lock_path) is not None:
            if time.monotonic() > deadline:
                raise UserError(f"the standby process {follower} did not stop within {timeout:g} s; "
                                f"stop it, then run `partq dr promote` again")
            time.sleep(0.05)
    with app.broker() as broker:
        broker.promote()
        doc = _status_doc(broker)
    if out.json:
        out.doc({"promoted": True, "stopped_standby_process": follower, **doc})
    else:
        stopped = f" (stopped the standby process {follower})" if follower else ""
        out.echo(f"promoted {app.path} to primary at LSN {doc['head_lsn']}{stopped}")
