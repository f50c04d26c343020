"""The console in a real headless Chromium: ``partq serve --console-listen`` on a live directory
with a consumer bound over the network; the page lists the queues, their depths and flows,
follows a queue to its partitions and flows, charts messages as they flow, and requeues a dead
message when actions are allowed (``partq console`` without --allow-actions refuses it).

Each page's screenshot is taken by these tests; with PARTQ_SCREENSHOTS=1 they are written to
docs/console/*.png (the ones docs/console.md shows), otherwise to a scratch directory.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from chromium import INSTALL_HINT, Browser, chromium_binary
from helpers import wait_until
from tools_helpers import PARTQ_SCRIPT

import partq

REPO = Path(__file__).resolve().parents[2]
BINARY = chromium_binary()
pytestmark = pytest.mark.skipif(BINARY is None, reason=INSTALL_HINT)


def _start(*args: str) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen([PARTQ_SCRIPT, *args, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(proc.stderr.read())
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A served directory: queues jobs (4 partitions, dead messages to dmq) and dmq, a client
    with flow worker-1 bound to jobs, and the console of the serving process (actions on)."""
    data = tmp_path_factory.mktemp("console") / "data"
    with partq.Broker.open(data) as broker:
        broker.create_queue("dmq")
        broker.create_queue("jobs", partitions=4, rebalance_delay=0, dead_message_queue="dmq")
        broker.create_queue("audit", partitions=2, ordering="key", max_depth=1000)
    proc, started = _start("--data", str(data), "serve", "--listen", "127.0.0.1:0",
                           "--console-listen", "127.0.0.1:0", "--console-allow-actions")
    client = partq.connect(started["listen"])
    flow = client.bind("jobs", name="worker-1")
    client.publish_many("jobs", [(f"job {i}".encode(), f"k{i}") for i in range(10)])
    client.publish_many("audit", [(b"entry", "user-1")] * 3)
    yield {"data": data, "console": started["console"], "client": client, "flow": flow,
           "proc": proc}
    client.close()
    err = _stop(proc)
    assert "Traceback" not in err, err


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(BINARY, str(tmp_path_factory.mktemp("chromium-profile")))
    yield b
    b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    if os.environ.get("PARTQ_SCREENSHOTS") == "1":
        out = REPO / "docs" / "console"
        out.mkdir(exist_ok=True)
        return out
    return tmp_path_factory.mktemp("screenshots")


def _cells(browser: Browser, table: str, cls: str) -> list[str]:
    return browser.js(f"[...document.querySelectorAll('#{table} tbody td.{cls}')]"
                      f".map(td => td.textContent)")


def test_the_overview_shows_the_queues_their_depths_and_flows(live, browser, shots):
    browser.go(live["console"])
    browser.wait_for("document.querySelector('tr[data-queue=\"jobs\"] td.depth')?.textContent "
                     "=== '10'", "jobs with depth 10 on the overview")
    assert browser.js("[...document.querySelectorAll('#queues tbody tr')]"
                      ".map(tr => tr.dataset.queue)") == ["audit", "dmq", "jobs"]
    assert _cells(browser, "queues", "flows") == ["0", "0", "1"]
    assert _cells(browser, "queues", "depth") == ["3", "0", "10"]
    assert _cells(browser, "queues", "ordering") == ["key", "partition", "partition"]
    assert browser.js("document.querySelector('#replication').textContent").startswith(
        "replicationprimary")
    assert "%" in browser.js("document.querySelector('tr[data-queue=\"audit\"] td.quota')"
                             ".textContent")


def test_following_a_queue_shows_its_partitions_owner_flow_and_flows(live, browser, shots):
    browser.go(live["console"])
    browser.wait_for("!!document.querySelector('tr[data-queue=\"jobs\"] a')", "the jobs link")
    browser.js("document.querySelector('tr[data-queue=\"jobs\"] a').click()")
    browser.wait_for("document.querySelectorAll('#partitions tbody tr').length === 4",
                     "the four partitions of jobs")
    assert browser.js("location.hash") == "#/queue/jobs"
    assert _cells(browser, "partitions", "flow") == ["worker-1"] * 4
    assert _cells(browser, "partitions", "status") == ["Ready"] * 4
    assert sum(int(d) for d in _cells(browser, "partitions", "depth")) == 10
    assert _cells(browser, "flows", "flow") == ["worker-1"]
    assert _cells(browser, "flows", "state") == ["active"]
    assert "pid" in _cells(browser, "flows", "client")[0]
    assert '"rebalance_status"' in browser.js("document.querySelector('#rebalance').textContent")
    browser.screenshot(str(shots / "queue.png"))


def test_the_chart_moves_as_messages_flow(live, browser, shots):
    browser.go(live["console"] + "#/")
    browser.wait_for("!!document.querySelector('#overview-chart')", "the overview's chart")
    client, flow, stop = live["client"], live["flow"], threading.Event()

    def traffic():
        while not stop.is_set():
            client.publish_many("jobs", [(b"tick", f"t{i}") for i in range(20)])
            for m in flow.receive(100, timeout=0.05):
                flow.ack(m)
            stop.wait(0.05)
    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        chart = "document.querySelector('#overview-chart')"
        browser.wait_for(f"Number({chart}.dataset.lastIn) > 0 && Number({chart}.dataset.lastOut)"
                         f" > 0", "the chart to show messages in and out", timeout=60)
        before = browser.js(f"{chart}.querySelector('polyline.in').getAttribute('points')")
        browser.wait_for(f"{chart}.querySelector('polyline.in').getAttribute('points') !== "
                         f"{json.dumps(before)}", "the chart to move", timeout=30)
        assert browser.js(f"Number({chart}.dataset.samples)") >= 2
        browser.wait_for("Number(document.querySelector('tr[data-queue=\"jobs\"] td.in')"
                         ".textContent.split('/')[0]) > 0", "the publish rate of jobs")
        browser.screenshot(str(shots / "overview.png"))
    finally:
        stop.set()
        worker.join()


def test_a_dead_message_is_requeued_after_a_confirmation(live, browser, shots):
    client, flow = live["client"], live["flow"]
    client.publish("jobs", b"cannot be processed", key="poison")
    msgs = wait_until(lambda: [m for m in flow.receive(100, timeout=0.2)
                               if m.payload == b"cannot be processed" or flow.ack(m)], 30,
                      "the poison message")
    flow.reject(msgs[0])
    browser.go(live["console"] + "#/messages/dmq?dead=1")
    browser.wait_for("document.querySelector('#messages tbody td.reason')?.textContent === "
                     "'rejected'", "the dead message with its reason")
    assert _cells(browser, "messages", "origin") == ["jobs"]
    assert _cells(browser, "messages", "key") == ["poison"]
    browser.screenshot(str(shots / "dead.png"))
    browser.js("window.asked = []; window.confirm = q => { window.asked.push(q); return true; }")
    browser.js("document.querySelector('#requeue-all').click()")
    browser.wait_for("document.querySelector('#notice').textContent.includes('partq dead "
                     "requeue dmq')", "the requeue's notice")
    assert "Requeue the dead messages of dmq" in browser.js("window.asked[0]")
    browser.wait_for("document.querySelectorAll('#messages tbody tr').length === 0",
                     "the dead message gone from dmq")
    back = wait_until(lambda: [m for m in flow.receive(100, timeout=0.2)
                               if m.payload == b"cannot be processed" or flow.ack(m)], 30,
                      "the requeued message delivered again")
    assert back[0].key == "poison"
    flow.ack(back[0])


def test_without_allow_actions_the_page_offers_none_and_the_console_refuses_them(live, browser):
    client, flow = live["client"], live["flow"]
    client.publish("jobs", b"dies again", key="poison-2")
    msgs = wait_until(lambda: [m for m in flow.receive(100, timeout=0.2)
                               if m.payload == b"dies again" or flow.ack(m)], 30, "the message")
    flow.reject(msgs[0])
    proc, started = _start("--data", str(live["data"]), "console", "--listen", "127.0.0.1:0")
    # its --json line holds what docs/cli.md's --json table says
    assert set(started) == {"console", "address", "actions", "token", "tls"}, started
    try:
        browser.go(started["console"] + "#/messages/dmq?dead=1")
        browser.wait_for("document.querySelector('#messages tbody td.reason')?.textContent === "
                         "'rejected'", "the dead message")
        assert browser.js("document.querySelector('#requeue-all') === null")
        assert browser.js("document.querySelectorAll('#messages button').length") == 0
        answer = browser.js("""(async () => {
            const o = await (await fetch('/api/overview')).json();
            const r = await fetch('/api/action/requeue', {method: 'POST',
              headers: {'Content-Type': 'application/json', 'X-Partq-Csrf': o.csrf},
              body: JSON.stringify({queue: 'dmq'})});
            return [r.status, (await r.json()).error];
        })()""")
        assert answer[0] == 403 and "--allow-actions" in answer[1]
    finally:
        err = _stop(proc)
    assert "refused an action" in err
    with partq.Broker.open(live["data"], create=False) as broker:
        assert broker.queue_status("dmq").depth == 1
