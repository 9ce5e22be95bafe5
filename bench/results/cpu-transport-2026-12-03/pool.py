"""Pooled figures of the A/B rounds in ab/ (python pool.py, from this folder).

A step that took more than twice its planned duration is left out and named
(summary.md says what happened in each).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, round(q * (len(xs) - 1))))] if xs else float("nan")


def main() -> None:
    print("| transport | streams | contexts | TTFA p50 ms | p95 | max | server TTFA p50 | "
          "contexts that underran | errors | audio s | bench+server CPU s per audio s | "
          "other processes, cores |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for side, name in (("before", "websockets.serve"), ("after", "uvicorn websockets-sansio")):
        for level in (1, 8):
            samples: list[dict] = []
            ours = other = secs = audio = 0.0
            for run in sorted((HERE / "ab").glob(f"{side}-r*")):
                d = json.loads((run / "results.json").read_text())
                planned = d["config"].get("duration", 30)
                for step in d["steps"]:
                    if step["level"] != level:
                        continue
                    if step["seconds"] > 2 * planned + 10:
                        print(f"<!-- left out: {run.name} level {level}, step took "
                              f"{step['seconds']:.0f} s -->")
                        break
                    c = step["cpu"]
                    secs += step["seconds"]
                    ours += c["ours_cores"] * step["seconds"]
                    other += c["other_cores"] * step["seconds"]
                    ss = [s for s in d["samples"] if s["level"] == level]
                    samples += ss
                    audio += sum(s.get("audio_ms") or 0 for s in ss) / 1000
            t = [s["ttfa_ms"] for s in samples if s.get("ttfa_ms") is not None]
            srv = [s["server_ttfa_ms"] for s in samples if s.get("server_ttfa_ms") is not None]
            under = sum(1 for s in samples if (s.get("underruns") or 0) > 0)
            errs = sum(1 for s in samples if s.get("error"))
            print(f"| {name} | {level} | {len(samples)} | {pct(t, .5):.0f} | {pct(t, .95):.0f} | "
                  f"{max(t):.0f} | {pct(srv, .5):.0f} | {under} | {errs} | {audio:.0f} | "
                  f"{ours / audio:.3f} | {other / secs:.2f} |")


if __name__ == "__main__":
    main()
