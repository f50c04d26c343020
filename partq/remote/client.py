"""``partq.connect``: publish and consume through ``partq serve`` from any host (rule `serve`).

    client = partq.connect("10.0.0.5:7020", token=open("token").read(), ssl=ssl_context)
    client.publish("orders", b"payload", key="customer-42")     # durable when it returns
    flow = client.bind("orders", name="svc-a")                 # a Flow, as Broker.bind gives
    for msg in flow.receive(max_messages=100, timeout=1.0):
        flow.ack(msg)

A client keeps one connection. Messages are pushed to it within the flow's credit
(``max_delivered_unacked_per_flow``), so receiving costs no round trip; acks travel in batches
(``ack_many``) and return once durable. When the connection drops the client reconnects with
backoff and binds its flows again, presenting each one's partition set as its hint (rule `bind-hint`): back
within the rebalance delay, a flow gets its partitions back. Requests made meanwhile wait for
the connection (up to the client's timeout); a publish whose answer was lost with the
connection raises ``ServerUnavailable``: it may or may not be stored (an unknown outcome, as
with Kafka).
"""
from __future__ import annotations

import logging
import os
import socket
import ssl as ssl_module
import threading
import time
from collections.abc import Iterable

from partq import errors
from partq.clock import MAX_SECONDS
from partq.config import QueueConfig
from partq.errors import (
    ConnectionEnded,
    FrameError,
    PartqError,
    ProtocolMismatch,
    ServerUnavailable,
)
from partq.flow import Flow
from partq.message import PublishResult
from partq.publish.encode import check_types
from partq.remote.answers import EachAnswer, items_of, result_of, results_of, unsendable
from partq.remote.endpoint import RemoteEndpoint, RemotePending
from partq.remote.singles import Singles
from partq.status import FlowStatus, PartitionStatus, QueueStatus
from partq.storage.txn import check_queue_name
from partq.wire.frames import HEADER, Outbox, encode_frame, parse_address, read_frame
from partq.wire.handshake import client_handshake, read_token
from partq.wire.tls import Conn, serial

log = logging.getLogger("partq.client")

# the largest frame read from the server: one message of the largest max_message_size a queue
# may have, with room for its key and headers (the server cuts deliveries into frames of a few
# MiB; only a message larger than that travels alone)
MAX_FRAME = (1 << 30) + (1 << 20)
BACKOFF = (0.05, 2.0)
RECONNECT_TIMEOUT = 300.0    # seconds a client tries to reconnect before it gives up


def connect(address: str, token: str | bytes | None = None,
            ssl: ssl_module.SSLContext | bool | None = None, *, token_file: str | None = None,
            timeout: float = 10.0, reconnect_timeout: float = RECONNECT_TIMEOUT) -> Client:
    """Connect to ``partq serve`` at ``HOST:PORT``. ``token`` (or ``token_file``) proves this
    client to the server by challenge-response (the token is never sent); ``ssl``: a client
    ``SSLContext`` to speak TLS (the server must have ``--tls-cert``), or True for the system's
    default context (certificates checked against the system's authorities and the host
    name). Raises ``ServerUnavailable``, ``AuthenticationFailed`` or ``ProtocolMismatch`` with
    what to do, and ``InvalidConfig`` for an ``ssl`` that is neither.

    A lost connection is made again with backoff for up to ``reconnect_timeout`` seconds (300
    by default); then the client gives up: its flows raise ``FlowClosed`` saying so, and its
    requests ``ServerUnavailable``."""
    if not reconnect_timeout > 0:
        raise errors.InvalidConfig(f"reconnect_timeout must be > 0 seconds, not "
                                   f"{reconnect_timeout!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout <= MAX_SECONDS:      # (NaN is none of them)
        raise errors.InvalidConfig(f"timeout must be a number of seconds above 0, at most "
                                   f"{MAX_SECONDS:g}, not {timeout!r}")
    return Client(address, read_token(token, token_file), client_context(ssl), timeout,
                  reconnect_timeout)


def client_context(ssl: ssl_module.SSLContext | bool | None) -> ssl_module.SSLContext | None:
    if ssl is True:
        return ssl_module.create_default_context()
    if ssl is None or ssl is False:
        return None
    if isinstance(ssl, ssl_module.SSLContext):
        return ssl
    raise errors.InvalidConfig(f"ssl must be an ssl.SSLContext, True (the default context) or "
                               f"None, not {type(ssl).__name__}")


class _HandshakeDropped(ServerUnavailable):
    """The server closed the connection during the handshake (``Client._first_open``)."""


def _hang_up(sock: Conn, stream, outbox: Outbox) -> None:
    """Close a connection the reader gave up on: the server sees it end (and unbinds its
    flows), and its writer thread stops."""
    outbox.close()
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    stream.close()
    sock.close()


class Client:
    def __init__(self, address: str, token: bytes | None,
                 ssl_context: ssl_module.SSLContext | None, timeout: float,
                 reconnect_timeout: float = RECONNECT_TIMEOUT) -> None:
        self.address = address
        self._addr = parse_address(address)
        self._token, self._ssl, self.timeout = token, ssl_context, timeout
        self._lock = threading.Lock()
        self._connected = threading.Condition(self._lock)
        self._requests: dict[int, RemotePending | EachAnswer] = {}
        self._singles = Singles()       # publish_async calls not sent yet
        self._next_req = 0
        self._flows: dict[str, RemoteEndpoint] = {}
        self._unbound: list[RemoteEndpoint] = []    # to bind again on the next connection
        self._reconnecting = threading.Lock()       # one reconnect at a time, in order
        self._closed = False
        self.reconnect_timeout = reconnect_timeout
        self._gone: str | None = None           # why the client gave up reconnecting
        self._client_id = os.urandom(8).hex()   # the same on every connection of this client
        self._beat = 10.0
        self.max_frame = MAX_FRAME
        self._outbox: Outbox | None = None
        self._sock: Conn | None = None
        self._sock = self._first_open()
        self._start(self._sock)

    # ------------------------------------------------------------------ connection
    def _first_open(self) -> Conn:
        """``_open``, again while the server drops the handshake (it sheds the oldest
        handshake when too many connections are in theirs: a flood of clients, or an attack),
        for up to ``timeout`` seconds. A server that cannot be reached, or refuses the token,
        fails at once."""
        deadline = time.monotonic() + self.timeout
        delay = BACKOFF[0]
        while True:
            try:
                return self._open()
            except _HandshakeDropped as exc:
                if time.monotonic() + delay >= deadline:
                    raise ServerUnavailable(str(exc)) from None     # the public class
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF[1])

    def _open(self) -> Conn:
        try:
            sock = socket.create_connection(self._addr, timeout=self.timeout)
        except OSError as exc:
            raise ServerUnavailable(f"cannot reach partq serve at {self.address}: "
                                    f"{exc.strerror or exc}; check the address and that the "
                                    f"server runs") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=self._addr[0])
            hello = client_handshake(sock, "serve", self._token, self.timeout, pid=os.getpid(),
                                     host=socket.gethostname(), client_id=self._client_id)
        except TimeoutError:
            sock.close()
            # a TLS server waits for the client's TLS hello and sends nothing: not a moment's
            # failure, so not tried again
            tls = ("; if it serves TLS (--tls-cert), connect with ssl=... (or --tls-ca)"
                   if self._ssl is None else "")
            raise ServerUnavailable(f"partq serve at {self.address} sent no hello within "
                                    f"{self.timeout:g} s{tls}") from None
        except (OSError, FrameError) as exc:
            sock.close()
            # a TLS failure is the configuration's, not the moment's: never tried again
            kind = ServerUnavailable if isinstance(exc, ssl_module.SSLError) else _HandshakeDropped
            raise kind(f"partq serve at {self.address} dropped the connection during the "
                       f"handshake ({exc}); check TLS and the token") from None
        except PartqError:
            sock.close()
            raise
        self.max_frame = int(hello.get("max_frame", MAX_FRAME))
        return serial(sock)     # read by one thread, written by others: TLS needs a lock

    def _start(self, sock: Conn) -> None:
        self._outbox = Outbox(sock, "partq-client-send", gather=self._gather, direct="wait")
        threading.Thread(target=self._read_loop, args=(sock, self._outbox),
                         name="partq-client-read", daemon=True).start()
        threading.Thread(target=self._beat_loop, args=(sock, self._outbox),
                         name="partq-client-beat", daemon=True).start()

    def _read_loop(self, sock: Conn, outbox: Outbox) -> None:
        """Hand the server's frames to the requests and flows they answer until the connection
        ends, or until a frame is neither an answer nor a push this client can read (logged):
        either way this connection is closed and the client reconnects (``_lost``)."""
        stream = sock.makefile("rb", buffering=1 << 16)
        why = "the server closed it"
        try:
            while True:
                frame = read_frame(stream, MAX_FRAME)
                if not isinstance(frame, dict):
                    raise ProtocolMismatch(f"a frame that is a {type(frame).__name__}, not a map")
                self._dispatch(frame)
        except ConnectionEnded:
            pass
        except (FrameError, OSError) as exc:     # damaged, or broken (ssl.SSLError included)
            why = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a frame it cannot make sense of: this connection is lost
            why = (str(exc) if isinstance(exc, ProtocolMismatch)
                   else f"a frame this client cannot read ({exc!r})")
            log.warning("partq serve at %s sent %s; dropping the connection", self.address, why)
        finally:
            _hang_up(sock, stream, outbox)
        self._lost(sock, why)

    def _dispatch(self, frame: dict) -> None:
        req = frame.get("req")
        if req is not None:
            with self._lock:
                pending = self._requests.pop(req, None)
            if pending is not None:
                pending.resolve(frame)
            return
        with self._lock:
            endpoint = self._flows.get(str(frame.get("flow")))
        if endpoint is not None:
            endpoint.pushed(frame)

    def _beat_loop(self, sock: Conn, outbox: Outbox) -> None:
        while self._sock is sock and not self._closed:
            time.sleep(min(self._beat / 4, 1.0))
            try:
                outbox.put({"op": "beat"})
            except OSError:
                return
            self._unbind_hung()

    def _unbind_hung(self) -> None:
        """Unbind the flows whose handler hangs (rule `max-poll-interval`), each in a thread
        of its own (unbinding waits for the server's answer)."""
        with self._lock:
            endpoints = list(self._flows.values())
        for endpoint in endpoints:
            reason = endpoint.hung()
            if reason is not None:
                log.warning("flow %s of queue %r unbound: %s", endpoint.name or endpoint.flow_id,
                            endpoint.queue, reason)
                threading.Thread(target=endpoint.unbind, args=(f"unbound by the client: {reason}",),
                                 name="partq-unbind-hung", daemon=True).start()

    def _lost(self, sock: Conn, why: str) -> None:
        with self._lock:
            if self._sock is not sock:
                return
            self._sock = None
            pending, self._requests = list(self._requests.values()), {}
            flows = list(self._flows.values())
        for p in pending:
            p.resolve(None, ServerUnavailable(f"lost the connection to {self.address} ({why}) "
                                              f"before the answer: the request may or may not "
                                              f"have taken effect"))
        if self._closed:
            return
        for endpoint in flows:
            endpoint.disconnected()
        log.warning("lost the connection to %s (%s); reconnecting", self.address, why)
        threading.Thread(target=self._reconnect, name="partq-client-reconnect",
                         daemon=True).start()

    def _reconnect(self) -> None:
        """Open a new connection and bind the flows again. One reconnect runs at a time: a
        connection lost while its flows were being bound again leaves them to the next one,
        which starts once this one ended (a flapping network loses no flow)."""
        with self._reconnecting:
            delay = BACKOFF[0]
            deadline = time.monotonic() + self.reconnect_timeout
            while not self._closed:
                try:
                    sock = self._open()
                except PartqError as exc:
                    if time.monotonic() >= deadline:
                        self._give_up(f"could not reach partq serve at {self.address} for "
                                      f"{self.reconnect_timeout:g} s ({exc}); connect again")
                        return
                    log.info("reconnecting to %s: %s", self.address, exc)
                    time.sleep(delay)
                    delay = min(delay * 2, BACKOFF[1])
                    continue
                with self._lock:
                    flows = self._unbound + list(self._flows.values())
                    self._flows, self._unbound = {}, []
                    self._start(sock)           # its outbox exists before requests can use it
                    self._sock = sock
                    self._connected.notify_all()
                self._bind_again(flows, sock)
                return

    def _bind_again(self, flows: list[RemoteEndpoint], sock: Conn) -> None:
        again = []
        for endpoint in flows:
            try:
                endpoint.rebind()
            except ServerUnavailable as exc:
                if self._sock is sock:
                    endpoint.lost(f"could not bind again after a reconnect: {exc}")
                else:
                    again.append(endpoint)     # this connection was lost too: the next one
            except PartqError as exc:
                endpoint.lost(f"could not bind again after a reconnect: {exc}")
        with self._lock:
            self._unbound += again
        log.info("reconnected to %s; %d flow(s) bound again%s", self.address,
                 len(flows) - len(again), f", {len(again)} left to the next connection"
                 if again else "")

    def _give_up(self, reason: str) -> None:
        log.warning("%s", reason)
        with self._lock:
            self._gone = reason
            flows = self._unbound + list(self._flows.values())
            self._flows, self._unbound = {}, []
            self._connected.notify_all()
        for endpoint in flows:
            endpoint.lost(reason)

    def request(self, frame: dict, convert=lambda frame: frame) -> RemotePending:
        """Send a request; the returned handle's ``result()`` gives the converted answer."""
        pending = RemotePending(convert)
        with self._lock:
            self._wait_connected()
            self._next_req += 1
            req = self._next_req
            data = self._check_fits({**frame, "req": req})
            self._requests[req] = pending
            outbox = self._outbox
        try:
            if outbox is not None:
                outbox.put(data)
        except OSError:
            pass      # the reading thread resolves it with the loss
        return pending

    def _check_fits(self, frame: dict) -> bytes:
        """``frame`` encoded; ``InvalidMessage`` when it is over the server's frame limit (the
        server would end the connection, and the request's fate would look unknown)."""
        data = encode_frame(frame)
        if len(data) - HEADER.size > self.max_frame:
            raise errors.InvalidMessage(
                f"the request is {len(data)} bytes and partq serve at {self.address} takes "
                f"frames of at most {self.max_frame}: split the batch (or raise the "
                f"server's --max-frame)")
        return data

    def call(self, frame: dict, convert=lambda frame: frame):
        return self.request(frame, convert).result(self.timeout + 60)

    # ------------------------------------------------------------------ the API
    def publish(self, queue: str, payload: bytes, key: str | None = None,
                headers: dict | None = None) -> PublishResult:
        """Publish one message; return once it is durable on the server (rule `durable-publish`)."""
        return self.publish_async(queue, payload, key, headers).result()

    def publish_async(self, queue: str, payload: bytes, key: str | None = None,
                      headers: dict | None = None) -> RemotePending:
        """Publish without waiting: ``result()`` gives the ``PublishResult`` once durable.
        Many may be in flight on one connection: the ones made while a write is under way go
        together in the next frame, and into one of the server's commits (each message still
        succeeds or fails alone)."""
        check_queue_name(queue)
        check_types(payload, key, headers)     # here, not in the thread that sends it
        if len(payload) > self.max_frame // 4:
            self._check_fits({"op": "publish_each", "req": 1 << 63, "queue": queue,
                              "items": [[payload, key, headers]]})
        pending = RemotePending(result_of)
        with self._lock:
            if self._sock is None:
                self._wait_connected()
            self._singles.add(queue, [payload, key, headers], pending)
            outbox = self._outbox
        if outbox is not None:
            outbox.poke()
        return pending

    def _gather(self) -> list[bytes]:
        """The writer thread's hook: the single publishes made since its last write."""
        with self._lock:
            frames, answers = self._singles.frames(self._new_req, self.max_frame)
            self._requests.update(answers)
            return frames

    def _new_req(self) -> int:
        """Under the lock: the next request id."""
        self._next_req += 1
        return self._next_req

    def _wait_connected(self) -> None:
        """Under the lock: wait for a connection (up to the client's timeout)."""
        deadline = time.monotonic() + self.timeout
        while self._sock is None:
            if self._closed:
                raise errors.BrokerClosed("the client is closed; connect again")
            if self._gone is not None:
                raise ServerUnavailable(self._gone)
            if not self._connected.wait(max(deadline - time.monotonic(), 0)):
                raise ServerUnavailable(f"no connection to {self.address} for "
                                        f"{self.timeout:g} s")

    def publish_many(self, queue: str, items: Iterable) -> list[PublishResult]:
        """Publish a batch in one transaction on the server (all or nothing)."""
        items = items_of(items)
        try:
            pending = self.request({"op": "publish", "queue": queue, "items": items}, results_of)
        except PartqError:
            raise
        except (TypeError, ValueError, OverflowError):   # msgpack refused a message of it
            raise unsendable(items) or errors.InvalidMessage("the batch cannot be sent") from None
        return pending.result()

    def bind(self, queue: str, name: str | None = None, hint: Iterable[int] | None = None,
             skip_corrupt: bool = False) -> Flow:
        """Bind a flow (rules `bind-hint` and `named-flows`, as ``Broker.bind``); it has every method
        of ``Flow``."""
        endpoint = RemoteEndpoint(self, queue, name, skip_corrupt)
        endpoint.bind(None if hint is None else sorted(hint))
        return Flow(endpoint, queue, name, skip_corrupt)

    def attach(self, flow_id: str, endpoint: RemoteEndpoint, consumer_timeout: float) -> None:
        """Route ``flow_id``'s pushes to ``endpoint``; beat often enough for its queue."""
        with self._lock:
            self._flows[flow_id] = endpoint
            self._beat = min(self._beat, consumer_timeout)

    def detach(self, flow_id: str) -> None:
        with self._lock:
            self._flows.pop(flow_id, None)

    def queue_status(self, queue: str) -> QueueStatus:
        doc = self.call({"op": "status", "queue": queue})["status"]
        return QueueStatus(**{**doc, "partitions": [PartitionStatus(**p) for p in doc["partitions"]],
                              "flows": [FlowStatus(**f) for f in doc["flows"]]})

    def queue_config(self, name: str) -> QueueConfig:
        """The queue's settings, as ``Broker.queue_config``."""
        return QueueConfig.from_dict(self.call({"op": "config", "queue": name})["config"])

    def ensure_dead_message_queue(self, name: str) -> tuple[str, list[str]]:
        """As ``Broker.ensure_dead_message_queue``, done by the server."""
        reply = self.call({"op": "ensure_dead_queue", "queue": name})
        return reply["dead_message_queue"], list(reply["done"])

    def close(self) -> None:
        """Unbind every flow (a closed connection is an unbind) and close the connection."""
        with self._lock:
            self._closed = True
            sock, self._sock = self._sock, None
            self._connected.notify_all()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
