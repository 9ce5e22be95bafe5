"""One GPU timeline from several processes' torch profiler traces (issue 24):
``python -m rtserver.tools.bench.gpu_timeline DIR [--out summary.md]``.

DIR holds Chrome traces (``*.json`` or ``*.json.gz``) recorded over the same
seconds by different processes on one GPU: the GPU worker's own
(``rtserver/worker/profile.py``: its vocoders' kernels) and vLLM's
EngineCore's (the token engine's). Kernels, copies and memsets of every trace
go on one axis (each trace's ``baseTimeNanoseconds`` added when it has one);
over the seconds all traces cover, it reports each process's GPU time and
top kernels, the share of time the GPU ran anything, how often two
processes' work overlapped, and the idle gaps between busy stretches.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtserver.tools.bench.stats import percentile

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
BURST_GAP_US = 200.0  # idle gaps shorter than this join kernels into one burst (a step's launches)


@dataclass
class Trace:
    label: str
    spans: list[tuple[float, float]] = field(default_factory=list)  # (start, end) µs, GPU work
    names: dict[str, float] = field(default_factory=dict)  # kernel name -> total µs
    first_us: float = float("inf")  # the trace's own first and last event
    last_us: float = float("-inf")


def load(path: Path) -> Trace:
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    base_us = float(data.get("baseTimeNanoseconds", 0)) / 1000.0
    trace = Trace(label=path.name.split(".")[0])
    names: dict[str, float] = defaultdict(float)
    for ev in data.get("traceEvents", []):
        if ev.get("ph") != "X" or "ts" not in ev:
            continue
        start = float(ev["ts"]) + base_us
        dur = float(ev.get("dur", 0.0))
        trace.first_us = min(trace.first_us, start)
        trace.last_us = max(trace.last_us, start + dur)
        if ev.get("cat") in GPU_CATEGORIES:
            trace.spans.append((start, start + dur))
            names[str(ev.get("name", "?"))[:90]] += dur
    trace.names = dict(names)
    return trace


def union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merge overlapping spans, sorted."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def clip(spans: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]


def total(spans: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in spans)


def summarise(traces: list[Trace]) -> dict[str, Any]:
    traces = [t for t in traces if t.spans or t.first_us < t.last_us]
    lo = max(t.first_us for t in traces)
    hi = min(t.last_us for t in traces)
    if hi <= lo:
        raise ValueError("the traces do not cover a common stretch of time")
    window = hi - lo
    per: list[dict[str, Any]] = []
    merged_each = []
    for t in traces:
        mine = union(clip(t.spans, lo, hi))
        merged_each.append(mine)
        top = sorted(t.names.items(), key=lambda kv: -kv[1])[:8]
        per.append({"process": t.label, "gpu_ms": round(total(mine) / 1000, 1),
                    "busy_share": round(total(mine) / window, 3),
                    "top_kernels_ms": [(n, round(us / 1000, 1)) for n, us in top]})
    everything = union([s for m in merged_each for s in m])
    busy = total(everything)
    overlap = sum(total(m) for m in merged_each) - busy  # time two processes ran at once
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(everything)]
    bursts: list[float] = []  # busy stretches joined over gaps < BURST_GAP_US
    start = end = None
    for s, e in everything:
        if start is None or end is None or s - end >= BURST_GAP_US:
            if start is not None and end is not None:
                bursts.append(end - start)
            start = s
        end = e
    if start is not None and end is not None:
        bursts.append(end - start)
    return {
        "window_ms": round(window / 1000, 1),
        "busy_share": round(busy / window, 3),
        "overlap_share": round(overlap / window, 3),
        "idle_gaps": {"count": len(gaps), "p50_us": round(percentile(gaps, 50) or 0.0, 1),
                      "p90_us": round(percentile(gaps, 90) or 0.0, 1),
                      "max_ms": round(max(gaps, default=0) / 1000, 2),
                      "idle_in_gaps_over_1ms_share": round(
                          sum(g for g in gaps if g > 1000) / window, 3)},
        "bursts": {"count": len(bursts),
                   "p50_ms": round((percentile(bursts, 50) or 0.0) / 1000, 2),
                   "p90_ms": round((percentile(bursts, 90) or 0.0) / 1000, 2),
                   "mean_ms": round(statistics.fmean(bursts) / 1000, 2) if bursts else 0.0},
        "processes": per,
    }


def markdown(s: dict[str, Any], source: str) -> str:
    g, b = s["idle_gaps"], s["bursts"]
    lines = [
        f"# GPU timeline ({source})", "",
        f"Over the {s['window_ms']} ms every trace covers: the GPU ran something "
        f"{100 * s['busy_share']:.1f} % of the time; two processes' work overlapped "
        f"{100 * s['overlap_share']:.1f} %.",
        f"Idle gaps: {g['count']}, p50 {g['p50_us']} µs, p90 {g['p90_us']} µs, longest "
        f"{g['max_ms']} ms; gaps over 1 ms add up to {100 * g['idle_in_gaps_over_1ms_share']:.1f}"
        " % of the time.",
        f"Busy stretches (joined over gaps < {BURST_GAP_US:g} µs): {b['count']}, p50 "
        f"{b['p50_ms']} ms, p90 {b['p90_ms']} ms, mean {b['mean_ms']} ms.", "",
        "| process | GPU ms | share of the window |", "|---|---:|---:|",
        *[f"| {p['process']} | {p['gpu_ms']} | {100 * p['busy_share']:.1f} % |"
          for p in s["processes"]], ""]
    for p in s["processes"]:
        lines += [f"Top kernels of {p['process']}:", "",
                  *[f"- {ms} ms `{n}`" for n, ms in p["top_kernels_ms"]], ""]
    return "\n".join(lines)


def find_traces(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()
                  and (p.name.endswith(".json") or p.name.endswith(".json.gz")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.gpu_timeline",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path)
    p.add_argument("--out", type=Path, default=None, help="write the summary (markdown) here")
    args = p.parse_args(argv)
    paths = find_traces(args.folder)
    if not paths:
        print(f"no traces under {args.folder}", file=sys.stderr)
        return 2
    summary = summarise([load(path) for path in paths])
    text = markdown(summary, ", ".join(path.name for path in paths))
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
