"""Server-side figures from ``GET /metrics`` (Prometheus text), scraped
before and after a step; counters and histograms are reported as deltas.

Histogram quantiles are estimated the way Prometheus' ``histogram_quantile``
does: linear interpolation inside the bucket holding the rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    """One scrape: plain samples and histogram buckets, by name and labels."""

    values: dict[tuple[str, Labels], float] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # family name -> type


def parse(text: str) -> Scrape:
    out = Scrape()
    for fam in text_string_to_metric_families(text):
        out.kinds[fam.name] = fam.type
        for s in fam.samples:
            labels = tuple(sorted(s.labels.items()))
            out.values[(s.name, labels)] = float(s.value)
    return out


def _strip(labels: Labels, name: str) -> Labels:
    return tuple((k, v) for k, v in labels if k != name)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """``buckets``: sorted ``(upper bound, cumulative count)``, +Inf last."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound  # as Prometheus: the highest finite bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def delta(before: Scrape, after: Scrape) -> dict[str, Any]:
    """Counter and histogram changes between two scrapes, gauges as after.

    Result: ``{family: {label_text: {...}}}`` with, for histograms, ``count``,
    ``mean`` and ``p50``/``p95``/``p99`` estimates from the bucket deltas.
    """
    result: dict[str, Any] = {}
    for fam, kind in sorted(after.kinds.items()):
        entry: dict[str, Any] = {}
        if kind == "histogram":
            series: dict[Labels, list[tuple[float, float]]] = {}
            for (name, labels), v in after.values.items():
                if name != fam + "_bucket":
                    continue
                le = dict(labels)["le"]
                base = _strip(labels, "le")
                d = v - before.values.get((name, labels), 0.0)
                series.setdefault(base, []).append((float(le), d))
            for base, bs in series.items():
                bs.sort()
                count = after.values.get((fam + "_count", base), 0.0) - before.values.get(
                    (fam + "_count", base), 0.0)
                total = after.values.get((fam + "_sum", base), 0.0) - before.values.get(
                    (fam + "_sum", base), 0.0)
                if count <= 0:
                    continue
                entry[_label_text(base)] = {
                    "count": count, "mean": total / count,
                    "p50": histogram_quantile(bs, 0.50), "p95": histogram_quantile(bs, 0.95),
                    "p99": histogram_quantile(bs, 0.99)}
        else:
            for (name, labels), v in after.values.items():
                if name not in (fam, fam + "_total"):
                    continue
                if kind == "counter":
                    d = v - before.values.get((name, labels), 0.0)
                    if d:
                        entry[_label_text(labels)] = d
                elif kind == "gauge":
                    entry[_label_text(labels)] = v
        if entry:
            result[fam] = {"type": kind, "series": entry}
    return result


def _label_text(labels: Labels) -> str:
    return ",".join(f"{k}={v}" for k, v in labels) or "-"
