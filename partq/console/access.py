"""Who may read the console and who may act through it: the rules of every partq listener, in
HTTP's words.

- Protected mode: without a token only loopback peers are served, and only under a loopback
  host name (``Host: 127.0.0.1:PORT``, ``localhost``, ``[::1]``), so a web page elsewhere cannot
  read the console through a DNS name it points at 127.0.0.1 (DNS rebinding).
- Beyond loopback a peer is served only when the console has a token and TLS: the token travels
  in each request (``Authorization: Bearer TOKEN``), so it must never cross a network in the
  clear. The page's own files carry no data and are served to any peer the first rule admits;
  every ``/api/`` request must carry the token when there is one (loopback peers too).
- Actions (``--allow-actions``) are POSTs that must carry the console's CSRF token (a random
  value the overview hands the page, which a page of another origin cannot read) in the
  ``X-Partq-Csrf`` header, and, when the browser says where a request comes from (``Origin``),
  come from the console's own origin. A custom header also makes browsers ask before sending a
  cross-origin request (a preflight), which the console never grants.
"""
from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from partq.wire.listener import is_loopback

CSRF_HEADER = "X-Partq-Csrf"


class Access:
    def __init__(self, token: bytes | None, tls: bool) -> None:
        self.token, self.tls = token, tls
        self.csrf = secrets.token_urlsafe(24)

    def refuse_peer(self, peer_host: str, host_header: str | None) -> str | None:
        """Why a request of ``peer_host`` naming ``host_header`` is not served (None: it is)."""
        if not is_loopback(peer_host):
            if self.token is None:
                return ("this console is in protected mode (it has no token) and serves loopback "
                        "peers only; start it with --token-file and --tls-cert/--tls-key to "
                        "serve other hosts")
            if not self.tls:
                return ("this console has no TLS: it serves other hosts only over TLS, so that "
                        "the token never crosses the network in the clear (--tls-cert, "
                        "--tls-key)")
        if self.token is None and not is_loopback(_host_name(host_header)):
            return (f"this console has no token and answers only to a loopback host name "
                    f"(127.0.0.1, localhost), not {host_header!r}")
        return None

    def authorized(self, authorization: str | None) -> bool:
        """Whether an ``/api/`` request carrying this ``Authorization`` header may read."""
        if self.token is None:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                  self.token)

    def refuse_action(self, csrf: str | None, origin: str | None,
                      host_header: str | None) -> str | None:
        """Why a POST with these headers may not act (None: it may)."""
        if csrf is None or not hmac.compare_digest(csrf.encode(), self.csrf.encode()):
            return (f"an action must carry the console's {CSRF_HEADER} header (the page sends "
                    f"it; scripts read it from /api/overview's csrf)")
        if origin is not None and urlsplit(origin).netloc != (host_header or ""):
            return f"an action must come from the console's own page, not from {origin!r}"
        return None


def _host_name(host_header: str | None) -> str:
    """The host of a ``Host`` header: "127.0.0.1:8080" -> "127.0.0.1", "[::1]:80" -> "::1"."""
    if not host_header:
        return ""
    return urlsplit("//" + host_header).hostname or ""
