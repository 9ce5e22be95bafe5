"""Order statistics for the benchmark's samples (pure).

Percentiles interpolate linearly between order statistics, the definition
numpy calls ``"linear"`` (Hyndman & Fan 1996, type 7), so p50 of an even count
is the mean of the middle two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values``; ``None`` when empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return xs[lo] + (xs[hi] - xs[lo]) * frac


@dataclass(frozen=True, slots=True)
class Summary:
    """Count, mean and the percentiles the reports print."""

    n: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(values: Sequence[float | None]) -> Summary:
    """Summary of the non-``None`` values."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return Summary(0, None, None, None, None, None)
    return Summary(n=len(xs), mean=sum(xs) / len(xs), p50=percentile(xs, 50),
                   p95=percentile(xs, 95), p99=percentile(xs, 99), max=max(xs))


def ecdf(values: Iterable[float]) -> tuple[list[float], list[float]]:
    """Empirical CDF: sorted values and the fraction of samples at or below each."""
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]
