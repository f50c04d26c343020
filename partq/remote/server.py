"""``partq serve``: delivery and publishing of a directory's queues for clients on other hosts
(rule `serve`). A ``Server`` takes the delivery of every queue it can (other processes of the host then
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
    errors: error {req, error, message, and the error's fields}: the error's ``to_frame()``;
    the client raises ``partq.wire.error_frames.error_from_frame`` of it, the same class with
    the same fields (a ``CorruptRecord`` with its queue, partition and seq)

Pushes, from one pump thread per bound flow: ``deliver {flow, n, messages}`` (within the flow's
credit: at most ``max_delivered_unacked_per_flow`` unacked), ``state {flow, partitions}``,
``event {flow, active, partitions}``, ``closed {flow, reason}``. ``n`` counts a flow's deliver
frames; a nack's answer names the last one sent before the nack took effect, so the client drops
exactly the copies the nack gives back (they come again, marked redelivered, in order).

Liveness (rule `liveness`): a session that closes unbinds its flows at once; one silent for its queues'
``consumer_timeout`` (clients beat every quarter of it) is closed, with the same effect.
"""
from __future__ import annotations

import logging
import queue as queue_module
import socket
import ssl
import threading

from partq.errors import FlowClosed, FrameError, InvalidConfig, InvalidMessage, PartqError
from partq.jobs.staging import SPARK_OPS, spark_request
from partq.message import Message
from partq.wire.error_frames import error_frame
from partq.wire.frames import Outbox, read_frame
from partq.wire.listener import Limits, Listener

log = logging.getLogger("partq.server")

PUSH_BATCH = 500          # messages per deliver frame at most
PUSH_BYTES = 4 << 20      # payload and key bytes per deliver frame (one larger message goes alone)
PUMP_WAIT = 0.05          # seconds a pump waits for messages before it looks for nacks
MAX_ITEMS = 1 << 17       # items of any one array or map of a request, checked as it is decoded


class Server:
    def __init__(self, broker, listen: str, *, token: bytes | None = None,
                 ssl_context: ssl.SSLContext | None = None, limits: Limits = Limits()) -> None:
        self.broker = broker
        self.limits = limits
        for config in broker.queues():
            if not broker.dispatcher.take_over(config.name):
                log.info("queue %r is delivered by another process: its flows here follow it",
                         config.name)
        self._named: dict[tuple[str, str], Session] = {}    # named flows, by their session
        self._named_lock = threading.Lock()
        self.listener = Listener(listen, "serve", self._session, token=token,
                                 ssl_context=ssl_context, limits=limits)
        self.address = self.listener.address
        log.info("serving %s on %s%s", broker.path, self.address,
                 " with TLS" if ssl_context is not None else "")

    def _session(self, sock: socket.socket, hello: dict, where: str) -> None:
        who = f"{where} (pid {printable(hello.get('pid'))} on {printable(hello.get('host'))})"
        log.info("client %s connected", who)
        Session(self, sock, who, str(hello.get("client_id") or "")).run()

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


class Session:
    def __init__(self, server: Server, sock: socket.socket, who: str, client_id: str) -> None:
        self.server = server
        self.broker = server.broker
        self.sock = sock
        self.who = who
        self.client_id = client_id
        self.limits = server.limits
        self.flows: dict[str, Pump] = {}
        self._outbox = Outbox(sock, "partq-serve-send")
        self._completions: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self.closed = threading.Event()

    def send(self, frame: dict) -> None:
        """Queue a frame for the client (pumps, answers); written in batches by one thread."""
        self._outbox.put(frame)

    def wait_for_room(self, limit: int, timeout: float) -> bool:
        """Wait until fewer than ``limit`` bytes wait to be written to the client."""
        return self._outbox.wait_below(limit, timeout)

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
                if not self.wait_for_room(self.limits.max_pending_bytes, self.idle_timeout()):
                    reason = (f"read none of its answers for {self.idle_timeout():g} s "
                              f"({self._outbox.pending_bytes()} bytes waiting)")
                    break
                self.sock.settimeout(self.idle_timeout())
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
                pump.stop(unbind=True)       # a closed connection is an unbind, rule `liveness`
            log.info("client %s disconnected: %s; %d flow(s) unbound", self.who, reason,
                     len(flows))
            completer.join(timeout=5)
            stream.close()

    def _handle(self, frame: dict) -> None:
        op, req = frame.get("op"), frame.get("req")
        if op == "beat":
            return
        try:
            if op in ("publish", "publish_each") and len(frame.get("items") or ()) \
                    > self.limits.max_batch:
                raise InvalidMessage(f"a batch of {len(frame['items'])} items is over this "
                                     f"server's limit of {self.limits.max_batch}; publish it in "
                                     f"smaller batches")
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
                    "results": [r.to_frame() if isinstance(r, PartqError)
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
                    self._forget(leaving)
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
            elif op in SPARK_OPS:         # the Spark source with .option("address"), rule `spark-remote`
                self.send({"op": op, "req": req, **spark_request(self.broker, frame)})
            else:
                raise FrameError(f"unknown request {op!r}")
        except FrameError:
            raise                     # not a request: the session ends (run)
        except PartqError as exc:
            self.send(error_frame(exc, req=req))

    def _bind(self, req, frame: dict) -> None:
        queue = str(frame.get("queue"))
        hint = frame.get("hint")
        name = frame.get("name")
        if name is not None and (not isinstance(name, str) or not name.isprintable()):
            raise InvalidConfig("a flow name must be printable text (no control characters)")
        if len(self.flows) >= self.limits.max_flows:
            raise InvalidConfig(f"this connection has {len(self.flows)} flows bound, the server's "
                                f"limit; unbind one, or open another connection")
        if name is not None:
            self.server.claim_name(queue, name, self)
        flow = self.broker.bind(queue, name=name, hint=None if hint is None else list(hint),
                                skip_corrupt=bool(frame.get("skip_corrupt")))
        timeout = self.broker.queue_config(queue).consumer_timeout
        pump = Pump(self, flow, timeout)
        self.flows[flow.flow_id] = pump
        if name is not None:
            self.server.named(queue, name, self)
        self.send({"op": "bound", "req": req, "flow": flow.flow_id,
                   "partitions": sorted(flow.partitions), "consumer_timeout": timeout})
        log.info("client %s bound flow %s of queue %r: partitions %s", self.who,
                 flow.name or flow.flow_id, queue, sorted(flow.partitions))
        pump.start()

    def drop_named(self, queue: str, name: str) -> None:
        """Unbind this session's flow ``name`` of ``queue`` (its client is back on another
        connection); this connection is closed, as it is stale."""
        for fid, pump in list(self.flows.items()):
            if pump.flow.queue == queue and pump.flow.name == name:
                self.flows.pop(fid, None)
                pump.stop(unbind=True)
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _forget(self, pump: Pump) -> None:
        if pump.flow.name is not None:
            self.server.release_name(pump.flow.queue, pump.flow.name, self)

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
                frame = error_frame(exc, req=req)
            try:
                self.send(frame)
            except OSError:
                return


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
        batch_size = PUSH_BATCH     # fewer per receive when messages are large: what one
                                    # receive holds stays near PUSH_BYTES
        try:
            while not self._stop.is_set() and not session.closed.is_set():
                while not self._nacks.empty():
                    req, msg = self._nacks.get()
                    try:
                        flow.nack(msg)
                        session.send({"op": "ok", "req": req, "upto": self._sent})
                    except PartqError as exc:
                        session.send(error_frame(exc, req=req))
                if not session.wait_for_room(session.limits.max_push_bytes, PUMP_WAIT):
                    continue        # the client reads slowly: deliver more once it caught up
                try:
                    msgs = flow.receive(batch_size, timeout=PUMP_WAIT)
                except FlowClosed as exc:
                    session.send({"op": "closed", "flow": fid, "reason": flow.closed_reason
                                  or str(exc)})
                    return
                except PartqError as exc:      # a corrupt record: the client raises it
                    session.send(error_frame(exc, req=None, flow=fid))
                    continue
                batches = byte_batches(msgs, PUSH_BYTES)
                if msgs:
                    size = sum(message_bytes(m) for m in msgs) // len(msgs)
                    batch_size = max(1, min(PUSH_BATCH, PUSH_BYTES // max(size, 1)))
                for batch in batches:
                    self._sent += 1
                    session.send({"op": "deliver", "flow": fid, "n": self._sent, "messages": [
                        [m.partition, m.seq, m.key, m.payload, m.headers, m.publish_time_ns,
                         m.redelivered] for m in batch]})
                for update in flow.events():
                    session.send({"op": "event", "flow": fid, "active": update.active,
                                  "partitions": sorted(update.partitions)})
                now = flow.partitions
                if now != partitions:
                    partitions = now
                    session.send({"op": "state", "flow": fid, "partitions": sorted(now)})
        except OSError:
            pass      # the session ends; it unbinds the flow


def byte_batches(msgs: list[Message], limit: int) -> list[list[Message]]:
    """``msgs`` in order, cut into batches of at most ``limit`` bytes of payload, key and
    headers (a message larger than that goes alone): a deliver frame stays far below what a
    client reads, whatever the queue's max_message_size."""
    batches: list[list[Message]] = []
    size = limit
    for m in msgs:
        n = message_bytes(m)
        if size + n > limit and (not batches or batches[-1]):
            batches.append([])
            size = 0
        batches[-1].append(m)
        size += n
    return batches


def printable(value) -> str:
    """A value a client sent, fit for a log line: control characters escaped."""
    text = str(value)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def message_bytes(m: Message) -> int:
    """About the bytes of a message's payload, key and headers in a deliver frame (a header
    value that is not text or bytes counted as 8)."""
    return len(m.payload) + len(m.key or "") + sum(
        len(k) + (len(v) if isinstance(v, (bytes, str)) else 8)
        for k, v in (m.headers or {}).items())
