"""A DR-standby process: ``Broker.open(DIR, standby_of=PRIMARY)``, stays up until SIGTERM (clean
close, exit 0) or SIGKILL. Every ~50 ms it replaces STATUS with its ``replication_status()`` plus
the wall time, so the test can watch applied_lsn and the lag it reports.

    python proc_standby.py DIR PRIMARY STATUS [crash-after-snapshot-replace] [token=T] [ca=PEM]

With ``crash-after-snapshot-replace`` the process dies (``os._exit``, as abrupt as SIGKILL) inside
the snapshot install: after the snapshot was copied into the store's write transaction, before
that transaction commits. ``token=T`` follows with that replication token, ``ca=PEM`` over TLS
trusting that CA.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from repl_helpers import write_json

import partq


def main() -> int:
    path, primary, status_path = sys.argv[1:4]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())   # handlers only set flags
    options = dict(arg.split("=", 1) for arg in sys.argv[4:] if "=" in arg)
    context = None
    if "ca" in options:
        import ssl
        context = ssl.create_default_context(cafile=options["ca"])
    if "crash-after-snapshot-replace" in sys.argv[4:]:
        from partq.storage.writer import Writer
        real_load = Writer.load_snapshot

        def load_then_die(self, *a, **kw):
            real_load(self, *a, **kw)
            os._exit(137)
        Writer.load_snapshot = load_then_die
    broker = partq.Broker.open(path, standby_of=primary, replication_token=options.get("token"),
                               replication_ssl=context)
    errors = 0
    try:
        while not stop.is_set():
            try:
                st = broker.replication_status()
            except partq.PartqError as exc:    # e.g. while a snapshot replaces the store
                errors += 1
                write_json(status_path + ".errors", {"errors": errors, "last": repr(exc)})
            else:
                write_json(status_path, dict(st.as_dict(), time=time.time(), pid=os.getpid(),
                                             last_error=st.last_error,
                                             status_errors=errors))
            stop.wait(0.05)
    finally:
        broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
