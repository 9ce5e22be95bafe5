"""Tables of summary.md that come from more than one results.json:

    python bench/results/h200-orpheus-v3-2026-12-03/tables.py

1-stream TTFA pooled over every 1-stream context of both runs (nearest-rank
quantiles), and per level the means of the server's TTFA parts
(``rtserver_first_audio_stage_ms``) with vLLM's own 7th-token p50, from each
step's /metrics deltas."""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).parent
RUNS = ["run1/single", "run1/stagger", "run2/single", "run2/stagger", "run2/burst"]
STAGES = ["segmenter", "queue", "model", "vocoder", "encode", "send"]


def load(run: str) -> dict:
    return json.loads((HERE / run / "results.json").read_text())


def rank(values: list[float], q: float) -> float:
    return sorted(values)[max(1, math.ceil(q * len(values))) - 1]


def main() -> None:
    pooled = [s["ttfa_ms"] for run in RUNS for s in load(run)["samples"]
              if s["level"] == 1 and s.get("ttfa_ms") is not None]
    print(f"1-stream TTFA, {len(pooled)} contexts: p50 {rank(pooled, 0.5):.1f} ms, "
          f"p95 {rank(pooled, 0.95):.1f}, max {max(pooled):.1f}")
    for run in RUNS:
        print(f"\n{run}: streams | " + " | ".join(STAGES) + " | vLLM 7th token p50")
        for step in load(run)["steps"]:
            m = step["metrics"]
            parts: dict[str, float] = {}
            for key, h in m.get("rtserver_first_audio_stage_ms", {}).get("series", {}).items():
                stage = dict(kv.split("=") for kv in key.split(","))["stage"]
                parts[stage] = h["mean"]
            t7 = m.get("rtserver_engine_time_to_7_tokens_seconds", {}).get("series", {})
            t7_ms = 1000 * t7["engine=vllm"]["p50"] if "engine=vllm" in t7 else math.nan
            print(f"{int(step['level'])} | " + " | ".join(
                f"{parts.get(s, math.nan):.1f}" for s in STAGES) + f" | {t7_ms:.0f}")


if __name__ == "__main__":
    main()
