"""Per level, the means of the server's TTFA parts (``rtserver_first_audio_stage_ms``),
the engine's own first-step and 7th-step p50 and the decoder's busy time, from each
step's /metrics deltas in results.json(.gz):

    python bench/results/h200-chattts-2026-12-03-run2/tables.py
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

HERE = Path(__file__).parent
RUNS = ["single", "stagger", "burst"]
STAGES = ["segmenter", "queue", "model", "vocoder", "encode", "send"]


def load(run: str) -> dict:
    plain = HERE / run / "results.json"
    if plain.is_file():
        return json.loads(plain.read_text())
    with gzip.open(HERE / run / "results.json.gz", "rt") as f:
        return json.load(f)


def p50_ms(m: dict, name: str) -> float:
    series = m.get(name, {}).get("series", {})
    return 1000 * series["engine=chattts"]["p50"] if "engine=chattts" in series else math.nan


def total(m: dict, name: str) -> float:
    return sum(m.get(name, {}).get("series", {}).values()) if name in m else math.nan


def main() -> None:
    for run in RUNS:
        print(f"\n{run}: streams | " + " | ".join(STAGES)
              + " | engine 1st step p50 | 7th step p50 | decoder s | step s | padded/frames")
        for step in load(run)["steps"]:
            m = step["metrics"]
            parts: dict[str, float] = {}
            for key, h in m.get("rtserver_first_audio_stage_ms", {}).get("series", {}).items():
                parts[dict(kv.split("=") for kv in key.split(","))["stage"]] = h["mean"]
            frames = total(m, "rtserver_engine_chattts_decoder_frames")
            padded = total(m, "rtserver_engine_chattts_decoder_padded_frames")
            print(f"{int(step['level'])} | "
                  + " | ".join(f"{parts.get(s, math.nan):.1f}" for s in STAGES)
                  + f" | {p50_ms(m, 'rtserver_engine_time_to_first_token_seconds'):.0f}"
                  + f" | {p50_ms(m, 'rtserver_engine_time_to_7_tokens_seconds'):.0f}"
                  + f" | {total(m, 'rtserver_engine_chattts_decoder_decode_seconds'):.1f}"
                  + f" | {step.get('seconds', math.nan):.1f}"
                  + f" | {padded / frames:.2f}")


if __name__ == "__main__":
    main()
