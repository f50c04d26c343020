#!/usr/bin/env python3
"""The page a user reads first: bench/results/README.md and ratios.png, from one ``make bench``.

Two modes:

* ``report.py --collect bench/X.py --into FILE [-- ARGS]``: run one benchmark script, pass its
  output through, and append each of its JSON lines to FILE with ``"script": "X"`` added (so
  that a name printed by two scripts stays apart). A script that does not exist yet gives one
  line ``{"name": "X", "skipped": "..."}``; one that fails gives ``{"name": "X_failed",
  "skipped": "exit code N"}`` and the exit code (``make bench`` goes on, then fails at the end).
* ``report.py [--results FILE] [--out DIR]``: read FILE (default
  bench/results/make_bench.jsonl) and write ``DIR/README.md`` (default bench/results): what
  partq is for, one table of the headline figures, each beside its peer with the median ratio
  of interleaved pairs and its min-max, the target and whether it is met, the machine (CPU
  count, load average) and the date; then every comparison of the run, and the ratios that
  two scripts measured alike, with their spread. ``DIR/ratios.png`` charts the headline ratios
  (partq over its peer, 1 = parity) with their min-max and targets, if matplotlib is installed.

A line that was not measured shows its ``skipped`` reason, never a figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"

ABOUT = ("partq is an embedded, durable, partitioned-queue broker in Python on LMDB: per-key "
         "order over partitions, acknowledged delivery, flows that rebalance, every publish "
         "fsynced before it returns. The figures below put each partq figure beside the peer "
         "that bounds or competes with it, measured in the same run on the same disk.")

# (script, line name, what it is, target override: (threshold, "min"|"max"|"ratio_max") or None)
HEADLINE: list[tuple[str, str, str, tuple[float, str] | None]] = [
    ("publish", "partq_publish_many_batch_1000_vs_raw_lmdb_same_work",
     "publish_many(1000) vs raw LMDB, same work (crc32c + msgpack)", None),
    ("publish", "partq_publish_many_batch_1000",
     "publish_many(1000) vs bare raw LMDB puts (context: no encoding)", None),
    ("publish", "partq_publish_32_threads_vs_raw_lmdb_group_commit_32",
     "publish from 32 threads vs raw LMDB group commit from 32 threads", None),
    ("publish", "partq_publish_async_1_thread_window_64",
     "publish_async from 1 thread vs blocking publish", None),
    ("publish", "partq_publish_1_thread",
     "blocking publish vs raw LMDB single-put commit (LMDB: 2 fsyncs per commit)", None),
    ("peers", "partq_publish_1_thread_vs_persistqueue_put",
     "blocking publish vs persist-queue put (SQLite WAL: 1 fsync per commit)", None),
    ("peers", "partq_receive_ack_many_1_flow_vs_persistqueue_get_ack",
     "in-process receive+ack_many, 1 flow vs persist-queue get+ack", None),
    ("peers", "partq_receive_ack_many_4_flows_vs_litequeue_pop_done",
     "in-process receive+ack_many, 4 flows vs litequeue pop+done", None),
    ("remote", "remote_publish_pipelined_100_1_clients",
     "over a socket: pipelined publish, 1 client process vs Redis XADD pipelined", None),
    ("remote", "remote_publish_pipelined_100_4_clients",
     "over a socket: pipelined publish, 4 client processes vs Redis", None),
    ("remote", "remote_consume_ack_100_1_clients",
     "over a socket: receive+ack_many by 100, 1 client process vs Redis XREADGROUP+XACK", None),
    ("remote", "remote_consume_ack_100_4_clients",
     "over a socket: receive+ack_many by 100, 4 client processes vs Redis", None),
    ("remote", "remote_publish_many_100_1_clients_vs_in_process",
     "over a socket: publish_many(100), 1 client process vs the same loop in-process", None),
    ("remote", "remote_consume_ack_100_1_clients_vs_in_process",
     "over a socket: receive+ack_many by 100, 1 client process vs in-process", None),
    ("remote", "local_consume_ack_2_processes", "2 consumer processes on one directory vs 1", None),
    ("remote", "owner_failover", "owner failover: SIGKILL to first delivery to a survivor", None),
    ("idle", "idle_bound_flow_cpu_20_flows", "CPU per idle bound flow", None),
    ("tls_soak", "tls_soak_rounds_per_s",
     "over TLS: receive+ack+publish rounds, 2 clients (sync and asyncio) vs plain TCP", None),
    ("tls_soak", "tls_soak_lost_connections", "over TLS: connections lost in the soak (TCP beside)",
     (0.0, "max")),
    ("replication", "publish_many_b100.sync_standby_tls",
     "publish_many(100) with a TLS sync standby vs plaintext", None),
    ("replication", "publish_many_b100.async_standby_tls",
     "publish_many(100) with a TLS async standby vs plaintext", None),
    ("spark_ingest", "spark_ingest_keyed_256B", "Spark local[2] write vs publish_many", None),
    ("startup", "partq_version", "`partq --version` vs `python -c \"import click\"`", None),
    ("startup", "partq_publish",
     "`partq publish` vs a Python process importing lmdb, msgpack, crc32c, click: one put", None),
    ("spark_read", "spark_stream_read_256B", "Spark stream read vs receive+ack_many", None),
    ("memory", "memory_broker_backlog",
     "resident memory: broker with a backlog (1M messages, 64 partitions, 100 flows)", None),
    ("memory", "memory_serve_idle_clients",
     "resident memory: partq serve with idle clients (1,000)", None),
    ("peers", "partq_open_10m_msgs", "open a directory of 10M messages", (100.0, "max")),
]


# ---------------------------------------------------------------------------- collect
def collect(script: str, into: Path, args: list[str]) -> int:
    name = Path(script).stem
    path = Path(script) if Path(script).is_absolute() else REPO / script
    into.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        doc = {"name": name, "unit": "-", "value": None, "script": name,
               "skipped": f"{script} is not built yet"}
        print(json.dumps(doc), flush=True)
        with into.open("a") as f:
            f.write(json.dumps(doc) + "\n")
        return 0
    proc = subprocess.Popen([sys.executable, str(path), *args], stdout=subprocess.PIPE,
                            text=True, cwd=REPO)
    assert proc.stdout is not None
    with into.open("a") as f:
        for text in proc.stdout:
            sys.stdout.write(text)
            sys.stdout.flush()
            try:
                doc = json.loads(text)
            except ValueError:
                continue                 # a script's stray non-JSON output is not a result
            if isinstance(doc, dict) and "name" in doc:
                doc.setdefault("script", name)
                f.write(json.dumps(doc) + "\n")
                f.flush()
    rc = proc.wait()
    if rc != 0:
        with into.open("a") as f:
            f.write(json.dumps({"name": f"{name}_failed", "unit": "-", "value": None,
                                "script": name, "skipped": f"exit code {rc}"}) + "\n")
    return rc


# ---------------------------------------------------------------------------- render
def load(path: Path) -> list[dict]:
    return [json.loads(text) for text in path.read_text().splitlines() if text.strip()]


def fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        a = abs(v)
        text = (f"{v:,.0f}" if a >= 100 else f"{v:,.2f}" if a >= 1 else f"{v:.3g}")
    else:
        text = str(v)
    return f"{text} {unit}".strip()


def ratio_text(doc: dict) -> str:
    r = doc.get("ratio")
    if r is None:
        return "-"
    text = f"{r:.3g}x"
    if doc.get("ratio_min") is not None and doc.get("pairs", 1) > 1:
        text += f" ({doc['ratio_min']:.3g}-{doc['ratio_max']:.3g})"
    return text


def verdict(doc: dict, target: tuple[float, str] | None) -> tuple[str, str]:
    """(target text, result) of a line: a ratio target (min) beside a peer, else a ceiling on
    the value (max), unless the headline list says otherwise."""
    if target is None:
        if doc.get("target") is None:
            return "", ""
        kind = doc.get("target_is") or ("min" if doc.get("peer") else "max")
        target = (float(doc["target"]), kind)
    threshold, kind = target
    if doc.get("skipped") or doc.get("value") is None:
        return _target_text(threshold, kind, doc), "n/a"
    if kind == "min":
        got = doc.get("ratio")
        ok = got is not None and got >= threshold
    elif kind == "ratio_max":           # at most threshold times the peer (start-up times)
        got = doc.get("ratio")
        ok = got is not None and got <= threshold
    else:
        ok = doc["value"] < threshold
    return _target_text(threshold, kind, doc), "met" if ok else "**missed**"


def _target_text(threshold: float, kind: str, doc: dict) -> str:
    if kind == "ratio_max":
        return f"<= {threshold:g}x"
    return f">= {threshold:g}x" if kind == "min" else f"< {threshold:g} {doc.get('unit', '')}"


def headline_rows(lines: dict[tuple[str, str], dict]) -> list[str]:
    rows = ["| what | partq | peer | ratio (min-max of pairs) | target | result |",
            "|---|---:|---|---:|---:|---|"]
    for script, name, label, target in HEADLINE:
        doc = lines.get((script, name))
        if doc is None:
            missing = lines.get((script, script)) or lines.get((script, f"{script}_failed"))
            why = missing["skipped"] if missing else f"not in this run (bench/{script}.py)"
            rows.append(f"| {label} | skipped: {why} | | | | |")
            continue
        tgt, result = verdict(doc, target)
        if doc.get("skipped"):
            rows.append(f"| {label} | skipped: {doc['skipped']} | {doc.get('peer') or ''} | - | "
                        f"{tgt} | {result} |")
            continue
        unit = doc.get("unit", "")
        peer = ""
        if doc.get("peer"):
            peer = (f"{doc['peer']}: skipped ({doc['peer_skipped']})" if doc.get("peer_skipped")
                    else f"{doc['peer']}: {fmt(doc.get('peer_value'), unit)}")
        if doc.get("note"):
            peer += f" <br>*{doc['note']}*"
        rows.append(f"| {label} | {fmt(doc['value'], unit)} | {peer} | {ratio_text(doc)} | "
                    f"{tgt} | {result} |")
    return rows


def comparison_rows(ordered: list[dict]) -> list[str]:
    rows = ["| script | line | partq | peer | peer figure | ratio (min-max) | pairs | target |",
            "|---|---|---:|---|---:|---:|---:|---|"]
    for doc in ordered:
        if not doc.get("peer") and doc.get("target") is None and not doc.get("skipped"):
            continue
        if doc["name"] == "load_average_at_start":
            continue
        unit = doc.get("unit", "")
        value = f"skipped: {doc['skipped']}" if doc.get("skipped") else fmt(doc.get("value"), unit)
        peer_value = (f"skipped: {doc['peer_skipped']}" if doc.get("peer_skipped")
                      else fmt(doc.get("peer_value"), unit) if doc.get("peer") else "")
        tgt, result = verdict(doc, None)
        rows.append(f"| {doc.get('script', '')} | {doc['name']} | {value} | {doc.get('peer') or ''} | "
                    f"{peer_value} | {ratio_text(doc)} | {doc.get('pairs', '')} | "
                    f"{(tgt + ' ' + result).strip()} |")
    return rows


def agreement_rows(ordered: list[dict]) -> list[str]:
    """The same comparison (line name and peer) measured by more than one script."""
    seen: dict[tuple[str, str], list[dict]] = {}
    for doc in ordered:
        if doc.get("peer") and doc.get("ratio") is not None:
            seen.setdefault((doc["name"], doc["peer"]), []).append(doc)
    rows = ["| line | peer | ratio by script | spread (max/min - 1) |", "|---|---|---|---:|"]
    for (name, peer), docs in seen.items():
        scripts = {d.get("script") for d in docs}
        if len(scripts) < 2:
            continue
        rs = [d["ratio"] for d in docs]
        spread = max(rs) / min(rs) - 1 if min(rs) > 0 else float("inf")
        by = ", ".join(f"{d.get('script')}: {d['ratio']:.3g}" for d in docs)
        rows.append(f"| {name} | {peer} | {by} | {spread:.0%} |")
    return rows if len(rows) > 2 else []


def machine(ordered: list[dict]) -> str:
    heads = [d for d in ordered if d["name"] == "load_average_at_start"]
    if not heads:
        return f"{os.cpu_count()} CPUs (no header line in the results)"
    loads = [d["value"] for d in heads if d.get("value") is not None]
    cpus = sorted({int(d["cpus"]) for d in heads if d.get("cpus")})
    dates = sorted(d["date"] for d in heads if d.get("date"))
    when = f"{dates[0]} to {dates[-1]}" if dates else "unknown date"
    return (f"{', '.join(map(str, cpus))} CPUs, {platform.platform()}; 1-minute load average "
            f"at the start of each script {min(loads):.2f}-{max(loads):.2f} (median "
            f"{median(loads):.2f}): other jobs shared the machine; run {when}")


def render(results: Path, out: Path) -> None:
    ordered = load(results)
    lines: dict[tuple[str, str], dict] = {}
    for doc in ordered:
        lines.setdefault((doc.get("script", ""), doc["name"]), doc)
    agreement = agreement_rows(ordered)
    chart_ok = chart(lines, out / "ratios.png")
    text = [
        "# partq benchmarks",
        "",
        f"Generated by `bench/report.py` from `{results.name}` on "
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; scripts in this run: "
        f"{', '.join(dict.fromkeys(d.get('script') or '?' for d in ordered))}. "
        f"Machine: {machine(ordered)}.",
        "",
        ABOUT,
        "",
        "Method (bench/method.py): the two sides of a comparison run in interleaved slices (A, B, "
        "A, B, ...; a warm-up round, then 7 pairs); a ratio is the median of the pairs' ratios, "
        "shown with its min and max, and each figure the median of its side. Figures depend on "
        "the disk and on what else runs; rerun `make bench` to get yours.",
        "",
        *headline_rows(lines),
        "",
        *(["![partq over its peer, median ratio of interleaved pairs with min-max; 1 = parity]"
           "(ratios.png)", ""] if chart_ok else []),
        "## Every comparison of the run",
        "",
        *comparison_rows(ordered),
        "",
    ]
    if agreement:
        text += ["## The same ratio measured by two scripts", "",
                 "The issue asks that they agree within 10%.", "", *agreement, ""]
    (out / "README.md").write_text("\n".join(text))


def chart(lines: dict[tuple[str, str], dict], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart", file=sys.stderr)
        return False
    bars = []
    for script, name, label, target in HEADLINE:
        doc = lines.get((script, name))
        if doc and doc.get("ratio") and not doc.get("skipped"):
            tgt = target[0] if target else doc.get("target")
            bars.append((label, doc["ratio"], doc.get("ratio_min", doc["ratio"]),
                         doc.get("ratio_max", doc["ratio"]), tgt))
    if not bars:
        return False
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(bars) + 1.6))
    y = list(range(len(bars)))
    for yi, b in zip(y, bars, strict=True):
        colour = "tab:blue" if b[4] is None or b[1] >= b[4] else "tab:red"
        ax.errorbar([b[1]], [yi], xerr=[[b[1] - b[2]], [b[3] - b[1]]], fmt="o", color=colour,
                    capsize=3)
        if b[4] is not None:
            ax.plot([b[4], b[4]], [yi - 0.4, yi + 0.4], color="black", linewidth=2)
        ax.text(b[3], yi, f"  {b[1]:.3g}x", va="center", fontsize=8)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(y, [b[0] for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("partq / peer: median of interleaved pairs (whiskers: min-max); "
                  "black tick: target; dashed: parity", fontsize=8)
    ax.set_title("partq against its peers, one run (red: target missed)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--collect", metavar="SCRIPT", help="run SCRIPT and append its lines")
    parser.add_argument("--into", type=Path, default=RESULTS / "make_bench.jsonl")
    parser.add_argument("--results", type=Path, default=RESULTS / "make_bench.jsonl")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.collect:
        return collect(args.collect, args.into, extra)
    args.out.mkdir(parents=True, exist_ok=True)
    render(args.results, args.out)
    print(f"wrote {args.out / 'README.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
