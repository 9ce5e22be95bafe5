"""Aggregate samples into rows, find the capacity, write summary.md (pure but
for ``write_markdown``'s file)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtserver.tools.bench.stats import summarize

Sample = dict[str, Any]
GroupKey = tuple[str, str, str, float]  # (system, run, load, level)


SYSTEM_ORDER = ("rtserver", "baseline", "orpheus-reference")


def group_key(s: Sample) -> GroupKey:
    return (s.get("system", "rtserver"), s.get("run", "sweep"), s.get("load", "?"),
            float(s.get("level", 0)))


def _order(key: GroupKey) -> tuple[int, str, str, str, float]:
    system = key[0]
    rank = SYSTEM_ORDER.index(system) if system in SYSTEM_ORDER else len(SYSTEM_ORDER)
    return (rank, system, key[1], key[2], key[3])


def _guesses(series: dict[str, float]) -> str:
    """``started / adopted / dropped`` summed over voices, or "–" without any."""
    counts = {"started": 0.0, "adopted": 0.0, "dropped": 0.0}
    for labels, value in series.items():
        for outcome in counts:
            if f"outcome={outcome}" in labels.split(","):
                counts[outcome] += value
    if not any(counts.values()):
        return "–"
    return " / ".join(f"{v:g}" for v in counts.values())


def _fmt(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}"


@dataclass(frozen=True, slots=True)
class Row:
    """The figures of one (system, run, load, level) group."""

    system: str
    run: str
    load: str
    level: float
    stats: dict[str, Any]

    @property
    def contexts(self) -> int:
        return int(self.stats["contexts"])


def aggregate(samples: Iterable[Sample]) -> list[Row]:
    groups: dict[GroupKey, list[Sample]] = {}
    for s in samples:
        groups.setdefault(group_key(s), []).append(s)
    rows = []
    for key in sorted(groups, key=_order):
        ss = groups[key]
        spoken = [s for s in ss if s.get("kind") != "connect"]
        failed = [s for s in ss if s.get("outcome") in ("error", "failed")]
        played = [s for s in spoken if s.get("frames")]
        cancels = [s for s in spoken if s.get("cancel_to_cancelled_ms") is not None]
        stats: dict[str, Any] = {
            "contexts": len(spoken),
            "errors": len(failed),
            "error_codes": sorted({str(s.get("error")) for s in failed}),
            "cancelled": sum(1 for s in spoken if s.get("outcome") == "cancelled"),
            "ttfa_ms": summarize([s.get("ttfa_ms") for s in spoken]).as_dict(),
            "ttfa_first_text_ms": summarize([s.get("ttfa_first_text_ms")
                                             for s in spoken]).as_dict(),
            "ttfa_after_lookahead_ms": summarize([s.get("ttfa_after_lookahead_ms")
                                                  for s in spoken]).as_dict(),
            "server_ttfa_ms": summarize([s.get("server_ttfa_ms") for s in spoken]).as_dict(),
            "playback_start_ms": summarize([s.get("playback_start_ms")
                                            for s in spoken]).as_dict(),
            "underrun_contexts": sum(1 for s in played if (s.get("underruns") or 0) > 0),
            "underruns": sum(int(s.get("underruns") or 0) for s in played),
            "stalled_ms": summarize([s.get("stalled_ms") for s in played]).as_dict(),
            "gap_max_ms": summarize([s.get("gap_max_ms") for s in played]).as_dict(),
            "behind_max_ms": summarize([s.get("behind_max_ms") for s in played]).as_dict(),
            "prebuffer_ms": summarize([s.get("prebuffer_ms") for s in played]).as_dict(),
            "rtf": summarize([s.get("rtf") for s in played]).as_dict(),
            "audio_s": sum(float(s.get("audio_ms") or 0) for s in spoken) / 1000.0,
            "cancel_to_cancelled_ms": summarize([s.get("cancel_to_cancelled_ms")
                                                 for s in cancels]).as_dict(),
            "cancel_to_last_frame_ms": summarize([s.get("cancel_to_last_frame_ms")
                                                  for s in cancels]).as_dict(),
            "played_contexts": len(played),
        }
        rows.append(Row(*key, stats))
    return rows


def passes(row: Row, ttfa_p99_ms: float) -> bool:
    """Real time at this level: every context played without an underrun, none
    failed, and the TTFA p99 is within the bound."""
    st = row.stats
    p99 = st["ttfa_ms"]["p99"]
    return (row.contexts > 0 and st["errors"] == 0 and st["underrun_contexts"] == 0
            and p99 is not None and p99 <= ttfa_p99_ms)


@dataclass(frozen=True, slots=True)
class Capacity:
    system: str
    load: str
    streams: int  # the highest level that passes with every lower level passing too
    highest_passing: int  # the highest level that passes at all
    first_failing: float | None
    why_failing: str
    ttfa_p99_ms: float


def capacity(rows: Sequence[Row], ttfa_p99_ms: float) -> list[Capacity]:
    """Per (system, load) of the sweep: most concurrent real-time streams."""
    out = []
    keys = sorted({(r.system, r.load) for r in rows if r.run in ("sweep", "ramp")},
                  key=lambda k: _order((k[0], "", k[1], 0.0)))
    for system, load in keys:
        levels = sorted((r for r in rows if (r.system, r.load) == (system, load)
                         and r.run in ("sweep", "ramp")), key=lambda r: r.level)
        streams = 0
        first_fail: Row | None = None
        for r in levels:
            if passes(r, ttfa_p99_ms):
                if first_fail is None:
                    streams = int(r.level)
            elif first_fail is None:
                first_fail = r
        best = max((int(r.level) for r in levels if passes(r, ttfa_p99_ms)), default=0)
        why = ""
        if first_fail is not None:
            st = first_fail.stats
            parts = []
            if st["errors"]:
                parts.append(f"{st['errors']} errors ({', '.join(st['error_codes'])})")
            if st["underrun_contexts"]:
                parts.append(f"{st['underrun_contexts']}/{st['played_contexts']} contexts "
                             "underran")
            p99 = st["ttfa_ms"]["p99"]
            if p99 is None or p99 > ttfa_p99_ms:
                parts.append(f"TTFA p99 {_fmt(p99)} ms")
            why = "; ".join(parts) or "no contexts"
        out.append(Capacity(system, load, streams, best,
                            first_fail.level if first_fail else None, why, ttfa_p99_ms))
    return out


def _config_line(cfg: dict[str, Any]) -> str:
    listen = cfg.get("users_listen")
    pacing = ("" if listen is None else "users listen to each reply before the next turn; "
              if listen else "turns back to back (no listening); ")
    if cfg.get("stagger_s"):
        pacing += f"users join spread over {cfg['stagger_s']:g} s; "
    else:
        pacing += "all users start at once (a burst); "
    return (f"{pacing}seed {cfg['seed']}; {cfg['duration_s']:g} s per step; fragments "
            f"'{cfg['fragment']}' at {cfg['tokens_per_s']:g}/s (jitter {cfg['jitter']:g}); "
            f"{cfg['format']} {cfg['sample_rate']} Hz, {cfg['frame_ms']:g} ms frames")


def _run_lines(meta: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    runs = meta.get("runs")
    if not runs:
        return [f"- Command: `{meta['command']}`", f"- {_config_line(cfg).capitalize()}"]
    lines = ["- Runs (merged with `python -m rtserver.tools.bench.merge`):"]
    for r in runs:
        lines.append(f"  - {r['name']} ({r['date']}): `{r['command']}`; "
                     f"{_config_line(r['config'])}")
    return lines


def _level(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def markdown(results: dict[str, Any], rows: Sequence[Row], caps: Sequence[Capacity]
             ) -> str:
    """summary.md: machine, command, capacity, TTFA, real time, barge-in,
    baseline ratios, server-side figures, definitions."""
    meta = results["meta"]
    cfg = results["config"]
    lines = [f"# rtserver benchmark, {meta['date']}", ""]
    bf16 = {True: ", native bf16", False: ", no native bf16"}.get(
        meta["machine"].get("native_bf16"), "")  # None: a results file from before
    lines += [f"- Machine: {meta['machine']['cpu']} ({meta['machine']['cores']} cores, "
              f"{meta['machine']['memory_gib']:.1f} GiB{bf16}), {meta['machine']['os']}; "
              "no GPU used"
              if not meta["machine"].get("gpu") else f"- Machine: {meta['machine']}",
              f"- Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
              f"- Server: {meta['server']}; voice {meta.get('voice') or 'default'}",
              *_run_lines(meta, cfg),
              "- Client and server ran on the same machine over loopback: the client's CPU "
              "time is taken from the server's.", ""]
    if meta.get("notes"):
        lines += [f"- {n}" for n in meta["notes"]] + [""]
    if caps:
        lines += ["## Capacity", ""]
        for c in caps:
            s = (f"- **{c.system}, load {c.load}: {c.streams} concurrent real-time streams "
                 f"with TTFA p99 under {c.ttfa_p99_ms:g} ms and zero underruns**")
            if c.first_failing is not None:
                s += f" (first failing level {_level(c.first_failing)}: {c.why_failing}"
                if c.highest_passing > c.streams:
                    s += f"; level {c.highest_passing} passed again"
                s += ")"
            else:
                s += " (every level tested passed: the limit is above the sweep)"
            lines.append(s)
        lines.append("")
    by_load: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        by_load.setdefault((r.system, r.run, r.load), []).append(r)
    lines += ["## Time to first audio (ms)", "",
              "TTFA = first frame received − the send that completed the first segment "
              "(an upper bound: any wait for look-ahead text counts); look-ahead = from the "
              "next send when it went out before the first frame (a lower estimate); "
              "first-text = from the first fragment; server = `done.ttfa_ms`; first heard = "
              "time to first heard audio, the simulated listener's playback start (after it "
              "buffered the server's `buffer` hint) − the same send as TTFA.", ""]
    for (system, run, load), rs in by_load.items():
        lines += [f"### {system}, {run}, {load}", ""]
        lvl = "arrivals/s" if run == "poisson" else "streams"
        lines += _table(
            [lvl, "contexts", "p50", "p95", "p99", "max", "first heard p50", "first heard p99",
             "look-ahead p50", "look-ahead p99",
             "first-text p50", "first-text p95", "first-text p99", "server p50",
             "server p99"],
            ([_level(r.level), str(r.contexts), _fmt(r.stats["ttfa_ms"]["p50"]),
              _fmt(r.stats["ttfa_ms"]["p95"]), _fmt(r.stats["ttfa_ms"]["p99"]),
              _fmt(r.stats["ttfa_ms"]["max"]), _fmt(r.stats["playback_start_ms"]["p50"]),
              _fmt(r.stats["playback_start_ms"]["p99"]),
              _fmt(r.stats["ttfa_after_lookahead_ms"]["p50"]),
              _fmt(r.stats["ttfa_after_lookahead_ms"]["p99"]),
              _fmt(r.stats["ttfa_first_text_ms"]["p50"]),
              _fmt(r.stats["ttfa_first_text_ms"]["p95"]),
              _fmt(r.stats["ttfa_first_text_ms"]["p99"]),
              _fmt(r.stats["server_ttfa_ms"]["p50"]), _fmt(r.stats["server_ttfa_ms"]["p99"])]
             for r in rs))
        lines.append("")
    lines += ["## Real time", "",
              "A simulated listener buffers the server's `buffer.prebuffer_ms`, then plays in "
              "real time (rtserver/tools/bench/listener.py).", ""]
    for (system, run, load), rs in by_load.items():
        lines += [f"### {system}, {run}, {load}", ""]
        lines += _table(
            ["level", "contexts", "underran", "underruns", "stalled p99 ms", "max gap p99 ms",
             "behind p99 ms", "prebuffer p50 ms", "playback start p50 ms", "rtf p50",
             "audio s", "errors"],
            ([_level(r.level), str(r.contexts), str(r.stats["underrun_contexts"]),
              str(r.stats["underruns"]), _fmt(r.stats["stalled_ms"]["p99"]),
              _fmt(r.stats["gap_max_ms"]["p99"]), _fmt(r.stats["behind_max_ms"]["p99"]),
              _fmt(r.stats["prebuffer_ms"]["p50"]), _fmt(r.stats["playback_start_ms"]["p50"]),
              _fmt(r.stats["rtf"]["p50"], 3), _fmt(r.stats["audio_s"], 1),
              str(r.stats["errors"]) + (f" ({', '.join(r.stats['error_codes'])})"
                                        if r.stats["errors"] else "")]
             for r in rs))
        lines.append("")
    cancel_rows = [r for r in rows if r.stats["cancel_to_cancelled_ms"]["n"]]
    if cancel_rows:
        lines += ["## Barge-in", "", "cancel sent → `cancelled` received, and → the last "
                  "frame received after the cancel (0 when none came).", ""]
        lines += _table(
            ["system / load", "level", "cancels", "→cancelled p50", "p95", "→last frame p50",
             "p95", "max"],
            ([f"{r.system} / {r.load}", _level(r.level),
              str(r.stats["cancel_to_cancelled_ms"]["n"]),
              _fmt(r.stats["cancel_to_cancelled_ms"]["p50"], 1),
              _fmt(r.stats["cancel_to_cancelled_ms"]["p95"], 1),
              _fmt(r.stats["cancel_to_last_frame_ms"]["p50"], 1),
              _fmt(r.stats["cancel_to_last_frame_ms"]["p95"], 1),
              _fmt(r.stats["cancel_to_last_frame_ms"]["max"], 1)] for r in cancel_rows))
        lines.append("")
    ratio_lines = ratios(rows)
    if ratio_lines:
        lines += ["## Non-streaming baseline vs rtserver", "",
                  "Baseline: the same voice behind a plain HTTP endpoint that synthesizes the "
                  "whole reply once all of it has arrived and answers one WAV "
                  "(rtserver/tools/bench/baseline.py). Ratio = baseline / rtserver at the same "
                  "level.", ""]
        lines += _table(["load", "level", "TTFA p50 ms (base / rt)", "ratio",
                         "first-text p50 ms (base / rt)", "ratio", "p95 first-text ratio"],
                        ratio_lines)
        lines.append("")
    steps = results.get("steps", [])
    audio_s = step_audio_s(results.get("samples", []))
    cpu_rows = [[st["system"], st["load"], _level(st["level"]), _fmt(st["seconds"]),
                 _fmt(st["cpu"]["busy_cores"], 2), _fmt(st["cpu"]["ours_cores"], 2),
                 _fmt(st["cpu"]["other_cores"], 2), _fmt(st["cpu"].get("stolen_cores"), 2),
                 _fmt(_cpu_per_audio_s(st, audio_s), 3)]
                for st in steps if (st.get("cpu") or {}).get("busy_cores") is not None]
    if cpu_rows:
        lines += ["## CPU during each step", "",
                  "Cores busy on the whole machine, by the bench and the servers it started "
                  "(ours), by every other process (other: load that competed with the "
                  "server under test; near 0 for a clean run), and taken by the hypervisor "
                  "for other guests (stolen: /proc/stat's steal; near 0 for a clean run, "
                  "else the host was slower than it measured). Ours per audio s: CPU "
                  "seconds of ours per second of audio received, so C whole cores carry "
                  "at most C / that many real-time streams (other load makes it larger).",
                  ""]
        lines += _table(["system", "load", "level", "seconds", "busy cores", "ours",
                         "other", "stolen", "ours per audio s"], cpu_rows)
        lines.append("")
    server_rows = []
    for st in steps:
        m = st.get("metrics") or {}
        ttfa_s = next(iter((m.get("rtserver_ttfa_seconds") or {}).get("series", {}).values()),
                      None)
        # the table is in ms, /metrics in seconds (Prometheus' base unit)
        ttfa = None if ttfa_s is None else {
            k: v if k == "count" or v is None else 1000.0 * v for k, v in ttfa_s.items()}
        rtf = next(iter((m.get("rtserver_rtf") or {}).get("series", {}).values()), None)
        errs = (m.get("rtserver_errors") or {}).get("series", {})
        outcomes = (m.get("rtserver_contexts") or {}).get("series", {})
        guesses = _guesses((m.get("rtserver_first_segment_speculations") or {}).get("series",
                                                                                  {}))
        if ttfa is None and rtf is None and not outcomes:
            continue
        server_rows.append([
            st["system"], st["load"], _level(st["level"]),
            _fmt(ttfa["count"]) if ttfa else "–", _fmt(ttfa["p50"]) if ttfa else "–",
            _fmt(ttfa["p95"]) if ttfa else "–", _fmt(ttfa["p99"]) if ttfa else "–",
            _fmt(rtf["p50"], 3) if rtf else "–", _fmt(rtf["p99"], 3) if rtf else "–",
            ", ".join(f"{k}: {v:g}" for k, v in outcomes.items()) or "–",
            ", ".join(f"{k}: {v:g}" for k, v in errs.items()) or "0", guesses])
    if server_rows:
        lines += ["## Server side (/metrics, change over each step)", "",
                  "Histogram quantiles are bucket interpolations (as Prometheus' "
                  "`histogram_quantile`), so they are coarse. First-segment guesses: "
                  "speculative first segments started / adopted / dropped "
                  "(`rtserver_first_segment_speculations_total`).", ""]
        lines += _table(["system", "load", "level", "ttfa n", "ttfa p50", "p95", "p99",
                         "rtf p50", "rtf p99", "contexts", "errors",
                         "first-segment guesses"], server_rows)
        lines.append("")
    lines += ["## Definitions", "",
              "See tools/bench/measure.py (which send completes the first segment: the fragment "
              "carrying its last punctuation, else the `flush`/`end` after it; look-ahead "
              "waits count against the server), tools/bench/listener.py (the listener) and "
              "rtserver/tools/bench/README.md.", ""]
    return "\n".join(lines)


def step_audio_s(samples: Iterable[Sample]) -> dict[GroupKey, float]:
    """Seconds of audio the client received, per step (``group_key``)."""
    out: dict[GroupKey, float] = {}
    for s in samples:
        key = group_key(s)
        out[key] = out.get(key, 0.0) + float(s.get("audio_ms") or 0.0) / 1000.0
    return out


def _cpu_per_audio_s(step: dict[str, Any], audio_s: dict[GroupKey, float]) -> float | None:
    audio = audio_s.get(group_key(step), 0.0)
    ours = step["cpu"].get("ours_cores")
    if not audio or ours is None:
        return None
    return float(ours) * float(step["seconds"]) / audio


def ratios(rows: Sequence[Row]) -> list[list[str]]:
    """Baseline / rtserver at matching (load, level) of the sweep."""
    rt = {(r.load, r.level): r for r in rows if r.system == "rtserver" and r.run == "sweep"}
    out = []
    for r in rows:
        if r.system != "baseline" or r.run != "sweep":
            continue
        s = rt.get((r.load, r.level))
        if s is None:
            continue

        def ratio(metric: str, q: str, b: Row = r, a: Row = s) -> str:
            x, y = b.stats[metric][q], a.stats[metric][q]
            return "–" if x is None or not y else f"{x / y:.1f}×"

        out.append([r.load, _level(r.level),
                    f"{_fmt(r.stats['ttfa_ms']['p50'])} / {_fmt(s.stats['ttfa_ms']['p50'])}",
                    ratio("ttfa_ms", "p50"),
                    f"{_fmt(r.stats['ttfa_first_text_ms']['p50'])} / "
                    f"{_fmt(s.stats['ttfa_first_text_ms']['p50'])}",
                    ratio("ttfa_first_text_ms", "p50"), ratio("ttfa_first_text_ms", "p95")])
    return out


def write_markdown(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
