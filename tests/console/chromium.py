"""A real headless Chromium driven over its DevTools protocol: start it on a URL, evaluate
JavaScript in the page, wait for the DOM to say something, take screenshots.

Chromium is Debian's ``chromium`` (``.ci/run`` and ``make test`` install it); the protocol's
websocket is spoken by ``websocket-client`` (the test extra).
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import urllib.request

from helpers import wait_until

INSTALL_HINT = ("chromium is not installed: `.ci/run` and `make test` install it "
                "(apt-get install chromium)")


def chromium_binary() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium with one page, until ``close()``."""

    def __init__(self, binary: str, profile: str, url: str = "about:blank") -> None:
        import websocket
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--disable-extensions", "--hide-scrollbars",
             "--window-size=1400,1000", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = os.path.join(profile, "DevToolsActivePort")
        wait_until(lambda: os.path.exists(port_file) and open(port_file).read().count("\n"), 60,
                   "chromium's DevTools port")
        port = int(open(port_file).read().split()[0])

        def page_target():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            return pages[0] if pages else None
        target = wait_until(page_target, 30, "chromium's page")
        self.ws = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self._ids = itertools.count(1)
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, **params):
        """Send one protocol command and return its result (events meanwhile are dropped)."""
        mid = next(self._ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise AssertionError(f"{method}: {msg['error']}")
                return msg["result"]

    def js(self, expression: str):
        """The value of ``expression`` in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout: float = 30):
        """Poll ``expression`` in the page until it is truthy; return its value."""
        return wait_until(lambda: self.js(expression), timeout, what, interval=0.1)

    def go(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def screenshot(self, path: str) -> None:
        """A PNG of the whole page at ``path``."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": min(size["width"], 1400),
                               "height": min(size["height"], 2400), "scale": 1})
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
