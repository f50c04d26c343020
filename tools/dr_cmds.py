"""`partq standby` (run a DR-standby) and `partq dr status|promote|slots|drop-slot|
clear-superseded` (rule `replication`; docs/security.md for the token and TLS options).

A standby process holds ``DIR/standby.lock`` (flock, "pid P on HOST since T"), so `dr status`
can say who follows and `dr promote` can stop that process before promoting the directory.
`dr promote` takes the standby's connection options too: with them it tells the old primary
that it is superseded before it returns (the process ends right after, and with it the thread
that would go on trying).
"""
from __future__ import annotations

import os
import signal
import ssl
import threading
import time

import click

from partq.broker import Broker
from partq.delivery.lock import OwnerLock, holder
from partq.errors import LockHeld
from partq.replication import clear_superseded, drop_slot, followed, list_slots, wait_told
from partq.tools.common import App, UserError, confirm
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
    if doc.get("superseded"):
        out.echo("SUPERSEDED: a standby of this primary was promoted; it refuses writes (move the "
                 "directory aside and follow the new primary; `partq dr clear-superseded` if the "
                 "promotion was a mistake)")
    if doc.get("fence_pending"):
        out.echo(_not_told(doc["fence_pending"], doc.get("fence_error")))
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


def client_tls(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The standby's TLS context: trust ``ca`` (the primary's CA; the system's CAs without
    it), and present ``cert``/``key`` when the primary asks for a client certificate."""
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise click.UsageError("pass both --tls-cert and --tls-key, or neither")
    try:
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise UserError(f"cannot load the TLS files ({exc}); check --tls-ca, --tls-cert and "
                        f"--tls-key") from None
    return context


def _connection(token_file: str | None, use_tls: bool, tls_ca: str | None,
                tls_cert: str | None, tls_key: str | None) -> dict:
    """``Broker.open``'s options for reaching a primary, from the connection options."""
    context = client_tls(tls_ca, tls_cert, tls_key)
    if use_tls and context is None:
        context = ssl.create_default_context()
    return {"replication_token_file": token_file, "replication_ssl": context}


def connection_options(func):
    """The options a standby reaches its primary with (`partq standby`, `partq dr promote`)."""
    options = [
        click.option("--token-file", type=click.Path(dir_okay=False),
                     help="A file whose first line is the primary's replication token (without "
                          "one, only a primary in protected mode, on this host, answers)."),
        click.option("--tls", "use_tls", is_flag=True,
                     help="Connect with TLS, trusting the system's CAs (or --tls-ca)."),
        click.option("--tls-ca", type=click.Path(dir_okay=False),
                     help="PEM file of the CA that signed the primary's certificate (implies "
                          "--tls)."),
        click.option("--tls-cert", type=click.Path(dir_okay=False),
                     help="PEM client certificate, for a primary that requires one."),
        click.option("--tls-key", type=click.Path(dir_okay=False), help="PEM key of --tls-cert."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.command()
@click.option("--primary", required=True, metavar="HOST:PORT",
              help="The primary's replication address (Broker.open(..., replication_listen=...)).")
@connection_options
@click.option("--interval", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between status lines.")
@output_options
@click.pass_obj
def standby(app: App, primary: str, token_file: str | None, use_tls: bool, tls_ca: str | None,
            tls_cert: str | None, tls_key: str | None, interval: float, out: Output) -> None:
    """Run a DR-standby of PRIMARY in --data DIR until SIGTERM or Ctrl-C.

    DIR must be new (or an earlier standby of the same primary). The standby refuses publishes
    and binds until `partq dr promote`. It proves --token-file's token to the primary and checks
    the primary's proof back; with --tls/--tls-ca it checks the primary's certificate. Prints
    its status every --interval seconds.
    """
    connection = _connection(token_file, use_tls, tls_ca, tls_cert, tls_key)
    os.makedirs(app.path, mode=0o700, exist_ok=True)
    lock = _take_lock(app.path)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())   # handlers only set flags
    try:
        broker = Broker.open(app.path, standby_of=primary, **connection)
    except BaseException:
        lock.release()
        raise
    try:
        while not stop.wait(interval):
            doc = _status_doc(broker)
            if out.json:
                out.doc({"time": time.time(), **doc})
            else:
                state = "connected" if doc["connected"] else "connecting"
                line = (f"{time.strftime('%H:%M:%S')} {state} to {primary}: applied LSN "
                        f"{doc['applied_lsn']}, lag {doc['lag_messages']} messages")
                if not doc["connected"] and doc.get("last_error"):
                    line += f" ({doc['last_error']})"
                out.echo(line)
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
    """DR-standby replication: status, promotion and the primary's replication slots."""


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
@connection_options
@click.option("--fence-timeout", default=10.0, show_default=True,
              type=click.FloatRange(min=0, max=3600),
              help="Seconds to wait for the old primary to answer that it refuses writes now.")
@output_options
@click.pass_obj
def dr_promote(app: App, timeout: float, token_file: str | None, use_tls: bool,
               tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
               fence_timeout: float, out: Output) -> None:
    """Make the DR-standby in --data DIR a primary, and tell the old primary.

    A running `partq standby` process on DIR is stopped first (SIGTERM). Then DIR is promoted
    and the old primary (the address DIR followed) is told, with --token-file and the TLS
    options (those the standby used), that it is superseded: from then on it refuses writes,
    so the two never both take them. The command waits up to --fence-timeout seconds for its
    answer. When it does not answer (it is down, or cut off) the promotion stands, a warning
    says so, and `partq dr status` on DIR shows the old primary as not told: it is told by the
    next process that runs DIR as a primary with the options to reach it, or by this command
    run again on DIR. Afterwards services open DIR as usual (with replication_listen to serve
    a new standby); consumers that rebind with their names or hints within the rebalance delay
    keep their partitions.
    """
    connection = _connection(token_file, use_tls, tls_ca, tls_cert, tls_key)
    follower = _stop_follower(app.path, timeout)
    with app.broker(**connection) as broker:
        was_standby = broker.replication_status().role == "standby"
        old = followed(broker.store)
        if was_standby:
            broker.promote(**connection)
        elif broker.replication_status().fence_pending is None:
            raise UserError(f"{app.path} is not a DR-standby, and has no old primary left to "
                            f"tell; nothing to promote")
        pending, error = wait_told(broker.store, fence_timeout)
        doc = _status_doc(broker)
    told = None if old is None else pending is None
    if out.json:
        out.doc({"promoted": was_standby, "stopped_standby_process": follower,
                 "old_primary": old, "old_primary_told": told, "old_primary_error": error,
                 **doc})
    else:
        stopped = f" (stopped the standby process {follower})" if follower else ""
        if was_standby:
            out.echo(f"promoted {app.path} to primary at LSN {doc['head_lsn']}{stopped}")
        if told:
            out.echo(f"told the old primary {old} that it is superseded: it refuses writes now")
    if pending is not None:
        out.warn(f"{_not_told(pending, error)} (waited {fence_timeout:g} s)")


def _not_told(old: str, error: str | None) -> str:
    why = f" (last attempt: {error})" if error else ""
    return (f"the old primary {old} has not been told that it is superseded yet{why}: if it "
            f"runs, it takes writes. Run `partq dr promote` on this directory again with the "
            f"options that reach it (--token-file, --tls...) once it answers, or stop it by hand")


def _stop_follower(path: str, timeout: float) -> str | None:
    """Stop the `partq standby` process following ``path`` (SIGTERM); return who it was."""
    lock_path = os.path.join(path, LOCK_FILE)
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
    return follower


@dr.command("clear-superseded")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@output_options
@click.pass_obj
def dr_clear_superseded(app: App, yes: bool, out: Output) -> None:
    """Remove the SUPERSEDED mark of the old primary in --data DIR: it takes writes again.

    A promoted standby marks the primary it followed so that only one primary takes writes.
    Clear the mark only when that promotion is undone (the promoted store is stopped for good
    and its clients point here again): with both taking writes their messages diverge. The
    slot of the standby that superseded it is dropped too: that store, a primary of its own
    history now, never follows this one again.
    """
    with app.broker() as broker:
        if not broker.replication_status().superseded:
            raise UserError(f"{app.path} is not marked superseded; nothing to clear")
        confirm(yes, f"Let {app.path} take writes again, beside the primary that superseded it?",
                "pass --yes to clear the SUPERSEDED mark")
        info = clear_superseded(broker.store)
    if info is None:
        raise UserError(f"{app.path} is not marked superseded; nothing to clear")
    if out.json:
        out.doc({"cleared": True, **info})
        return
    by = f" (by {info['superseded_by']})" if info["superseded_by"] else ""
    out.echo(f"cleared the SUPERSEDED mark of {app.path}{by}: it takes writes again")
    if info["dropped_slot"]:
        out.echo(f"dropped the replication slot of standby {info['dropped_slot']}, which "
                 f"superseded it")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


@dr.command("slots")
@output_options
@click.pass_obj
def dr_slots(app: App, out: Output) -> None:
    """The replication slots of the primary in --data DIR: per standby its acked LSN, lag
    (changes, messages, seconds), age and time since its last ack, then the slots invalidated
    because the change log they kept passed max_slot_keep."""
    with app.broker() as broker:
        slots = list_slots(broker.store)
    if out.json:
        out.doc({"slots": slots})
        return
    if not slots:
        out.echo("no replication slots")
        return
    out.table(["STANDBY", "STATE", "ACKED LSN", "LAG CHANGES", "LAG MESSAGES", "LAG SECONDS",
               "AGE S", "IDLE S", "ADDRESS"],
              [[s["standby_id"], s["state"], s["acked_lsn"], _dash(s["lag_changes"]),
                _dash(s["lag_messages"]), _seconds(s["lag_seconds"]), _seconds(s["age_seconds"]),
                _seconds(s["idle_seconds"]), s["address"] or "-"] for s in slots])


def _dash(value) -> object:
    return "-" if value is None else value


@dr.command("drop-slot")
@click.argument("standby_id", metavar="ID")
@output_options
@click.pass_obj
def dr_drop_slot(app: App, standby_id: str, out: Output) -> None:
    """Drop standby ID's replication slot: the change log it kept is trimmed at once. The
    standby, when it comes back (a running one reconnects at once), gets a new slot, and starts
    again from a snapshot if it lacks changes that were trimmed."""
    with app.broker() as broker:
        dropped = drop_slot(broker.store, standby_id)
    if not dropped:
        raise UserError(f"no replication slot named {standby_id!r}; list them with `partq dr "
                        f"slots`")
    if out.json:
        out.doc({"dropped": standby_id})
    else:
        out.echo(f"dropped the replication slot of standby {standby_id}")
