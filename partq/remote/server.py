"""``partq serve``: delivery and publishing of a directory's queues for clients on other hosts
(S31). A ``Server`` takes the delivery of every queue it can (other processes of the host then
follow it), and serves ``partq.connect`` clients over a ``Listener`` (TLS, token, limits).

One session per connection. Requests carry an id and are answered in order of completion:

    publish {queue, items: [[payload, key, headers], ...]} -> published {results}  (all or none)
    publish_each {queue, items}             -> published {results: [result or error, ...]}
    bind {queue, name, hint, skip_corrupt}  -> bound {flow, partitions, consumer_timeout}
    ack {flow, ids: [[partition, seq], ...]} -> ok        (after the acks are durable)
    ack_through {flow, partition, seq}      -> ok        (likewise)
    nack {flow, id: [partition, seq]}       -> ok {upto}  (answered by the flow's pump)
    unbind {flow}                           -> ok
    status {queue}                          -> status {status}
    queues {}                               -> queues {queues: [name, ...]}
    replication {}                          -> replication {replication}
    logs, read, stage, commit_job, abort_job, resume_commits, ensure_queue
                                             (the Spark source: partq.jobs.staging.spark_request)
    beat                                     (no answer; any frame keeps a session alive)
    errors: error {req, error, message[, messages]}

Pushes, from one pump thread per bound flow: ``deliver {flow, n, messages}`` (within the flow's
credit: at most ``max_delivered_unacked_per_flow`` unacked), ``state {flow, partitions}``,
``event {flow, active, partitions}``, ``closed {flow, reason}``. ``n`` counts a flow's deliver
frames; a nack's answer names the last one sent before the nack took effect, so the client drops
exactly the copies the nack gives back (they come again, marked redelivered, in order).

Liveness (S32): a session that closes unbinds its flows at once; one silent for its queues'
``consumer_timeout`` (clients beat every quarter of it) is closed, with the same effect.
"""
from __future__ import annotations

import logging
import queue as queue_module
import socket
import ssl
import threading

from partq.errors import FlowClosed, FlowFenced, PartqError
from partq.jobs.staging import SPARK_OPS, spark_request
from partq.message import Message
from partq.wire.frames import FrameError, Outbox, read_frame
from partq.wire.listener import Limits, Listener

log = logging.getLogger("partq.server")

PUSH_BATCH = 500          # messages per deliver frame at most
PUMP_WAIT = 0.05          # seconds a pump waits for messages before it looks for nacks


class Server:
    def __init__(self, broker, listen: str, *, token: bytes | None = None,
                 ssl_context: ssl.SSLContext | None = None, limits: Limits = Limits()) -> None:
        self.broker = broker
        self.limits = limits
        for config in broker.queues():
            if not broker.dispatcher.take_over(config.name):
                log.info("queue %r is delivered by another process: its flows here follow it",
                         config.name)
        self.listener = Listener(listen, "serve", self._session, token=token,
                                 ssl_context=ssl_context, limits=limits)
        self.address = self.listener.address
        log.info("serving %s on %s%s", broker.path, self.address,
                 " with TLS" if ssl_context is not None else "")

    def _session(self, sock: socket.socket, hello: dict, where: str) -> None:
        who = f"{where} (pid {hello.get('pid')} on {hello.get('host')})"
        log.info("client %s connected", who)
        Session(self.broker, sock, who, self.limits).run()

    def close(self) -> None:
        self.listener.close()


class Session:
    def __init__(self, broker, sock: socket.socket, who: str, limits: Limits) -> None:
        self.broker = broker
        self.sock = sock
        self.who = who
        self.limits = limits
        self.flows: dict[str, Pump] = {}
        self._outbox = Outbox(sock, "partq-serve-send")
        self._completions: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self.closed = threading.Event()

    def send(self, frame: dict) -> None:
        """Queue a frame for the client (pumps, answers); written in batches by one thread."""
        self._outbox.put(frame)

    def idle_timeout(self) -> float:
        timeouts = [pump.consumer_timeout for pump in list(self.flows.values())]
        return min([self.limits.idle_timeout, *timeouts])

    def run(self) -> None:
        completer = threading.Thread(target=self._complete, name="partq-serve-complete",
                                     daemon=True)
        completer.start()
        reason = "closed the connection"
        stream = self.sock.makefile("rb", buffering=1 << 16)
        try:
            while True:
                self.sock.settimeout(self.idle_timeout())
                frame = read_frame(stream, self.limits.max_frame)
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
            for pump in list(self.flows.values()):
                pump.stop(unbind=True)       # a closed connection is an unbind (seed 004)
            log.info("client %s disconnected: %s; %d flow(s) unbound", self.who, reason,
                     len(self.flows))
            completer.join(timeout=5)

    def _handle(self, frame: dict) -> None:
        op, req = frame.get("op"), frame.get("req")
        if op == "beat":
            return
        try:
            if op == "publish":
                items = [tuple(item) if isinstance(item, list) else item
                         for item in frame.get("items", [])]
                queue = str(frame.get("queue"))
                if len(items) == 1 and isinstance(items[0], tuple) and len(items[0]) == 3:
                    one = self.broker.publish_async(queue, *items[0])   # merged with others
                    self._completions.put((req, one, lambda r: {
                        "op": "published", "req": req,
                        "results": [[r.partition, r.seq, r.discarded]]}))
                    return
                pending = self.broker.publish_many_async(queue, items)
                self._completions.put((req, pending, lambda results: {
                    "op": "published", "req": req,
                    "results": [[r.partition, r.seq, r.discarded] for r in results]}))
            elif op == "publish_each":
                items = [tuple(item) for item in frame.get("items", [])]
                each = self.broker.publish_each_async(str(frame.get("queue")), items)
                self._completions.put((req, each, lambda results: {
                    "op": "published", "req": req,
                    "results": [error_frame(None, r) if isinstance(r, PartqError)
                                else [r.partition, r.seq, r.discarded] for r in results]}))
            elif op == "bind":
                self._bind(req, frame)
            elif op == "ack":
                pump = self._pump(frame)
                msgs = [pump.message(p, s) for p, s in frame.get("ids", [])]
                pending = pump.flow.ack_many_async(msgs)
                self._completions.put((req, pending, lambda _: {"op": "ok", "req": req}))
            elif op == "ack_through":
                pending = self._pump(frame).flow.ack_through(int(frame["partition"]),
                                                            int(frame["seq"]))
                self._completions.put((req, pending, lambda _: {"op": "ok", "req": req}))
            elif op == "nack":
                p, s = frame["id"]
                self._pump(frame).nack(req, p, s)
            elif op == "unbind":
                leaving = self.flows.pop(str(frame.get("flow")), None)
                if leaving is not None:
                    leaving.stop(unbind=True)
                self.send({"op": "ok", "req": req})
            elif op == "status":
                status = self.broker.queue_status(str(frame.get("queue")))
                self.send({"op": "status", "req": req, "status": status.as_dict()})
            elif op == "queues":          # partq top --address
                self.send({"op": "queues", "req": req,
                           "queues": sorted(c.name for c in self.broker.queues())})
            elif op == "replication":
                self.send({"op": "replication", "req": req,
                           "replication": self.broker.replication_status().as_dict()})
            elif op in SPARK_OPS:         # the Spark source with .option("address") (S36a)
                self.send({"op": op, "req": req, **spark_request(self.broker, frame)})
            else:
                raise FrameError(f"unknown request {op!r}")
        except PartqError as exc:
            self.send(error_frame(req, exc))

    def _bind(self, req, frame: dict) -> None:
        queue = str(frame.get("queue"))
        hint = frame.get("hint")
        flow = self.broker.bind(queue, name=frame.get("name"),
                                hint=None if hint is None else list(hint),
                                skip_corrupt=bool(frame.get("skip_corrupt")))
        timeout = self.broker.queue_config(queue).consumer_timeout
        pump = Pump(self, flow, timeout)
        self.flows[flow.flow_id] = pump
        self.send({"op": "bound", "req": req, "flow": flow.flow_id,
                   "partitions": sorted(flow.partitions), "consumer_timeout": timeout})
        log.info("client %s bound flow %s of queue %r: partitions %s", self.who,
                 flow.name or flow.flow_id, queue, sorted(flow.partitions))
        pump.start()

    def _pump(self, frame: dict) -> Pump:
        pump = self.flows.get(str(frame.get("flow")))
        if pump is None:
            raise FlowClosed(f"no flow {frame.get('flow')!r} is bound on this connection; bind "
                             f"again")
        return pump

    def _complete(self) -> None:
        """Answer requests whose writes were queued, as each becomes durable (in order)."""
        while True:
            item = self._completions.get()
            if item is None:
                return
            req, pending, answer = item
            try:
                frame = answer(pending.result())
            except PartqError as exc:
                frame = error_frame(req, exc)
            try:
                self.send(frame)
            except OSError:
                return


def error_frame(req, exc: PartqError) -> dict:
    frame = {"op": "error", "req": req, "error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, FlowFenced):
        frame["messages"] = [[m.partition, m.seq] for m in exc.messages]
    return frame


class Pump:
    """Pushes one flow's messages, partition changes and events to its client."""

    def __init__(self, session: Session, flow, consumer_timeout: float) -> None:
        self.session = session
        self.flow = flow
        self.consumer_timeout = consumer_timeout
        self._nacks: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._stop = threading.Event()
        self._sent = 0
        self._thread = threading.Thread(target=self._run, name="partq-serve-pump", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def message(self, partition: int, seq: int) -> Message:
        """A message as ack and nack need it (queue, partition, seq)."""
        return Message(self.flow.queue, int(partition), int(seq), None, b"", None, 0, False)

    def nack(self, req, partition: int, seq: int) -> None:
        """Queue a nack for the pump, which applies it between two deliver frames."""
        self._nacks.put((req, self.message(partition, seq)))

    def stop(self, unbind: bool) -> None:
        self._stop.set()
        if unbind:
            try:
                self.flow.unbind()
            except PartqError:
                pass
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        flow, session, fid = self.flow, self.session, self.flow.flow_id
        partitions = flow.partitions
        try:
            while not self._stop.is_set() and not session.closed.is_set():
                while not self._nacks.empty():
                    req, msg = self._nacks.get()
                    try:
                        flow.nack(msg)
                        session.send({"op": "ok", "req": req, "upto": self._sent})
                    except PartqError as exc:
                        session.send(error_frame(req, exc))
                try:
                    msgs = flow.receive(PUSH_BATCH, timeout=PUMP_WAIT)
                except FlowClosed as exc:
                    session.send({"op": "closed", "flow": fid, "reason": flow.closed_reason
                                  or str(exc)})
                    return
                except PartqError as exc:      # a corrupt record: the client raises it
                    session.send({**error_frame(None, exc), "flow": fid})
                    continue
                if msgs:
                    self._sent += 1
                    session.send({"op": "deliver", "flow": fid, "n": self._sent, "messages": [
                        [m.partition, m.seq, m.key, m.payload, m.headers, m.publish_time_ns,
                         m.redelivered] for m in msgs]})
                for update in flow.events():
                    session.send({"op": "event", "flow": fid, "active": update.active,
                                  "partitions": sorted(update.partitions)})
                now = flow.partitions
                if now != partitions:
                    partitions = now
                    session.send({"op": "state", "flow": fid, "partitions": sorted(now)})
        except OSError:
            pass      # the session ends; it unbinds the flow
