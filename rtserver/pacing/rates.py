"""Measured real-time factors (pure): completed segments (``RtfTracker``),
segments in flight (``LiveRates``) and how r grows with load (``LoadSlope``);
how long a context's first chunk usually takes (``FirstChunkTimes``).
The hints (``hints.prebuffer_ms``) plan with what these estimate."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Hashable, Sequence

from rtserver.pacing.hints import HintConfig


class LoadSlope:
    """The slope b of r = a + b * load, fitted by least squares with
    exponential forgetting (an observation's weight halves every ``halflife``
    observations). None while the loads seen spread too little to tell
    (weighted standard deviation under ``min_spread`` contexts), and never
    below 0 (more streams never make one faster)."""

    def __init__(self, halflife: float, min_spread: float) -> None:
        if not halflife > 0 or not min_spread > 0:
            raise ValueError("halflife and min_spread must be > 0")
        self._decay = 0.5 ** (1.0 / halflife)
        self._min_var = min_spread * min_spread
        self._w = self._wn = self._wnn = self._wr = self._wnr = 0.0

    def observe(self, load: float, r: float) -> None:
        d = self._decay
        self._w = self._w * d + 1.0
        self._wn = self._wn * d + load
        self._wnn = self._wnn * d + load * load
        self._wr = self._wr * d + r
        self._wnr = self._wnr * d + load * r

    def slope(self) -> float | None:
        if self._w <= 0:
            return None
        mean_n = self._wn / self._w
        var = self._wnn / self._w - mean_n * mean_n
        if var < self._min_var:
            return None
        cov = self._wnr / self._w - mean_n * (self._wr / self._w)
        return max(0.0, cov / var)


class RtfTracker:
    """Recent real-time factors of one voice: a ring of the last ``window``
    observations (generation time / audio time, one per segment), of which
    those younger than ``max_age_s`` count when ``now`` is given. Each may
    carry the voice's load when it was made (contexts generating at once),
    so that a quantile can be asked for a load (``percentile(load=...)``)."""

    def __init__(self, config: HintConfig | None = None) -> None:
        self._config = config or HintConfig()
        self._ring: deque[float] = deque(maxlen=self._config.window)
        self._times: deque[float] = deque(maxlen=self._config.window)
        self._loads: deque[float] = deque(maxlen=self._config.window)
        self._slope = LoadSlope(self._config.load_halflife, self._config.load_min_spread)
        self._total = 0

    @property
    def count(self) -> int:
        """Observations in the window."""
        return len(self._ring)

    @property
    def total(self) -> int:
        """Observations ever made."""
        return self._total

    @property
    def load_slope(self) -> float | None:
        """How much r grows per context generating at once (``LoadSlope``)."""
        return self._slope.slope()

    def observe(self, gen_s: float, audio_s: float, now: float = 0.0,
                load: float = 0.0) -> None:
        """``gen_s`` seconds of work produced ``audio_s`` seconds of audio, at
        ``now``, while ``load`` contexts were generating."""
        if not (math.isfinite(gen_s) and gen_s >= 0):
            raise ValueError(f"gen_s must be finite and >= 0, not {gen_s}")
        if not (math.isfinite(audio_s) and audio_s > 0):
            raise ValueError(f"audio_s must be finite and > 0, not {audio_s}")
        if not (math.isfinite(load) and load >= 0):
            raise ValueError(f"load must be finite and >= 0, not {load}")
        r = gen_s / audio_s
        self._ring.append(r)
        self._times.append(now)
        self._loads.append(load)
        self._slope.observe(load, r)
        self._total += 1

    def percentile(self, q: float | None = None, now: float | None = None,
                   load: float | None = None, parallel: int = 0) -> float:
        """Nearest-rank ``q``-quantile of the window (``q`` defaults to the
        config's): the smallest value with at least ``q`` of the window at or
        below it, so a short window answers its maximum for high q.
        ``default_rtf`` before any observation.

        With ``load``: only observations made at ``load_similar`` of that load
        or more count (r grows with load: lighter ones would promise too
        much); above every load in the window, the heaviest ones count, plus
        ``load_slope`` per context beyond them, so a burst of new streams is
        planned for before any of its segments completes. Before any slope
        is known, a voice that makes ``parallel`` segments at full speed (its
        worker threads) is assumed to share them: r grows as
        ``max(1, load / parallel)`` from the heaviest load seen. A burst of
        8 Piper users after one had hints from r 0.16 while it ran at 0.6-0.96
        on 2 workers, and 7 of 8 underran once
        (bench/results/cpu-piper-2026-12-03-capacity)."""
        q = self._config.percentile if q is None else q
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], not {q}")
        if not self._ring:
            return self._config.default_rtf
        rows = list(zip(self._ring, self._times, self._loads, strict=True))
        if now is not None:
            oldest = now - self._config.max_age_s
            rows = [row for row in rows if row[1] >= oldest] or rows[-1:]
        if load is None:
            return _nearest_rank(sorted(r for r, _, _ in rows), q)
        heaviest = max(n for _, _, n in rows)
        floor = self._config.load_similar * min(load, heaviest)
        value = _nearest_rank(sorted(r for r, _, n in rows if n >= floor), q)
        slope = self._slope.slope()
        if load > heaviest and slope is not None:
            value += slope * (load - heaviest)
        elif load > heaviest and parallel > 0:
            value *= max(1.0, load / parallel) / max(1.0, heaviest / parallel)
        return value


def _nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """The smallest value with at least ``q`` of the values at or below it."""
    return sorted_values[max(1, math.ceil(q * len(sorted_values) - 1e-9)) - 1]


class LiveRates:
    """Real-time factors of segments in flight: generation time so far (waits
    on a full send queue excluded) / audio made so far, for segments that made
    at least ``live_min_audio_s``. Keys are any hashable segment ids."""

    def __init__(self, config: HintConfig | None = None) -> None:
        self._min_audio_s = (config or HintConfig()).live_min_audio_s
        self._began: dict[Hashable, float] = {}
        self._rates: dict[Hashable, float] = {}

    def __len__(self) -> int:
        """Segments in flight."""
        return len(self._began)

    def begin(self, key: Hashable, now: float) -> None:
        self._began[key] = now
        self._rates.pop(key, None)

    def progress(self, key: Hashable, audio_s: float, waited_s: float, now: float) -> None:
        """``key`` has made ``audio_s`` of audio by ``now``, ``waited_s`` of its
        time spent waiting on the client."""
        began = self._began.get(key)
        if began is None or audio_s < self._min_audio_s:
            return
        self._rates[key] = max(0.0, now - began - waited_s) / audio_s

    def end(self, key: Hashable) -> None:
        self._began.pop(key, None)
        self._rates.pop(key, None)

    def percentile(self, q: float) -> float | None:
        """Nearest-rank ``q``-quantile of the in-flight rates; None without any."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], not {q}")
        if not self._rates:
            return None
        return _nearest_rank(sorted(self._rates.values()), q)


class FirstChunkTimes:
    """How long a voice's contexts waited for their first chunk (synthesis
    start to the first PCM, ms): the last ``first_chunk_window`` of them.
    ``usual_ms`` is their median, None before any."""

    def __init__(self, config: HintConfig | None = None) -> None:
        self._ring: deque[float] = deque(maxlen=(config or HintConfig()).first_chunk_window)

    def observe(self, ms: float) -> None:
        if math.isfinite(ms) and ms >= 0:
            self._ring.append(ms)

    def usual_ms(self) -> float | None:
        if not self._ring:
            return None
        return statistics.median(self._ring)
