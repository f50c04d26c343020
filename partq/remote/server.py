"""``partq serve``: delivery and publishing of a directory's queues for clients on other hosts
(rule `serve`). A ``Server`` takes the delivery of every queue it can (other processes of the host then
follow it), and serves ``partq.connect`` clients over a ``Listener`` (TLS, token, limits).

One session per connection. Requests carry an id and are answered in order of completion:

    publish {queue, items: [[payload, key, headers], ...]} -> published {results}  (all or none)
    publish_each {queue, items}             -> published {results: [result or error, ...]}
    bind {queue, name, hint, skip_corrupt}  -> bound {flow, partitions, consumer_timeout}
    ack {flow, ids: [[partition, seq], ...]} -> ok        (after the acks are durable)
    ack_through {flow, partition, seq}      -> ok        (likewise)
    nack {flow, id: [partition, seq], delay} -> ok {upto} (answered by the flow's pump)
    reject {flow, id: [partition, seq], headers} -> ok {upto}  (likewise; headers: added to
                                             the dead copy's)
    unbind {flow, leave}                    -> ok        (leave: for good, rule `leave`)
    transaction {txn, acks, nacks, rejects, publishes} -> committed {flows}  (txn_request.py)
    status {queue}                          -> status {status}
    queues {}                               -> queues {queues: [name, ...]}
    replication {}                          -> replication {replication}
    logs, read, stage, commit_job, abort_job, resume_commits, ensure_queue
                                             (the Spark source: partq.jobs.staging.spark_request)
    create_queue, update_queue, delete_queue, queue_config, queue_configs, scale, kill_message,
    ack_message, stats, browse, stranded, position, after, requeue
                                             (administration: partq.remote.admin_request)
    beat                                     (no answer; any frame keeps a session alive)
    every field of a request is checked first (``partq.remote.requests``): a request that fails
    is refused like any other, with its typed error, and the connection goes on
    errors: error {req, error, message, and the error's fields}: the error's ``to_frame()``;
    the client raises ``partq.wire.error_frames.error_from_frame`` of it, the same class with
    the same fields (a ``CorruptRecord`` with its queue, partition and seq)

Pushes, from the connection's thread right after its client's acks, otherwise from the server's
one pump thread, which serves every connection's flows in turn (``Pumps``):
``deliver {flow, n, messages}`` (within the flow's credit: at most
``max_delivered_unacked_per_flow`` unacked; at most ``PUSH_BYTES`` of messages a frame),
``state {flow, partitions}``, ``event {flow, active, partitions}``, ``closed {flow, reason}``.
``n`` counts a flow's deliver frames; a nack's answer names the last one sent before the nack
took effect, so the client drops exactly the copies the nack gives back (they come again,
marked redelivered, in order).

Liveness (rule `liveness`): a session that closes unbinds its flows at once; one silent for its queues'
``consumer_timeout`` (clients beat every quarter of it) is closed, with the same effect.
"""
from __future__ import annotations

import logging
import queue as queue_module
import socket
import ssl
import threading
from contextlib import AbstractContextManager

from partq.errors import FlowClosed, FrameError, InvalidConfig, InvalidMessage, PartqError
from partq.jobs.staging import spark_request
from partq.pending import add_done_callback
from partq.remote.admin_request import ADMIN_OPS, admin_request
from partq.remote.memory import give_back_freed_memory, keep_large_blocks_apart
from partq.remote.pump import Pump
from partq.remote.pumps import Pumps
from partq.remote.requests import check_request
from partq.remote.txn_request import Running, run_transaction
from partq.wire.error_frames import error_frame
from partq.wire.frames import Outbox, printable, read_frame
from partq.wire.listener import Limits, Listener
from partq.wire.tls import Conn, serial

log = logging.getLogger("partq.server")

MAX_ITEMS = 1 << 17       # items of any one array or map of a request, checked as it is decoded


class Server:
    def __init__(self, broker, listen: str, *, token: bytes | None = None,
                 ssl_context: ssl.SSLContext | None = None, limits: Limits = Limits()) -> None:
        self.broker = broker
        self.limits = limits
        keep_large_blocks_apart()
        for config in broker.queues():
            if not broker.dispatcher.take_over(config.name):
                log.info("queue %r is delivered by another process: its flows here follow it",
                         config.name)
        self._named: dict[tuple[str, str], Session] = {}    # named flows, by their session
        self._named_lock = threading.Lock()
        self.pumps = Pumps(broker.dispatcher)
        self.running = Running()            # transaction ids committing now
        self.listener = Listener(listen, "serve", self._session, token=token,
                                 ssl_context=ssl_context, limits=limits)
        self.address = self.listener.address
        log.info("serving %s on %s%s", broker.path, self.address,
                 " with TLS" if ssl_context is not None else "")

    def _session(self, sock: socket.socket, hello: dict, where: str) -> None:
        who = f"{where} (pid {printable(hello.get('pid'))} on {printable(hello.get('host'))})"
        log.info("client %s connected", who)
        # read by this thread, written by the session's: a TLS connection needs a lock
        Session(self, serial(sock), who, str(hello.get("client_id") or "")).run()

    def claim_name(self, queue: str, name: str, session: Session) -> None:
        """``session`` binds the flow ``name`` of ``queue``. If a stale session of the same
        client still holds it (the client reconnected before the server saw the old
        connection end), that session's flow is unbound first, so the rebind succeeds."""
        with self._named_lock:
            holder = self._named.get((queue, name))
        if holder is not None and holder is not session and session.client_id \
                and holder.client_id == session.client_id:
            log.info("client %s replaces its stale connection's flow %s of queue %r",
                     session.who, name, queue)
            holder.drop_named(queue, name)

    def named(self, queue: str, name: str, session: Session) -> None:
        """Record the session holding the flow ``name`` of ``queue``."""
        with self._named_lock:
            self._named[(queue, name)] = session

    def release_name(self, queue: str, name: str, session: Session) -> None:
        """``session`` no longer holds the flow ``name`` (if it was the one holding it)."""
        with self._named_lock:
            if self._named.get((queue, name)) is session:
                del self._named[(queue, name)]

    def close(self) -> None:
        self.listener.close()
        self.pumps.close()


class Session:
    def __init__(self, server: Server, sock: Conn, who: str, client_id: str) -> None:
        self.server = server
        self.broker = server.broker
        self.sock = sock
        self.who = who
        self.client_id = client_id
        self.limits = server.limits
        self.flows: dict[str, Pump] = {}
        self._outbox = Outbox(sock, "partq-serve-send", direct="try")
        self._completions: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self.closed = threading.Event()

    def send(self, frame: dict) -> None:
        """Queue a frame for the client (pumps, answers); written in batches by one thread."""
        self._outbox.put(frame)

    def pending_bytes(self) -> int:
        return self._outbox.pending_bytes()

    def corked(self) -> AbstractContextManager[None]:
        """Hold the frames sent meanwhile, then write them together."""
        return self._outbox.corked()

    def wait_for_room(self, limit: int, timeout: float) -> bool:
        """Wait until fewer than ``limit`` bytes wait to be written to the client."""
        return self._outbox.wait_below(limit, timeout)

    def when_room(self, limit: int, fn) -> None:
        """Call ``fn()`` once fewer than ``limit`` bytes wait to be written to the client (or
        the connection closed)."""
        self._outbox.when_below(limit, fn)

    def close_connection(self) -> None:
        """End the connection; its thread then ends the session (and unbinds its flows)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def idle_timeout(self) -> float:
        timeouts = [pump.consumer_timeout for pump in list(self.flows.values())]
        return min([self.limits.idle_timeout, *timeouts])

    def run(self) -> None:
        completer = threading.Thread(target=self._complete, name="partq-serve-complete",
                                     daemon=True)
        completer.start()
        reason = "closed the connection"
        stream = self.sock.makefile("rb", buffering=1 << 16)
        timeout = None
        try:
            while True:
                if not self.wait_for_room(self.limits.max_pending_bytes, self.idle_timeout()):
                    reason = (f"read none of its answers for {self.idle_timeout():g} s "
                              f"({self._outbox.pending_bytes()} bytes waiting)")
                    break
                if timeout != self.idle_timeout():      # a system call: only when it changes
                    timeout = self.idle_timeout()
                    self.sock.settimeout(timeout)
                frame = read_frame(stream, self.limits.max_frame, MAX_ITEMS)
                if not isinstance(frame, dict):
                    raise FrameError("a request must be a map")
                self._handle(frame)
        except TimeoutError:
            reason = f"sent nothing for {self.idle_timeout():g} s"
        except (FrameError, OSError, ssl.SSLError) as exc:
            reason = str(exc) or type(exc).__name__
        finally:
            self.closed.set()
            self._completions.put(None)
            self._outbox.close()
            flows, self.flows = list(self.flows.values()), {}
            for pump in flows:
                self._forget(pump)
                self.server.pumps.remove(pump)
                pump.stop(unbind=True)       # a closed connection is an unbind, rule `liveness`
            log.info("client %s disconnected: %s; %d flow(s) unbound", self.who, reason,
                     len(flows))
            completer.join(timeout=5)
            stream.close()
            for pump in flows:
                pump.detach()                       # no session <-> pump cycle left behind
            give_back_freed_memory()

    def _handle(self, frame: dict) -> None:
        req = frame.get("req")
        try:
            op = check_request(frame)         # every field, before anything is done
            if op == "beat":
                return
            if op in ("publish", "publish_each") and len(frame["items"]) > self.limits.max_batch:
                raise InvalidMessage(f"a batch of {len(frame['items'])} items is over this "
                                     f"server's limit of {self.limits.max_batch}; publish it in "
                                     f"smaller batches")
            if op == "publish":
                items = [tuple(item) for item in frame["items"]]
                queue, ttl = frame["queue"], frame.get("ttl")
                if len(items) == 1 and len(items[0]) == 3:
                    one = self.broker.publish_async(queue, *items[0], ttl=ttl)  # merged with
                    self._when_durable((req, one, lambda r: {                  # others
                        "op": "published", "req": req, "results": [r]}))
                    return
                pending = self.broker.publish_many_async(queue, items, ttl, commit_here=True)
                self._when_durable((req, pending, lambda results: {     # (partition, seq,
                    "op": "published", "req": req, "results": results}))  # discarded) each
            elif op == "publish_each":
                items = [tuple(item) for item in frame["items"]]
                each = self.broker.publish_each_async(frame["queue"], items, commit_here=True)
                self._when_durable((req, each, lambda results: {
                    "op": "published", "req": req,
                    "results": [r.to_frame() if isinstance(r, PartqError) else r
                                for r in results]}))
            elif op == "bind":
                self._bind(req, frame)
            elif op == "ack":
                pump = self._pump(frame)
                pump.ack(pump.messages(frame["ids"]), lambda pending: self._when_durable(
                    (req, pending, lambda _: {"op": "ok", "req": req})))
            elif op == "ack_through":
                pending = self._pump(frame).flow.ack_through(frame["partition"], frame["seq"])
                self._when_durable((req, pending, lambda _: {"op": "ok", "req": req}))
            elif op in ("nack", "reject"):
                pump = self._pump(frame)
                msg = pump.messages([frame["id"]])[0]
                pump.nack(req, msg, frame.get("delay"), reject=op == "reject",  # the pump
                          headers=frame.get("headers"))
            elif op == "transaction":
                self.send({**run_transaction(self, frame), "req": req})
            elif op == "unbind":                                           # thread applies it
                leaving = self.flows.pop(frame["flow"], None)
                if leaving is not None:
                    self._forget(leaving)
                    self.server.pumps.remove(leaving)
                    leaving.stop(unbind=True, leave=frame.get("leave") is True)
                self.send({"op": "ok", "req": req})
            elif op == "status":
                status = self.broker.queue_status(frame["queue"])
                self.send({"op": "status", "req": req, "status": status.as_dict()})
            elif op == "queues":          # partq top --address
                self.send({"op": "queues", "req": req,
                           "queues": sorted(c.name for c in self.broker.queues())})
            elif op in ADMIN_OPS:         # administration: partq.remote.admin_request
                self.send({**admin_request(self.broker, frame, self.who), "req": req})
            elif op == "replication":
                self.send({"op": "replication", "req": req,
                           "replication": self.broker.replication_status().as_dict()})
            else:                         # the Spark source with .option("address"), rule
                self.send({"op": op, "req": req,        # `spark-remote`
                           **spark_request(self.broker, frame)})
        except PartqError as exc:     # refused: the connection goes on
            self.send(error_frame(exc, req=req))

    def _bind(self, req, frame: dict) -> None:
        queue, hint, name = frame["queue"], frame.get("hint"), frame.get("name")
        if len(self.flows) >= self.limits.max_flows:
            raise InvalidConfig(f"this connection has {len(self.flows)} flows bound, the server's "
                                f"limit; unbind one, or open another connection")
        if name is not None:
            self.server.claim_name(queue, name, self)
        flow = self.broker.bind(queue, name=name, hint=hint,
                                skip_corrupt=bool(frame.get("skip_corrupt")))
        config = self.broker.queue_config(queue)
        timeout = config.consumer_timeout
        pump = Pump(self, flow, timeout, self.broker.dispatcher.notify)
        self.flows[flow.flow_id] = pump
        if name is not None:
            self.server.named(queue, name, self)
        self.send({"op": "bound", "req": req, "flow": flow.flow_id,
                   "partitions": sorted(flow.partitions), "consumer_timeout": timeout,
                   "max_poll_interval": config.max_poll_interval})
        log.info("client %s bound flow %s of queue %r: partitions %s", self.who,
                 flow.name or flow.flow_id, queue, sorted(flow.partitions))
        self.server.pumps.add(pump)                 # the pump thread serves it from now on

    def drop_named(self, queue: str, name: str) -> None:
        """Unbind this session's flow ``name`` of ``queue`` (its client is back on another
        connection); this connection is closed, as it is stale."""
        for fid, pump in list(self.flows.items()):
            if pump.flow.queue == queue and pump.flow.name == name:
                self.flows.pop(fid, None)
                self.server.pumps.remove(pump)
                pump.stop(unbind=True)
        self.close_connection()

    def _forget(self, pump: Pump) -> None:
        if pump.flow.name is not None:
            self.server.release_name(pump.flow.queue, pump.flow.name, self)

    def _pump(self, frame: dict) -> Pump:
        pump = self.flows.get(frame["flow"])
        if pump is None:
            raise FlowClosed(f"no flow {frame['flow']!r:.80} is bound on this connection; bind "
                             f"again")
        return pump

    def _when_durable(self, item: tuple) -> None:
        """Answer a request once its write is durable: from the thread that made it so (the
        group commit: no hand-off to another thread), or, for a write that cannot call back
        (made by the process that delivers the queue, when that is another), from the
        completer thread."""
        req, pending, answer = item
        if not add_done_callback(pending, lambda: self._answer(req, pending, answer)):
            self._completions.put(item)

    def _answer(self, req, pending, answer) -> bool:
        try:
            frame = answer(pending.result())
        except PartqError as exc:
            frame = error_frame(exc, req=req)
        try:
            self.send(frame)
        except OSError:
            return False
        return True

    def _complete(self) -> None:
        """Answer requests whose writes cannot call back, as each becomes durable (in order)."""
        while True:
            item = self._completions.get()
            if item is None or not self._answer(*item):
                return
