"""The console's HTTP requests: the page's files, the JSON views, the actions.

    GET  /                          the page (static/index.html); /static/NAME its files
    GET  /api/overview              every queue, the store, replication, a chart
    GET  /api/queue?name=Q          one queue (``Views.queue``)
    GET  /api/messages?name=Q[&partition=P][&key=K][&from_seq=S][&limit=N][&dead=1]
    POST /api/action/NAME           an action (``partq.console.actions``), a JSON object body

Every answer closes its connection (HTTP/1.0): a request is read and answered within the
console's deadline, so an idle or slow peer holds nothing. Errors are JSON ``{"error": ...}``
with the status a library error maps to (404 for a missing queue, 400 for a wrong argument,
409 for a refused change).
"""
from __future__ import annotations

import json
import logging
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from partq.console import actions
from partq.console.access import CSRF_HEADER
from partq.errors import InvalidConfig, PartitionNotFound, PartqError, QueueNotFound
from partq.ops.formatting import one_line

if TYPE_CHECKING:
    from partq.console.server import Console

log = logging.getLogger("partq.console")

MAX_BODY = 16 << 10          # bytes of an action's body
STATIC = {"index.html": "text/html; charset=utf-8",
          "console.js": "text/javascript; charset=utf-8",
          "console.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # the page's own files only: no inline script, nothing fetched from elsewhere
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
}


def static_file(name: str) -> bytes:
    return resources.files("partq.console").joinpath("static", name).read_bytes()


def _status_of(exc: PartqError) -> int:
    if isinstance(exc, (QueueNotFound, PartitionNotFound)):
        return 404
    if isinstance(exc, InvalidConfig):
        return 400
    return 409


class Handler(BaseHTTPRequestHandler):
    """One request. ``console`` is set on the class the server builds (``handler_for``)."""

    console: Console
    server_version = "partq-console"
    protocol_version = "HTTP/1.0"

    # ------------------------------------------------------------------ answers
    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, doc) -> None:
        body = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
        self._send(status, body, "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def log_message(self, format: str, *args) -> None:
        log.debug("console: %s: " + format, self.client_address[0], *args)

    # ------------------------------------------------------------------ requests
    def _admitted(self) -> bool:
        refusal = self.console.access.refuse_peer(self.client_address[0],
                                                  self.headers.get("Host"))
        if refusal is not None:
            log.warning("console refused %s: %s", self.client_address[0], refusal)
            self._error(403, refusal)
            return False
        return True

    def _authorized(self) -> bool:
        if self.console.access.authorized(self.headers.get("Authorization")):
            return True
        self._error(401, "this console needs its token: send it as 'Authorization: Bearer TOKEN' "
                         "(the page asks for it)")
        return False

    def do_GET(self) -> None:
        if not self._admitted():
            return
        url = urlsplit(self.path)
        path = url.path
        if path in ("/", "/index.html"):
            return self._send(200, static_file("index.html"), STATIC["index.html"])
        if path.startswith("/static/"):
            name = path[len("/static/"):]
            if name not in STATIC:
                return self._error(404, f"no file {name!r}")
            return self._send(200, static_file(name), STATIC[name])
        if not path.startswith("/api/"):
            return self._error(404, f"no page {path!r}; the console is at /")
        if not self._authorized():
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            self._api(path, query)
        except PartqError as exc:
            self._error(_status_of(exc), one_line(str(exc)))
        except ValueError as exc:
            self._error(400, one_line(str(exc)))

    do_HEAD = do_GET

    def _api(self, path: str, query: dict[str, str]) -> None:
        views = self.console.views
        if path == "/api/overview":
            return self._json(200, views.overview_json()[:-1] + self._session())
        if path == "/api/queue":
            return self._json(200, views.queue(_required(query, "name")))
        if path == "/api/messages":
            partition = query.get("partition")
            return self._json(200, views.messages(
                _required(query, "name"),
                partition=int(partition) if partition not in (None, "") else None,
                key=query.get("key") or None, from_seq=int(query.get("from_seq") or 0),
                limit=int(query.get("limit") or 100), dead=query.get("dead") in ("1", "true")))
        return self._error(404, f"no view {path!r}")

    def _session(self) -> bytes:
        """The end of the overview's JSON object: the session fields the page needs."""
        extra = {"actions": self.console.allow_actions, "csrf": self.console.access.csrf}
        return b"," + json.dumps(extra, separators=(",", ":")).encode()[1:]

    def do_POST(self) -> None:
        if not self._admitted() or not self._authorized():
            return
        path = urlsplit(self.path).path
        if not path.startswith("/api/action/"):
            return self._error(404, f"no action at {path!r}")
        if not self.console.allow_actions:
            log.warning("console refused an action of %s: actions are off",
                        self.client_address[0])
            return self._error(403, "actions are off: start the console with --allow-actions "
                                    "to requeue, kill, ack, pause or scale from it")
        refusal = self.console.access.refuse_action(self.headers.get(CSRF_HEADER),
                                                    self.headers.get("Origin"),
                                                    self.headers.get("Host"))
        if refusal is not None:
            log.warning("console refused an action of %s: %s", self.client_address[0], refusal)
            return self._error(403, refusal)
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return self._error(400, "Content-Length must be a number")
        if not 0 <= length <= MAX_BODY:
            return self._error(413, f"an action's body is at most {MAX_BODY} bytes")
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._error(400, "an action's body must be a JSON object")
        if not isinstance(body, dict):
            return self._error(400, "an action's body must be a JSON object")
        try:
            result = actions.run(self.console.broker, path[len("/api/action/"):], body,
                                 self.client_address[0])
        except PartqError as exc:
            return self._error(_status_of(exc), one_line(str(exc)))
        self.console.views.invalidate()
        self._json(200, result)


def _required(query: dict[str, str], name: str) -> str:
    value = query.get(name)
    if not value:
        raise InvalidConfig(f"the request needs ?{name}=")
    return value
