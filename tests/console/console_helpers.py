"""Talking to a console over real HTTP: GETs and POSTs that return the status and the JSON."""
from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit


def request(url: str, method: str, path: str, body: dict | bytes | None = None,
            headers: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
    """``(status, JSON answer)`` of one request to the console at ``url``."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=raw, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read() or b"null")
    finally:
        conn.close()


def get(url: str, path: str, headers: dict | None = None) -> tuple[int, dict]:
    return request(url, "GET", path, headers=headers)


def act(url: str, name: str, body: dict, csrf: str | None = None,
        headers: dict | None = None) -> tuple[int, dict]:
    """POST action ``name``; ``csrf`` read from the overview when not given."""
    if csrf is None:
        csrf = get(url, "/api/overview", headers)[1]["csrf"]
    sent = {"Content-Type": "application/json", "X-Partq-Csrf": csrf, **(headers or {})}
    return request(url, "POST", f"/api/action/{name}", body, sent)
