"""PNG plots of a run (matplotlib, Agg backend: no display needed).

- ``ttfa_cdf_<system>_<load>.png``: TTFA CDF, one line per level.
- ``soak.png`` (``plot_soak``): a soak's RSS, open fds and turns against time.
- ``realtime_<system>_<load>.png``: left, contexts that underran (%) and the
  p99 stall per level; right, real-time streams (level × share without an
  underrun) against the level, with the ideal diagonal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rtserver.tools.bench.report import Row, group_key
from rtserver.tools.bench.stats import ecdf

Sample = dict[str, Any]


def save_png(fig: Any, path: Path) -> None:
    """``fig`` as a 256-colour palette PNG: a chart has a few hundred colours
    (anti-aliased lines), and the palette keeps it a third of an RGBA PNG's
    size (88.9 against 31.4 KB for a sweep's chart), which counts against the
    tracked results' 4 MiB (tests/unit/test_house_plan.py)."""
    import io

    from PIL import Image  # matplotlib's own dependency

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    buf.seek(0)
    with Image.open(buf) as image:
        image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                      dither=Image.Dither.NONE).save(path, optimize=True)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")


# what a run without matplotlib says instead of plotting (the `bench` extra brings it)
NO_MATPLOTLIB = ("plots skipped: matplotlib is not installed; plots need "
                 "`pip install 'rtserver[bench]'` (or pass --no-plots)")


def available() -> bool:
    """Whether matplotlib imports (an optional dependency: the `bench` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_all(samples: Sequence[Sample], rows: Sequence[Row], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    loads = sorted({(r.system, r.run, r.load) for r in rows})
    for system, run, load in loads:
        levels = sorted(r.level for r in rows if (r.system, r.run, r.load) == (system, run, load))
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for level in levels:
            xs = [s["ttfa_ms"] for s in samples
                  if group_key(s) == (system, run, load, level) and s.get("ttfa_ms") is not None]
            if not xs:
                continue
            x, y = ecdf(xs)
            ax.step(x, y, where="post", label=f"{level:g} ({len(xs)})")
        ax.set_xlabel("TTFA from the completing text (ms)")
        ax.set_ylabel("fraction of contexts")
        ax.set_title(f"TTFA CDF, {system}, {run}, {load}")
        ax.grid(alpha=0.3)
        ax.legend(title="arrivals/s" if run == "poisson" else "streams", fontsize=8)
        path = out_dir / f"ttfa_cdf_{_slug(system)}_{_slug(run)}_{_slug(load)}.png"
        fig.tight_layout()
        save_png(fig, path)
        plt.close(fig)
        written.append(path)
        if run == "poisson":
            continue
        rs = [r for r in rows if (r.system, r.run, r.load) == (system, run, load)]
        rs.sort(key=lambda r: r.level)
        lv = [r.level for r in rs]
        under = [100.0 * r.stats["underrun_contexts"] / max(1, r.stats["played_contexts"])
                 for r in rs]
        stall = [r.stats["stalled_ms"]["p99"] or 0.0 for r in rs]
        rt_streams = [r.level * (1 - u / 100.0) for r, u in zip(rs, under, strict=True)]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        a1.plot(lv, under, "o-", color="tab:red", label="contexts that underran (%)")
        a1.set_xlabel("concurrent streams")
        a1.set_ylabel("contexts that underran (%)")
        a1b = a1.twinx()
        a1b.plot(lv, stall, "s--", color="tab:gray", label="stall p99 (ms)")
        a1b.set_ylabel("stalled ms per context, p99")
        a1.set_title("underruns")
        a1.grid(alpha=0.3)
        a2.plot(lv, rt_streams, "o-", label="real-time streams")
        a2.plot(lv, lv, ":", color="gray", label="ideal")
        a2.set_xlabel("concurrent streams")
        a2.set_ylabel("streams without an underrun")
        a2.set_title("real-time streams")
        a2.grid(alpha=0.3)
        a2.legend(fontsize=8)
        fig.suptitle(f"{system}, {run}, {load}")
        fig.tight_layout()
        path = out_dir / f"realtime_{_slug(system)}_{_slug(run)}_{_slug(load)}.png"
        save_png(fig, path)
        plt.close(fig)
        written.append(path)
    return written


def plot_soak(samples: Sequence[Any], warmup_s: float, rss: dict[str, float],
              path: Path) -> Path:
    """A soak's ``soak.Sample`` rows: RSS, open fds and turns against time, the
    warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [s.t_s / 3600 for s in samples]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    a1.plot(hours, [s.rss_mb for s in samples], color="tab:blue", label="server RSS (MB)")
    a1.axvspan(0, warmup_s / 3600, color="0.9", label="warm-up")
    a1.set_ylabel("RSS (MB)")
    a1.set_title(f"Soak: RSS after warm-up {rss['first_quarter_mb']} -> "
                 f"{rss['last_quarter_mb']} MB, slope {rss['slope_mb_per_hour']} MB/hour")
    a1.grid(alpha=0.3)
    a1.legend(fontsize=8)
    a2.plot(hours, [s.turns for s in samples], color="tab:green", label="turns")
    a2.set_ylabel("turns (cumulative)")
    a2.set_xlabel("hours")
    a2.grid(alpha=0.3)
    ax = a2.twinx()
    ax.plot(hours, [s.fds for s in samples], color="tab:orange", label="open fds")
    ax.set_ylabel("open fds")
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path

