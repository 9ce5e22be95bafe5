"""What a streaming vocoder's chunk plan costs a listener and the GPU.

    python -m rtserver.tools.measure.chunk_plans [--rtf 0.3 0.5 0.72 0.85 0.95]
        [--max-chunk-frames 16 8 4 2] [--growth 2.0] [--segment-frames 24 60]
        [--first-segment | --held-s 1.7]

For each chunk ceiling (``[orpheus.vocoder] max_chunk_frames``; SNAC 24 kHz
frames of 85.3 ms) and each real-time factor r of generation: the first
``buffer`` hint a context gets and when its listener starts playing
(``core.first_heard``, the server's own model: chunks arrive when the frames
they wait for are generated at r, the hint is the audio that keeps every later
chunk in time), and the frames the decoder computes per frame of audio over a
segment of ``--segment-frames`` frames (each window decodes its left context
and its lookahead besides its own frames: the vocoder's GPU time grows with
it). ``--first-segment``: a context's first segment's plan instead
(``first_chunk_config``: the ceiling is ``first_max_chunk_frames``, the growth
``first_growth``, and its own lookahead); ``--held-s``: a later segment whose
listener holds that much audio (``VocoderConfig.held_start``; no hint columns).
No model runs: this is the arithmetic of the plan, exact for the plan; the
decoder's GPU time per frame is the GPU's measurement (``measure.snac timing``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rtserver.core.first_heard import first_heard_ms
from rtserver.pacing.hints import HintConfig, prebuffer_ms
from rtserver.vocoder.chunking import ChunkConfig, ChunkPlanner, DecodeJob
from rtserver.vocoder.config import VocoderConfig
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.token_voice import chunk_timing

FRAME_MS = 1000.0 * ot.SAMPLES_PER_FRAME / ot.SAMPLE_RATE


def segment_jobs(chunking: ChunkConfig, frames: int) -> list[DecodeJob]:
    """The decodes of a ``frames``-frame segment chunked by ``chunking``,
    frames arriving one at a time."""
    planner = ChunkPlanner(chunking)
    jobs = []
    for _ in range(frames):
        jobs += planner.push(1)
    return jobs + planner.finish()


def decoded_per_frame(chunking: ChunkConfig, frames: int) -> float:
    """Frames the decoder computes per frame of a ``frames``-frame segment
    chunked by ``chunking`` (windows with their context and lookahead)."""
    return sum(j.n_frames for j in segment_jobs(chunking, frames)) / frames


def plan_config(ceiling: int, growth: float, first_segment: bool,
                held_s: float | None = None) -> ChunkConfig:
    """The server's chunking with this ceiling and growth: a later segment's
    plan (whose listener holds ``held_s``, None: unknown), or with
    ``first_segment`` a context's first segment's."""
    if first_segment:
        return VocoderConfig(first_max_chunk_frames=ceiling, first_growth=growth,
                             max_chunk_frames=max(ceiling, VocoderConfig().max_chunk_frames)
                             ).first_chunk_config(ot.SAMPLES_PER_FRAME)
    config = VocoderConfig(growth=growth, max_chunk_frames=ceiling)
    return config.segment_chunk_config(config.chunk_config(ot.SAMPLES_PER_FRAME),
                                       FRAME_MS / 1000, held_s)


def rows(rtfs: Sequence[float], ceilings: Sequence[int], growth: float,
         segment_frames: Sequence[int], jitter_ms: float, *, first_segment: bool = False,
         held_s: float | None = None) -> list[dict[str, float]]:
    out = []
    for ceiling in ceilings:
        chunking = plan_config(ceiling, growth, first_segment, held_s)
        plan, cost = chunk_timing(chunking, ot.SAMPLE_RATE, FRAME_MS)
        row: dict[str, float] = {"max_chunk_frames": ceiling}
        for frames in segment_frames:
            row[f"decoded_per_frame_{frames}"] = decoded_per_frame(chunking, frames)
            row[f"windows_{frames}"] = len(segment_jobs(chunking, frames))
        for r in rtfs if held_s is None else ():  # a listener holding audio needs no hint
            row[f"hint_{r}"] = prebuffer_ms(r, list(plan), jitter_ms, cost_ms=list(cost))
            row[f"heard_{r}"] = first_heard_ms(r, list(plan), jitter_ms, cost_ms=list(cost))
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rtf", type=float, nargs="+", default=[0.3, 0.5, 0.72, 0.85, 0.95])
    p.add_argument("--max-chunk-frames", type=int, nargs="+", default=[16, 8, 4, 2])
    p.add_argument("--growth", type=float, default=VocoderConfig().growth)
    p.add_argument("--segment-frames", type=int, nargs="+", default=[24, 60])
    p.add_argument("--jitter-ms", type=float, default=HintConfig().jitter_ms)
    plans = p.add_mutually_exclusive_group()
    plans.add_argument("--first-segment", action="store_true",
                       help="a context's first segment's plan (first_chunk_config)")
    plans.add_argument("--held-s", type=float, default=None,
                       help="a later segment whose listener holds this much audio")
    a = p.parse_args(argv)
    table = rows(a.rtf, a.max_chunk_frames, a.growth, a.segment_frames, a.jitter_ms,
                 first_segment=a.first_segment, held_s=a.held_s)
    rtfs = a.rtf if a.held_s is None else []
    head = (["max chunk frames"]
            + [f"decoded / frame, windows ({n} frames)" for n in a.segment_frames]
            + [f"hint / first heard ms at r {r}" for r in rtfs])
    which = ("a context's first segment" if a.first_segment else "later segments"
             + (f", {a.held_s:g} s held" if a.held_s is not None else ""))
    print(f"SNAC 24 kHz chunk plans ({which}), growth {a.growth}, jitter {a.jitter_ms:g} ms "
          "(hint: prebuffer_ms of the first `buffer`; first heard: after the text that "
          "completes the first segment)\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in table:
        cells = [f"{row['max_chunk_frames']:g}"]
        cells += [f"{row[f'decoded_per_frame_{n}']:.2f}, {row[f'windows_{n}']:g}"
                  for n in a.segment_frames]
        cells += [f"{row[f'hint_{r}']:.0f} / {row[f'heard_{r}']:.0f}" for r in rtfs]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
