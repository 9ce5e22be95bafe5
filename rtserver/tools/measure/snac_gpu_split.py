"""The vocoder's share of the GPU: decoder time per stream-second of audio.

    python -m rtserver.tools.measure.snac_gpu_split [--device cuda] [--streams 64 128 192 256]
        [--dtype float32 bfloat16] [--no-graphs] [--segment-frames 47]
        [--repeats 5] [--max-chunk-frames 16 24 32] [--shape 24khz|tiny] [--json out.json]

The shipped vocoder (``SnacVocoder`` with ``VocoderConfig`` defaults but
``dtype``; random weights of the real 24 kHz shape: the speed is real), warmed
up as the server warms it (graphs captured), then for each stream count N:

- ``steady``: every stream's next steady-state chunk due at once (the window
  the chunk planner cuts once chunks reach ``max_chunk_frames``, context and
  lookahead included), grouped into decoder calls as the batcher groups them;
- ``segment``: N streams speaking a segment of ``segment_frames`` frames in
  lockstep, frames arriving one at a time: the k-th decode of every stream is
  grouped as one round (first chunks, growing ones, the tail).

Time per call: CUDA events on the decode stream around each ``decode`` call
(host packing, copies, replay or eager kernels, the copy back), plus wall
time; on the CPU, wall time only. Reported per row: calls and their sizes, ms
of decoder time per second of audio per stream, and ``gpu_share`` = N x that
/ 1000: the fraction of the GPU the vocoder takes to keep N streams real-time
(the rest is vLLM's). Expected on an H200: under a minute per dtype.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from rtserver.tools.measure.snac import random_codes
from rtserver.vocoder.batcher import BatcherConfig, group_windows
from rtserver.vocoder.chunking import ChunkConfig, ChunkPlanner, DecodeJob
from rtserver.vocoder.config import VocoderConfig
from rtserver.voices.orpheus.snac_model import DTYPES, CodeWindow, SnacDecoder
from rtserver.voices.orpheus.snac_net import SNAC24_CONFIG, TINY_SNAC_CONFIG, build_snac


@dataclass(frozen=True, slots=True)
class SplitRow:
    """One (dtype, workload, streams) measurement; times are medians over repeats."""

    dtype: str
    workload: str  # "steady" | "segment"
    streams: int
    max_chunk_frames: int  # the chunking's longest chunk (VocoderConfig default 16)
    calls: int
    call_sizes: dict[int, int]  # windows per call -> calls
    frames_decoded: int  # context and lookahead included
    audio_s: float  # audio emitted, all streams
    decoder_ms: float  # sum over calls: CUDA events (GPU) or wall (CPU)
    wall_ms: float
    ms_per_stream_s: float  # decoder_ms / audio_s
    gpu_share: float  # streams x ms_per_stream_s / 1000 (fraction of one device)


def steady_window(config: ChunkConfig, frames: int = 400) -> DecodeJob:
    """The chunk planner's most common job once chunks are full length."""
    planner = ChunkPlanner(config)
    jobs = [j for _ in range(frames) for j in planner.push(1)]
    full = [j for j in jobs if not j.final and j.index > 0]
    if not full:
        raise ValueError("no steady-state job in the plan")
    n_frames = Counter(j.n_frames for j in full).most_common(1)[0][0]
    return next(j for j in full if j.n_frames == n_frames)


def segment_jobs(config: ChunkConfig, frames: int) -> list[DecodeJob]:
    """Every decode of one stream of ``frames`` frames pushed one at a time."""
    planner = ChunkPlanner(config)
    jobs = [j for _ in range(frames) for j in planner.push(1)]
    return jobs + planner.finish()


class _Timer:
    """CUDA events on the current stream (GPU time), else wall time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def run(self, decoder: SnacDecoder, windows: Sequence[CodeWindow]) -> tuple[float, float]:
        """(decoder ms, wall ms) of one ``decode`` call."""
        t0 = time.perf_counter()
        if not self.cuda:
            decoder.decode(windows)
            ms = 1e3 * (time.perf_counter() - t0)
            return ms, ms
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        decoder.decode(windows)  # ends with a synchronize
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)), 1e3 * (time.perf_counter() - t0)


def _rounds(jobs_per_stream: list[list[DecodeJob]]) -> list[list[tuple[int, DecodeJob]]]:
    """Round k: the k-th job of every stream (stream index, job)."""
    depth = max(len(j) for j in jobs_per_stream)
    return [[(s, jobs[k]) for s, jobs in enumerate(jobs_per_stream) if k < len(jobs)]
            for k in range(depth)]


def measure(decoder: SnacDecoder, batcher: BatcherConfig, chunking: ChunkConfig, *,
            dtype: str, workload: str, streams: int, segment_frames: int, repeats: int
            ) -> SplitRow:
    """One row (see the module docstring)."""
    f, rate = decoder.samples_per_frame, decoder.sample_rate
    if workload == "steady":
        job = steady_window(chunking)
        per_stream = [[job]] * streams
        emitted = streams * (job.emit_end - job.emit_start)
    else:
        jobs = segment_jobs(chunking, segment_frames)
        per_stream = [jobs] * streams
        emitted = streams * segment_frames * f
    codes = [random_codes(max(j.end_frame for j in js), seed=s)
             for s, js in enumerate(per_stream)]
    calls: list[list[CodeWindow]] = []
    for rnd in _rounds(per_stream):
        windows = [CodeWindow(codes[s][j.start_frame:j.end_frame], j.start_frame)
                   for s, j in rnd]
        for group in group_windows([w.n_frames for w in windows], batcher):
            calls.append([windows[i] for i in group])
    timer = _Timer(decoder.device)
    for call in calls:  # warm: graph capture, allocator, cuDNN choices
        timer.run(decoder, call)
    dec_ms, wall_ms = [], []
    for _ in range(repeats):
        times = [timer.run(decoder, call) for call in calls]
        dec_ms.append(sum(t for t, _ in times))
        wall_ms.append(sum(w for _, w in times))
    audio_s = emitted / rate
    d = float(np.median(dec_ms))
    per = d / audio_s
    return SplitRow(dtype=dtype, workload=workload, streams=streams,
                    max_chunk_frames=chunking.max_chunk_frames, calls=len(calls),
                    call_sizes=dict(sorted(Counter(len(c) for c in calls).items())),
                    frames_decoded=sum(w.n_frames for c in calls for w in c),
                    audio_s=round(audio_s, 3), decoder_ms=round(d, 3),
                    wall_ms=round(float(np.median(wall_ms)), 3),
                    ms_per_stream_s=round(per, 3), gpu_share=round(streams * per / 1e3, 4))


def build(shape: str, device: str, dtype: str, graphs: bool) -> tuple[SnacDecoder,
                                                                       VocoderConfig]:
    """The decoder as ``SnacVocoder.load`` builds it (random weights), warmed up."""
    config = VocoderConfig(dtype=dtype, cuda_graphs=graphs)
    # (graphs are captured for the default chunking; longer windows run eager)
    model = build_snac({"24khz": SNAC24_CONFIG, "tiny": TINY_SNAC_CONFIG}[shape],
                       seed=config.dummy_seed)
    decoder = SnacDecoder(model, device=device, noise="positional",
                          noise_seed=config.noise_seed, cuda_graphs=config.cuda_graphs,
                          graph_max_batch=config.max_batch,
                          graph_max_frames=config.graph_max_frames,
                          graph_max_cells=config.graph_max_cells, dtype=dtype)
    decoder.warm_up(config.max_batch_frames)
    return decoder, config


def run(*, shape: str, device: str, dtypes: Sequence[str], streams: Sequence[int],
        graphs: bool, segment_frames: int, repeats: int,
        max_chunk_frames: Sequence[int] = (16,)) -> list[SplitRow]:
    rows: list[SplitRow] = []
    for dtype in dtypes:
        decoder, config = build(shape, device, dtype, graphs)
        batcher = config.batcher_config(device)
        for longest in max_chunk_frames:
            chunking = dataclasses.replace(config, max_chunk_frames=longest).chunk_config(
                decoder.samples_per_frame)
            for n in streams:
                for workload in ("steady", "segment"):
                    rows.append(measure(decoder, batcher, chunking, dtype=dtype,
                                        workload=workload, streams=n,
                                        segment_frames=segment_frames, repeats=repeats))
                    print(_line(rows[-1]), flush=True)
        del decoder
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return rows


def _line(r: SplitRow) -> str:
    sizes = " ".join(f"{k}x{v}" for k, v in r.call_sizes.items())
    return (f"{r.dtype:8s} {r.workload:7s} {r.streams:4d} streams, chunks <= "
            f"{r.max_chunk_frames} frames: {r.calls:3d} calls "
            f"[{sizes}] {r.frames_decoded} frames, decoder {r.decoder_ms:9.2f} ms "
            f"(wall {r.wall_ms:9.2f}) for {r.audio_s:8.2f} s of audio: "
            f"{r.ms_per_stream_s:7.3f} ms per stream-second, GPU share {r.gpu_share:.3f}")


def _environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "device": device}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["cuda"] = torch.version.cuda
        env["tf32_conv"] = torch.backends.cudnn.allow_tf32
    else:
        env["threads"] = torch.get_num_threads()
    return env


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="vocoder decoder time per stream-second")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--shape", choices=["24khz", "tiny"], default="24khz")
    p.add_argument("--streams", type=int, nargs="+", default=[64, 128, 192, 256])
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    p.add_argument("--no-graphs", action="store_true", help="eager only (CUDA)")
    p.add_argument("--segment-frames", type=int, default=47,
                   help="frames per segment in the segment workload (47: ~4 s)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-chunk-frames", type=int, nargs="+", default=[16],
                   help="longest chunk (frames): each value is a set of rows")
    p.add_argument("--json", default="", help="also write the rows and environment here")
    a = p.parse_args(argv)
    if min(a.streams) < 1 or a.segment_frames < 1 or a.repeats < 1 or min(
            a.max_chunk_frames) < 1:
        p.error("--streams, --segment-frames, --repeats, --max-chunk-frames must be >= 1")
    t0 = time.perf_counter()
    env = _environment(a.device)
    print(f"random weights, {a.shape} shape; {env}", flush=True)
    rows = run(shape=a.shape, device=a.device, dtypes=a.dtype, streams=a.streams,
               graphs=not a.no_graphs, segment_frames=a.segment_frames, repeats=a.repeats,
               max_chunk_frames=a.max_chunk_frames)
    took = time.perf_counter() - t0
    print(f"took {took:.1f} s")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as out:
            json.dump({"command": "python -m rtserver.tools.measure.snac_gpu_split " + " ".join(
                argv if argv is not None else sys.argv[1:]),
                "environment": env, "seconds": round(took, 1),
                "rows": [asdict(r) for r in rows]}, out, indent=2)


if __name__ == "__main__":
    main()
