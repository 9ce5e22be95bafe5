"""Measurements of the chunked SNAC vocoder: receptive field, seam error, speed.

    python -m rtserver.tools.measure.snac rf      [--shape 24khz|tiny]
    python -m rtserver.tools.measure.snac edges   [--shape 24khz|tiny]
    python -m rtserver.tools.measure.snac seams   [--shape 24khz|tiny] [--frames 60]
                                               [--dtype float32|bfloat16]
    python -m rtserver.tools.measure.snac timing  [--batch 1 8] [--frames 4] [--device cpu]
                                               [--graphs] [--threads N]
    python -m rtserver.tools.measure.snac lanes   --device cuda [--batch 64] [--frames 8]

Every model here has random weights (``--shape 24khz`` is the real config
shape): the speed is the real speed, the sound is noise.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rtserver.vocoder.batcher import WindowDecoder
from rtserver.vocoder.chunking import ChunkConfig, ChunkPlanner, DecodeJob, SeamJoiner
from rtserver.vocoder.config import SNAKE_CONVS, VocoderConfig
from rtserver.voices.orpheus.snac_model import DTYPES, CodeWindow, SnacDecoder
from rtserver.voices.orpheus.snac_net import SNAC24_CONFIG, TINY_SNAC_CONFIG, build_snac
from rtserver.voices.orpheus.snac_precision import max_error_db

FloatArray = npt.NDArray[np.float32]


def random_codes(n_frames: int, seed: int = 0, codebook_size: int = 4096
                 ) -> npt.NDArray[np.int64]:
    """Uniform random frames (n, 7)."""
    return np.random.default_rng(seed).integers(0, codebook_size, (n_frames, 7), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Reach:
    """How far one code's change reaches beyond its own span, in samples."""

    threshold_db: float  # change above this, re the signal RMS, counts
    left: int
    right: int


class ReachTally:
    """The worst reach per threshold over a run of perturbations."""

    def __init__(self, thresholds_db: Sequence[float]) -> None:
        self._worst = {t: [0, 0] for t in thresholds_db}

    def add(self, diff: npt.NDArray[np.floating[Any]], rms: float, start: int, end: int) -> None:
        """``diff``: |perturbed - base| decode; the change was in samples [start, end)."""
        for t, worst in self._worst.items():
            idx = np.nonzero(diff > rms * 10 ** (t / 20))[0]
            if len(idx):
                worst[0] = max(worst[0], start - int(idx[0]))
                worst[1] = max(worst[1], int(idx[-1]) + 1 - end)

    def result(self) -> list[Reach]:
        return [Reach(t, left, right) for t, (left, right) in self._worst.items()]


def measure_reach(decoder: SnacDecoder, *, n_frames: int = 24, frame: int = 12,
                  thresholds_db: Sequence[float] = (-40.0, -60.0, -80.0, -120.0),
                  seed: int = 0) -> list[Reach]:
    """Perturb each of the 7 codes of one frame in turn; worst reach per threshold.

    -120 dB (1e-6 x RMS) stands for "any change": float noise is below it.
    """
    codes = random_codes(n_frames, seed, decoder.codebook_size)
    base = decoder.decode([CodeWindow(codes, 0)])[0]
    rms = float(np.sqrt(np.mean(base.astype(np.float64) ** 2)))
    f = decoder.samples_per_frame
    spans = [(0, 1), (1, 2), (1, 2), (3, 4), (3, 4), (3, 4), (3, 4)]  # (first, count) per level
    tally = ReachTally(thresholds_db)
    for k in range(7):
        first, count = spans[k]
        sub = k - first
        span = f // count
        s0 = frame * f + sub * span
        s1 = s0 + span
        c = codes.copy()
        c[frame, k] = (c[frame, k] + decoder.codebook_size // 3) % decoder.codebook_size
        tally.add(np.abs(decoder.decode([CodeWindow(c, 0)])[0] - base), rms, s0, s1)
    return tally.result()


EDGE_DISTANCES = (0, 512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 4608)


def measure_edges(decoder: SnacDecoder, *, span: int = 256, seed: int = 3
                  ) -> dict[int, float]:
    """Error of windows cut short vs the full decode, by distance from the cut.

    24 random frames; windows ``[0, 6|10|14)`` (right edges) and ``[6|10, 24)``
    (left edges). Per distance d: the worst, over the cuts, of the max error in
    the ``span`` samples at distance d, in dB re the full decode's RMS.
    """
    n, f = 24, decoder.samples_per_frame
    codes = random_codes(n, seed, decoder.codebook_size)
    full = decoder.decode([CodeWindow(codes, 0)])[0]
    rms = float(np.sqrt(np.mean(full.astype(np.float64) ** 2)))
    worst = dict.fromkeys(EDGE_DISTANCES, -math.inf)
    cuts: list[tuple[FloatArray, bool]] = []
    for end in (6, 10, 14):
        w = decoder.decode([CodeWindow(codes[:end], 0)])[0]
        cuts.append((np.abs(w - full[:end * f]), True))
    for start in (6, 10):
        w = decoder.decode([CodeWindow(codes[start:], start)])[0]
        cuts.append((np.abs(w - full[start * f:]), False))
    for err, right in cuts:
        for d in EDGE_DISTANCES:
            part = err[len(err) - d - span:len(err) - d] if right else err[d:d + span]
            worst[d] = max(worst[d], 20 * math.log10(max(float(part.max()), 1e-12) / rms))
    return worst


WindowFactory = Callable[[npt.NDArray[Any], int], Any]


def decode_chunked(decoder: WindowDecoder[Any], codes: npt.NDArray[Any], config: ChunkConfig,
                   push_sizes: Sequence[int] = (1,), *, window: WindowFactory = CodeWindow,
                   deep_from: int | None = None) -> tuple[list[FloatArray], list[DecodeJob]]:
    """Stream ``codes`` through planner + decoder + joiner, synchronously.

    ``push_sizes`` cycles: frames per push. ``window(rows, start_frame)`` makes
    the decoder's window (SNAC ``CodeWindow`` by default; any frame rows, e.g.
    ChatTTS hidden states). ``deep_from``: pushes from that frame on say the
    listener holds a deep chunk (``ChunkPlanner.push(deep=True)``). Returns
    the emitted chunks and jobs.
    """
    planner, joiner = ChunkPlanner(config), SeamJoiner(config.samples_per_frame)
    chunks: list[FloatArray] = []
    jobs_all: list[DecodeJob] = []
    pos, i = 0, 0

    def run(jobs: list[DecodeJob]) -> None:
        windows = [window(codes[j.start_frame:j.end_frame], j.start_frame) for j in jobs]
        for job, audio in zip(jobs, decoder.decode(windows), strict=True):
            chunks.append(joiner.join(job, audio))
            jobs_all.append(job)

    while pos < len(codes):
        n = min(push_sizes[i % len(push_sizes)], len(codes) - pos)
        run(planner.push(n, deep=deep_from is not None and pos >= deep_from))
        pos, i = pos + n, i + 1
    run(planner.finish())
    return chunks, jobs_all


@dataclass(frozen=True, slots=True)
class SeamReport:
    worst_db: float  # max |chunked - full| over the signal, dB re the full decode's RMS
    seam_db: tuple[float, ...]  # per seam: max error within one frame of it
    total_samples: int
    first_chunk_samples: int


def seam_report(decoder: WindowDecoder[Any], codes: npt.NDArray[Any], config: ChunkConfig,
                push_sizes: Sequence[int] = (1,), *, window: WindowFactory = CodeWindow,
                deep_from: int | None = None) -> SeamReport:
    """Chunked decode vs one full decode of the same frames."""
    full = decoder.decode([window(codes, 0)])[0].astype(np.float64)
    chunks, jobs = decode_chunked(decoder, codes, config, push_sizes, window=window,
                                  deep_from=deep_from)
    out = np.concatenate(chunks).astype(np.float64) if chunks else np.zeros(0)
    rms = float(np.sqrt(np.mean(full ** 2)))
    if len(out) != len(full):
        raise AssertionError(f"chunked decode gave {len(out)} samples, full {len(full)}")
    err = np.abs(out - full)
    f = config.samples_per_frame

    def db(x: float) -> float:
        return 20 * math.log10(max(x, 1e-12) / rms)

    seams = [db(float(err[max(0, j.emit_start - f):j.emit_start + j.fade + f].max()))
             for j in jobs[1:]]
    return SeamReport(db(float(err.max())), tuple(seams), len(out), len(chunks[0]))


def full_decode_error_db(decoder: SnacDecoder, reference: SnacDecoder,
                         codes: npt.NDArray[Any]) -> float:
    """Max |decoder - reference| over one full decode of ``codes``, dB re the
    reference's RMS (e.g. a bfloat16 decoder against the float32 one)."""
    return max_error_db(decoder.decode([CodeWindow(codes, 0)])[0],
                        reference.decode([CodeWindow(codes, 0)])[0])


def _decoder(shape: str, device: str = "cpu", graphs: bool = False,
             dtype: str = "float32", compile: bool = False,
             snake_conv: str = "torch") -> SnacDecoder:
    cfg = {"24khz": SNAC24_CONFIG, "tiny": TINY_SNAC_CONFIG}[shape]
    return SnacDecoder(build_snac(cfg, seed=0), device=device, cuda_graphs=graphs,
                       graph_max_batch=128, graph_max_cells=1 << 20, dtype=dtype,
                       compile=compile, snake_conv=snake_conv)


@dataclass(frozen=True, slots=True)
class DecodeTiming:
    """Seconds per ``decode`` call: wall (min and median) and process CPU (median)."""

    wall_min: float
    wall_median: float
    cpu_median: float


def time_decode(decoder: SnacDecoder, batch: int, frames: int, *, repeats: int = 7
                ) -> DecodeTiming:
    """One ``decode`` call of ``batch`` windows of ``frames`` frames, after a warm-up."""
    windows = [CodeWindow(random_codes(frames, i), 100 + i) for i in range(batch)]
    decoder.decode(windows)  # warm-up (and graph capture)
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        decoder.decode(windows)  # ends with the copy to host: synchronous
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return DecodeTiming(min(wall), float(np.median(wall)), float(np.median(cpu)))


def measure_lanes(decoder: SnacDecoder, busy_batch: int, busy_frames: int, *,
                  repeats: int = 30) -> dict[str, float]:
    """CUDA: the first lane against the main one. ``lane_vs_main_max_abs``: the
    same 1-frame window through both (0: identical graphs); then ms of a 1-frame
    first chunk: idle, on the first lane while another thread keeps the main
    lane busy with ``busy_batch`` x ``busy_frames`` calls, and behind such a
    call on the main lane (what a first chunk waited without the lane)."""
    import threading

    decoder.warm_up(busy_batch * busy_frames, first_lane_frames=1)
    lane = decoder.first_lane()
    if lane is None:
        raise SystemExit("no first lane: needs --device cuda and --graphs")
    first = [CodeWindow(random_codes(1, 7), 0)]
    big = [CodeWindow(random_codes(busy_frames, i), 50 + i) for i in range(busy_batch)]
    out: dict[str, float] = {"lane_vs_main_max_abs": float(np.max(np.abs(
        lane.decode(first)[0] - decoder.decode(first)[0])))}

    def timed(fn: Callable[[], object]) -> list[float]:
        ms = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ms.append(1e3 * (time.perf_counter() - t0))
        return ms

    out["idle_main_ms"] = float(np.median(timed(lambda: decoder.decode(first))))
    out["idle_lane_ms"] = float(np.median(timed(lambda: lane.decode(first))))
    out["busy_call_ms"] = float(np.median(timed(lambda: decoder.decode(big))))
    out["behind_busy_call_ms"] = float(np.median(timed(
        lambda: (decoder.decode(big), decoder.decode(first)))))
    stop = threading.Event()

    def keep_busy() -> None:
        while not stop.is_set():
            decoder.decode(big)

    worker = threading.Thread(target=keep_busy)
    worker.start()
    try:
        beside = timed(lambda: lane.decode(first))
    finally:
        stop.set()
        worker.join()
    out["lane_beside_busy_p50_ms"] = float(np.median(beside))
    out["lane_beside_busy_p90_ms"] = float(np.percentile(beside, 90))
    return out


SCHEDULES: dict[str, ChunkConfig] = {
    "default": ChunkConfig(),
    "exact": ChunkConfig(first_frames=3, first_lookahead_samples=4757, lookahead_samples=4757,
                         crossfade_samples=0),
    "first2": ChunkConfig(first_frames=2, first_lookahead_samples=2048),
    "first4-g1.5": ChunkConfig(first_frames=4, growth=1.5, first_lookahead_samples=3584),
    "la2048": ChunkConfig(lookahead_samples=2048),
    "la3584": ChunkConfig(lookahead_samples=3584),
    # context and lookahead both 3,584: a steady 16-frame chunk's window is 20
    # frames (a graph bucket) instead of 21 (run on the 24-frame graph)
    "cx3584": ChunkConfig(context_samples=3584, lookahead_samples=3584),
    # the server's plan for a context's first segment (first_max_chunk_frames,
    # first_segment_lookahead_samples)
    "first-segment": VocoderConfig().first_chunk_config(2048),
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="chunked SNAC vocoder measurements")
    p.add_argument("what", choices=["rf", "edges", "seams", "timing", "lanes"])
    p.add_argument("--shape", choices=["24khz", "tiny"], default="24khz")
    p.add_argument("--frames", type=int, default=None)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--device", default="cpu")
    p.add_argument("--graphs", action="store_true", help="CUDA graphs (cuda only)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    p.add_argument("--dtype", choices=list(DTYPES), default="float32", help="decoder dtype")
    p.add_argument("--compile", action="store_true",
                   help="the decode through torch.compile (snac_model.SnacDecoder compile)")
    p.add_argument("--snake-conv", choices=list(SNAKE_CONVS), default="torch",
                   help="Snake and depthwise convolutions: torch's layers or fused Triton "
                        "kernels (snac_kernels)")
    a = p.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    dec = _decoder(a.shape, a.device, a.graphs, a.dtype, a.compile, a.snake_conv)
    if a.what == "rf":
        print(f"layer-derived support: {dec.support} samples")
        for r in measure_reach(dec):
            print(f"change > {r.threshold_db:+.0f} dB re RMS: left {r.left}, right {r.right}")
    elif a.what == "edges":
        for d, e in measure_edges(dec).items():
            print(f"{d:5d} samples from a cut: {e:7.1f} dB re RMS")
    elif a.what == "lanes":
        for k, v in measure_lanes(dec, a.batch[0], a.frames or 8).items():
            print(f"{k}: {v:.4g}")
    elif a.what == "seams":
        codes = random_codes(a.frames or 60, seed=1)
        print(f"dtype {a.dtype}, device {a.device}, compile {a.compile}, snake_conv "
              f"{a.snake_conv}, random weights")
        if a.dtype != "float32" or a.compile or a.snake_conv != "torch":
            ref = _decoder(a.shape, a.device, False, "float32")
            err = full_decode_error_db(dec, ref, codes)
            print(f"full decode vs float32 torch layers: {err:7.1f} dB re RMS (max abs error)")
        for name, cfg in SCHEDULES.items():
            sr = seam_report(dec, codes, cfg)
            later = max(sr.seam_db[1:], default=-math.inf)
            print(f"{name:13s} worst {sr.worst_db:7.1f} dB (first seam {sr.seam_db[0]:7.1f}, "
                  f"later {later:7.1f})  first chunk {sr.first_chunk_samples} samples, "
                  f"{len(sr.seam_db)} seams, {sr.total_samples} samples")
    else:
        frames = a.frames or 4
        import torch

        print(f"device {a.device}, torch threads {torch.get_num_threads()}, dtype {a.dtype}, "
              f"snake_conv {a.snake_conv}, random weights")
        for b in a.batch:
            t = time_decode(dec, b, frames)
            audio_s = b * frames * dec.samples_per_frame / dec.sample_rate
            print(f"batch {b} x {frames} frames: wall min {t.wall_min * 1e3:.0f} ms, median "
                  f"{t.wall_median * 1e3:.0f} ms, CPU {t.cpu_median * 1e3:.0f} ms per call "
                  f"({audio_s / t.wall_min:.2f}x real time at the min)")


if __name__ == "__main__":
    main()
