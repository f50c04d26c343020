// The partq console: a thin client of the JSON views of partq.console (no framework, no build).
// Pages by the URL's hash: #/ the overview, #/queue/NAME a queue, #/messages/NAME?... messages.
// Each page polls its view every `refresh` seconds (the server says how often) and redraws.
"use strict";

const state = { token: sessionStorage.getItem("partq-token"), csrf: null, actions: false,
                timer: null, route: null };

// ------------------------------------------------------------------ DOM helpers
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const td = (value, cls) => el("td", { class: cls }, value);
const num = (value, cls) => el("td", { class: "num " + (cls || "") }, value === null || value === undefined ? "–" : value);
function table(id, heads, rows) {
  return el("table", { id },
    el("thead", {}, el("tr", {}, heads.map(h => el("th", { class: h.endsWith("#") ? "num" : "" }, h.replace(/#$/, ""))))),
    el("tbody", {}, rows));
}
function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
const fmtRate = r => (r >= 100 ? r.toFixed(0) : r.toFixed(1)) + "/s";
function fmtAge(s) {
  if (s === null || s === undefined) return "–";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
const onOff = b => (b ? "on" : el("span", { class: "bad" }, "off"));
function useBar(fraction) {
  if (fraction === null || fraction === undefined) return "–";
  const pct = Math.min(100, Math.round(fraction * 100));
  const fill = el("span", {});
  fill.style.width = pct + "%";     // (a style attribute would break the page's CSP)
  return el("span", {}, el("span", { class: "bar" }, fill), ` ${pct}%`);
}
function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
}
function notice(text, error) {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.className = error ? "error" : "";
  box.hidden = !text;
}

// ------------------------------------------------------------------ the JSON API
async function api(path, options) {
  const headers = Object.assign({}, (options || {}).headers);
  if (state.token) headers["Authorization"] = "Bearer " + state.token;
  const answer = await fetch(path, Object.assign({}, options, { headers }));
  const doc = await answer.json().catch(() => ({ error: answer.statusText }));
  if (answer.status === 401) { askToken(); throw new Error(doc.error); }
  if (!answer.ok) throw new Error(doc.error || answer.statusText);
  return doc;
}

async function act(name, body, question) {
  if (!window.confirm(question)) return;
  try {
    const done = await api("/api/action/" + name, {
      method: "POST", body: JSON.stringify(body),
      headers: { "Content-Type": "application/json", "X-Partq-Csrf": state.csrf || "" } });
    notice("done: " + done.command + " → " + JSON.stringify(done.result));
  } catch (err) {
    notice(name + " refused: " + err.message, true);
  }
  show();
}

function askToken() {
  const form = document.getElementById("login");
  form.hidden = false;
  form.onsubmit = ev => {
    ev.preventDefault();
    state.token = document.getElementById("token").value.trim();
    sessionStorage.setItem("partq-token", state.token);
    form.hidden = true;
    show();
  };
}

// ------------------------------------------------------------------ the chart
function chart(id, series) {
  const W = 1200, H = 170, L = 60, B = 20;
  const peak = Math.max(1, ...series.in, ...series.out);
  const x = t => L + (W - L - 4) * (1 + t / series.window);
  const y = v => H - B - (H - B - 6) * (v / peak);
  const line = values => values.map((v, i) => `${x(series.t[i]).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
  const last = a => (a.length ? a[a.length - 1] : 0);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.id = id;
  svg.dataset.samples = series.t.length;
  svg.dataset.lastIn = last(series.in);
  svg.dataset.lastOut = last(series.out);
  svg.dataset.peak = peak;
  const add = (tag, attrs, text) => {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
  };
  add("line", { class: "axis", x1: L, y1: H - B, x2: W, y2: H - B });
  add("line", { class: "axis", x1: L, y1: 6, x2: L, y2: H - B });
  add("text", { x: 2, y: 14 }, fmtRate(peak));
  add("text", { x: 2, y: H - B }, "0");
  add("text", { x: L, y: H - 4 }, `-${Math.round(series.window / 60)} min`);
  add("text", { x: W - 28, y: H - 4 }, "now");
  add("polyline", { class: "in", points: line(series.in) });
  add("polyline", { class: "out", points: line(series.out) });
  return el("div", { class: "chart" }, svg,
    el("div", { class: "legend" }, el("span", { class: "in" }, `■ in ${fmtRate(last(series.in))}`),
       el("span", { class: "out" }, `■ out ${fmtRate(last(series.out))}`)));
}

// ------------------------------------------------------------------ pages
function overviewPage(doc) {
  const s = doc.store || {}, r = doc.replication || {}, t = doc.totals;
  const lag = r.role === "standby" ? `${r.lag_messages} msgs, ${fmtAge(r.lag_seconds)}`
    : (r.standbys || []).map(sb => `${sb.standby_id}: ${sb.lag_messages} msgs`).join(", ") || "no standby";
  const rows = doc.queues.map(q => el("tr", { "data-queue": q.name },
    td(el("a", { href: "#/queue/" + encodeURIComponent(q.name), class: "queue-link" }, q.name), "name"),
    num(q.depth, "depth"), num(fmtBytes(q.bytes), "bytes"),
    num(fmtRate(q.in_rate), "in"), num(fmtRate(q.out_rate), "out"),
    num(q.dead, q.dead ? "dead warn" : "dead"), td(useBar(q.depth_use ?? q.bytes_use), "quota"),
    num(q.partitions, "partitions"), num(q.flows, "flows"),
    num(q.stuck_partitions, q.stuck_partitions ? "stuck bad" : "stuck"),
    td(q.ordering, "ordering"), td(onOff(q.ingress_enabled), "ingress"), td(onOff(q.egress_enabled), "egress"),
    td(q.error ? el("span", { class: "bad" }, q.error) : (q.warnings || []).join("; "), "notes")));
  return [
    el("h1", {}, "Overview"),
    el("div", { class: "cards" },
      card("queues", t.queues, "total-queues"), card("depth", t.depth, "total-depth"),
      card("stored", fmtBytes(t.bytes), "total-bytes"), card("dead messages", t.dead, "total-dead"),
      card("in / out", `${fmtRate(t.in_rate)} / ${fmtRate(t.out_rate)}`, "total-rates"),
      card("store file", `${fmtBytes(s.file_size)} (live ${fmtBytes(s.live_bytes)})`, "store-size"),
      card("replication", `${r.role || "–"}: ${lag}`, "replication")),
    el("h2", {}, "Messages in and out, the last minutes"),
    chart("overview-chart", doc.chart),
    el("h2", {}, "Queues"),
    table("queues", ["queue", "depth#", "bytes#", "in#", "out#", "dead#", "quota use", "partitions#",
                     "flows#", "stuck#", "ordering", "ingress", "egress", "notes"], rows),
  ];
}

function blockedCell(q, p) {
  const b = p.blocked;
  if (!b) return td("", "blocked");
  const retry = b.next_retry ? `, retry in ${fmtAge(b.next_retry - Date.now() / 1000)}` : "";
  const text = `seq ${b.seq}${b.key !== null ? ", key " + b.key : ""}, delivered ${b.delivery_count}×${retry}`;
  const buttons = state.actions ? [
    el("button", { class: "danger kill", onclick: () => act("kill", { queue: q, partition: p.partition, seq: b.seq },
      `Kill message ${b.seq} of partition ${p.partition} of ${q}? It moves to the dead message queue.`) }, "kill"),
    el("button", { class: "danger ack", onclick: () => act("ack", { queue: q, partition: p.partition, seq: b.seq },
      `Ack message ${b.seq} of partition ${p.partition} of ${q}? It is gone for good.`) }, "ack")] : [];
  return el("td", { class: "blocked bad" }, text, " ", buttons);
}

function queuePage(doc) {
  const st = doc.status, row = doc.row, c = doc.config, name = doc.name;
  const flowName = id => { const f = st.flows.find(f => f.flow === id); return f ? (f.name || f.flow) : id; };
  const parts = st.partitions.map(p => el("tr", { "data-partition": p.partition },
    num(p.partition === 4294967295 ? "parent" : p.partition, "partition"), td(p.status, "status"),
    td(p.flow ? flowName(p.flow) : "–", "flow"), num(p.depth, "depth"), num(p.unacked, "unacked"),
    num(p.ack_floor, "ack-floor"), num(p.next_seq, "next-seq"),
    num(p.held_keys ? `${p.held_keys} (${p.held_for.join(", ")})` : 0, "held"),
    blockedCell(name, p)));
  const flows = st.flows.map(f => el("tr", { "data-flow": f.flow },
    td(f.name || f.flow, "flow"), td(f.bound ? (f.active ? "active" : "standby") : "unbound", "state"),
    td(f.partitions.join(", "), "partitions"), td(f.client || "this process", "client"),
    num(fmtAge(f.age), "age"), num(fmtAge(f.heartbeat_age), "heartbeat")));
  const plan = doc.rebalance;
  const buttons = state.actions ? el("div", { class: "actions" },
    el("button", { id: "toggle-ingress", onclick: () => act("ingress", { queue: name, enabled: !c.ingress_enabled },
      `Turn ingress of ${name} ${c.ingress_enabled ? "off" : "on"}?`) }, c.ingress_enabled ? "pause ingress" : "resume ingress"),
    el("button", { id: "toggle-egress", onclick: () => act("egress", { queue: name, enabled: !c.egress_enabled },
      `Turn egress of ${name} ${c.egress_enabled ? "off" : "on"}?`) }, c.egress_enabled ? "pause egress" : "resume egress"),
    el("button", { id: "scale", onclick: () => {
      const n = parseInt(window.prompt(`New partition count of ${name} (now ${c.partitions})`, c.partitions), 10);
      if (n) act("scale", { queue: name, partitions: n }, `Scale ${name} online from ${c.partitions} to ${n} partitions?`);
    } }, "scale…")) : null;
  const dmq = c.dead_message_queue;
  return [
    el("h1", {}, "Queue ", el("span", { id: "queue-name" }, name)),
    el("div", { class: "cards" },
      card("depth", st.depth, "queue-depth"), card("stored", fmtBytes(row.bytes), "queue-bytes"),
      card("in / out", `${fmtRate(row.in_rate)} / ${fmtRate(row.out_rate)}`, "queue-rates"),
      card("dead messages", row.dead, "queue-dead"),
      card("rebalance", st.rebalance_status, "rebalance-status"),
      card("scaling", st.scaling_status + (st.cutover ? " (cut-over draining)" : ""), "scaling-status"),
      card("ingress / egress", [onOff(st.ingress_enabled), " / ", onOff(st.egress_enabled)], "queue-switches"),
      card("owner", st.delivery_owner || "none", "owner")),
    st.warnings.length ? el("p", { class: "warn" }, st.warnings.join("; ")) : null,
    buttons,
    el("p", {}, el("a", { href: `#/messages/${encodeURIComponent(name)}`, id: "browse" }, "browse messages"),
      dmq ? [" · ", el("a", { href: `#/messages/${encodeURIComponent(dmq)}?dead=1`, id: "dead-link" }, `dead messages (${dmq})`)] : null),
    chart("queue-chart", doc.chart),
    el("h2", {}, "Partitions", st.stuck_partitions ? el("span", { class: "bad" }, ` · ${st.stuck_partitions} stuck`) : ""),
    table("partitions", ["partition#", "status", "flow", "depth#", "unacked#", "ack floor#", "next seq#", "held keys#", "blocked by"], parts),
    el("h2", {}, "Flows"),
    table("flows", ["flow", "state", "partitions", "process / client", "age#", "heartbeat#"], flows),
    el("h2", {}, "Rebalance dry-run"),
    el("p", { id: "rebalance-summary" }, plan.error ? plan.error
      : `${plan.balanced ? "balanced" : "not balanced"}; ${(plan.changes || []).length} change(s) planned` +
        `${(plan.unassigned || []).length ? `; unassigned: ${plan.unassigned.join(", ")}` : ""}; status after: ${plan.status_after}`),
    el("details", {}, el("summary", {}, "the whole plan"),
      el("pre", { id: "rebalance" }, JSON.stringify(plan, null, 1))),
  ];
}

function messagesPage(doc, params) {
  const name = doc.queue;
  const rows = doc.messages.map(m => el("tr", { "data-seq": m.seq, "data-partition": m.partition },
    num(m.partition, "partition"), num(m.seq, "seq"), td(m.key ?? "–", "key"), num(m.size, "size"),
    td(m.acked ? "acked" : (m.delivery_count ?? ""), "delivery"),
    td(m.dead_reason || "", "reason"), td(m.origin_queue || "", "origin"),
    el("td", { class: "payload" }, m.corrupt ? el("span", { class: "bad" }, m.error) : m.payload + (m.truncated ? "…" : "")),
    el("td", {}, state.actions && !m.acked ? [
      el("button", { class: "danger kill", onclick: () => act("kill", { queue: name, partition: m.partition, seq: m.seq },
        `Kill message ${m.seq} of partition ${m.partition} of ${name}?`) }, "kill"),
      el("button", { class: "danger ack", onclick: () => act("ack", { queue: name, partition: m.partition, seq: m.seq },
        `Ack (delete) message ${m.seq} of partition ${m.partition} of ${name}?`) }, "ack")] : [])));
  const form = el("form", { class: "filters", id: "filters" },
    el("label", {}, "partition", el("input", { name: "partition", value: params.get("partition") || "", size: 4 })),
    el("label", {}, "key", el("input", { name: "key", value: params.get("key") || "" })),
    el("label", {}, "from seq", el("input", { name: "from_seq", value: params.get("from_seq") || "", size: 6 })),
    el("label", {}, "dead only", el("input", { name: "dead", type: "checkbox", checked: params.get("dead") === "1" })),
    el("button", { type: "submit" }, "show"));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const f of ["partition", "key", "from_seq"]) if (form.elements[f].value) q.set(f, form.elements[f].value);
    if (form.elements.dead.checked) q.set("dead", "1");
    location.hash = `#/messages/${encodeURIComponent(name)}?${q}`;
  });
  const requeue = state.actions && doc.dead ? el("div", { class: "actions" },
    el("button", { id: "requeue-all", onclick: () => act("requeue", { queue: name, key: params.get("key") || null },
      `Requeue the dead messages of ${name}${params.get("key") ? " with key " + params.get("key") : ""} to their origin queues?`) },
      params.get("key") ? "requeue this key" : "requeue all")) : null;
  return [
    el("h1", {}, doc.dead ? "Dead messages of " : "Messages of ",
      el("a", { href: "#/queue/" + encodeURIComponent(name) }, name)),
    form, requeue,
    table("messages", ["partition#", "seq#", "key", "size#", "delivery", "dead reason", "origin", "payload", ""], rows),
    doc.more ? el("p", { class: "muted" }, "more messages follow: narrow the selection or raise from seq") : null,
  ];
}

// ------------------------------------------------------------------ routing and polling
function parseRoute() {
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "overview", name: parts[1], params: new URLSearchParams(query || "") };
}

async function show() {
  clearTimeout(state.timer);
  const route = parseRoute();
  let refresh = 2;
  try {
    const overview = await api("/api/overview");
    state.csrf = overview.csrf;
    state.actions = overview.actions;
    refresh = overview.refresh;
    let content, where;
    if (route.page === "queue" && route.name) {
      const doc = await api("/api/queue?name=" + encodeURIComponent(route.name));
      content = queuePage(doc);
      where = "queue " + route.name;
    } else if (route.page === "messages" && route.name) {
      const q = new URLSearchParams(route.params);
      q.set("name", route.name);
      content = messagesPage(await api("/api/messages?" + q), route.params);
      where = "messages of " + route.name;
    } else {
      content = overviewPage(overview);
      where = overview.path;
    }
    document.getElementById("page").replaceChildren(...content.filter(Boolean));
    document.getElementById("where").textContent = where + (state.actions ? " · actions allowed" : "");
    document.getElementById("live").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (err) {
    document.getElementById("live").textContent = "not updated: " + err.message;
  }
  // a browse is a snapshot the operator asked for (and its filters are being typed in): the
  // overview and a queue update live, messages when asked again
  if (route.page !== "messages") state.timer = setTimeout(show, Math.min(60, Math.max(1, refresh)) * 1000);
}

window.addEventListener("hashchange", () => { notice(""); show(); });
window.addEventListener("DOMContentLoaded", show);
