"""The figures, verdicts and markdown report of ``bench_soak.py`` (its docstring says what they mean)."""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_server import spread  # noqa: E402
from soak_clients import BAD_KINDS, HOLD_SLACK, MAX_BAD  # noqa: E402

RSS_GROWTH = 1.10
P95_RATIO = 1.5


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile, nearest rank (no interpolation across the tail's few points)."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, int(np.ceil(q * len(values))) - 1))] if values else None


def is_5xx(answer: str) -> bool:
    return re.search(r"(^|\s)5\d\d$", answer) is not None


def summarise(phase: dict) -> dict:
    records = phase["records"]
    normal = [r for r in records if r["kind"] == "normal"]
    ok = [r["seconds"] for r in normal if r["answer"] == "200"]
    kinds: dict[str, dict] = {}
    for r in records:
        if r["kind"] != "normal":
            k = kinds.setdefault(r["kind"], {"count": 0, "answers": Counter(), "holds": [], "expected": 0})
            k["count"] += 1
            k["answers"][r["answer"]] += 1
            k["holds"].append(r["seconds"])
            k["expected"] += bool(r.get("expected"))
    return {"normal": len(normal), "p50": quantile(ok, 0.5), "p95": quantile(ok, 0.95),
            "non_200": dict(Counter(r["answer"] for r in normal if r["answer"] != "200")),
            "5xx": dict(Counter(f"{r['kind']}: {r['answer']}" for r in records if is_5xx(r["answer"]))),
            "kinds": kinds, **rss_figures(phase["rss"], phase["minutes"] * 60)}


def rss_figures(samples: list[tuple[float, float]], seconds: float) -> dict:
    """Per-minute maxima, and the flat rule: after the warm-up (the first minute, or the first half of a phase
    shorter than 2 minutes, so a smoke run still has an after), at most 10 % over the warm-up's maximum."""
    warm = min(60.0, seconds / 2)
    first = max((mb for t, mb in samples if t < warm), default=None)
    after = max((mb for t, mb in samples if t >= warm), default=None)
    minutes: dict[int, float] = {}
    for t, mb in samples:
        minutes[int(t // 60)] = max(minutes.get(int(t // 60), 0.0), mb)
    flat = None if first is None or after is None else after <= first * RSS_GROWTH
    # the trend, for a slow leak that stays under the 10 % within one soak: a least-squares slope over the samples
    later = np.array([(t, mb) for t, mb in samples if t >= warm]).reshape(-1, 2)
    trend = float(np.polyfit(later[:, 0], later[:, 1], 1)[0]) * 60 if len(later) > 2 else None
    return {"rss_warm_s": warm, "rss_first": first, "rss_after": after, "rss_flat": flat,
            "rss_trend_mb_per_min": trend, "rss_minutes": [round(minutes[m]) for m in sorted(minutes)]}


def verdicts(phases: dict[str, dict], sums: dict[str, dict]) -> list[tuple[str, dict[str, bool | None]]]:
    """(rule, {phase: passed}); the last row, the p95 ratio, is one figure for the pair."""
    rows = [("no slot leaked (admitted 0 within 60 s)", {n: not p["drain"]["leak"] for n, p in phases.items()}),
            ("no 5xx (any client)", {n: not s["5xx"] for n, s in sums.items()}),
            ("RSS flat after the warm-up (max <= 1.10 x warm-up max)", {n: s["rss_flat"] for n, s in sums.items()}),
            ("every normal request 200", {n: not s["non_200"] for n, s in sums.items()}),
            ("no client stuck past the phase", {n: not p["stuck"] for n, p in phases.items()}),
            ("server alive through the phase", {n: p["died"] is None for n, p in phases.items()}),
            ("JFK right after the phase", {n: p["after"]["right"] for n, p in phases.items()})]
    if "baseline" in sums and "soak" in sums and sums["baseline"]["p95"] and sums["soak"]["p95"]:
        rows.append((f"normal p95 soak / baseline <= {P95_RATIO}",
                     {"soak": sums["soak"]["p95"] / sums["baseline"]["p95"] <= P95_RATIO}))
    return rows


def fmt(x, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def answers(counter: Counter) -> str:
    return ", ".join(f"{a} x{n}" for a, n in counter.most_common())


def header(machine: dict, args: argparse.Namespace) -> str:
    lim, bad = args.limits, min(args.bad_clients, MAX_BAD)
    return "\n".join([
        "# Soak of whisperane serve\n",
        f"- machine: {machine['cpu']}; {machine['cores']} cores; load before {machine['load_before']}, "
        f"after {machine['load_after']}",
        f"- model {args.model}; server args {' '.join(args.server_args) or '(defaults)'}; bad clients' holds judged "
        f"by header timeout {lim.header_timeout:g} s, idle timeout {lim.idle_timeout:g} s (+{HOLD_SLACK:g} s)",
        f"- traffic: {args.normal_clients} normal (pause {args.think:g} s), {args.sse_clients} SSE (pause "
        f"{args.sse_pause:g} s, 1 in {args.sse_abort_every} left after its first delta), {args.ws_clients} WS at "
        f"{args.ws_speed:g}x (pause {args.ws_pause:g} s); the soak adds {bad} bad clients (pause {args.bad_pause:g} s)",
        f"- audio: {machine['audio']}\n"])


def report(phases: dict[str, dict], sums: dict[str, dict], machine: dict, args: argparse.Namespace) -> bool:
    print(header(machine, args))
    print("| phase | min | normal | p50 s | p95 s | non-200 | 5xx | server CPU (of all cores) | peak admitted | "
          "admitted after (wait s) | JFK after | RSS warm-up max MB | RSS after max MB | RSS per-minute max MB | "
          "stop s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, p in phases.items():
        s, h, jfk = sums[n], p["drain"]["health"], p["after"]
        admitted = h["admitted"] if "admitted" in h else f"no answer ({h.get('error')})"
        transcript = "right" if jfk["right"] else f"{jfk['status']}: {jfk['text']!r}"
        print(f"| {n} | {p['minutes']:g} | {s['normal']} | {fmt(s['p50'])} | {fmt(s['p95'])} | "
              f"{answers(Counter(s['non_200'])) or 0} | {answers(Counter(s['5xx'])) or 0} | {p['busy']:.0%} | "
              f"{p['admitted_peak']} | {admitted} ({p['drain']['seconds']:g}) | "
              f"{transcript} | {fmt(s['rss_first'], 0)} | "
              f"{fmt(s['rss_after'], 0)} | {s['rss_minutes']} | {p['stop_seconds']:g} |")
    for n, p in phases.items():
        print(f"\n## {n}: other clients\n\n| kind | count | answers | as expected | s median (min-max) |")
        print("|---|---|---|---|---|")  # s: a good client's latency, how long the server held a bad one
        for kind, k in sorted(sums[n]["kinds"].items()):
            exp = f"{k['expected']}/{k['count']}" if kind in BAD_KINDS else ""
            print(f"| {kind} | {k['count']} | {answers(k['answers'])} | {exp} | {spread(k['holds'])} |")
        missing = [k for k in args.bad_kinds if k not in sums[n]["kinds"]] if p["bad"] else []
        log = p["log_errors"]
        print(f"\nbad kinds not reached: {', '.join(missing) or 'none'}" if p["bad"] else "")
        print(f"stuck clients: {', '.join(p['stuck']) or 'none'}; server exit during the phase: "
              f"{'none' if p['died'] is None else p['died']}; "
              f"server log: {log['tracebacks']} tracebacks (first: {log['first_exception'] or '-'}), "
              f"{log['error_lines']} error lines")
    print("\n## verdicts\n")
    passed = True
    for rule, by_phase in verdicts(phases, sums):
        passed &= all(v is not False for v in by_phase.values())
        print(f"- {rule}: " + ", ".join(f"{n} {'yes' if v else 'n/a' if v is None else 'NO'}"
                                        for n, v in by_phase.items()))
    print("\nfigures beside the verdicts:\n")
    if sums.get("soak", {}).get("p95") and sums.get("baseline", {}).get("p95"):
        print(f"- p95 ratio soak / baseline: {sums['soak']['p95'] / sums['baseline']['p95']:.2f}")
    for n, s in sums.items():
        bad = [k for kind, k in s["kinds"].items() if kind in BAD_KINDS]
        print(f"- {n}: RSS trend after the warm-up {fmt(s['rss_trend_mb_per_min'])} MB/min"
              + (f"; bad clients answered as specified: {sum(k['expected'] for k in bad)}/"
                 f"{sum(k['count'] for k in bad)}" if bad else ""))
    return passed
