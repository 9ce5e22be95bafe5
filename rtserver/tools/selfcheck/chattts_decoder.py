"""GPU self-check of ChatTTS's batched decode: graphs vs eager, timings, capacity.

    python -m rtserver.tools.selfcheck.chattts_decoder [--device cuda] [--batches 1 8 64 256]
                                                 [--route decoder|dvae] [--out FILE.json]

Real shapes, random weights (the speed is real, the sound is noise). For each
batch size: the steady-state window (73 steps: 24 context + 32 emitted + 16
lookahead + 1 of rounding, see ``config``) and the first-chunk window (16
steps), decoded eagerly and through a CUDA graph (fp32), and eagerly in bf16:

- ``graph_vs_eager_db``: max |graph - eager| re the eager RMS (float rounding:
  expect below -100 dB); ``bf16_vs_fp32_db`` the same for bf16 autocast;
- per-call wall ms (median of ``--repeats``, host packing and copies included);
- ``stream_s_per_gpu_s``: seconds of audio the steady calls emit per second of
  decode (32 steps = 0.683 s per window): streams one GPU's decoder holds in
  real time, if it did nothing else;
- ``first_lane``: a first chunk on the first lane (its own graphs and stream)
  vs the main lane, idle and while another thread keeps the main lane busy.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

from rtserver.voices.chattts.decoder.checkpoint import random_audio_models
from rtserver.voices.chattts.decoder.dims import REAL_DIMS, SAMPLE_RATE, STEP_SAMPLES
from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder, Route, StepWindow

STEADY_STEPS = 73  # window of a steady chunk with the default plan: 24 + 32 + 16 + 1 (config)
FIRST_STEPS = 16  # the first chunk's window
EMITTED_STEPS = 32  # audio a steady window emits (max_chunk_frames)


def _windows(route: Route, batch: int, steps: int, seed: int) -> list[StepWindow]:
    rng = np.random.default_rng(seed)
    if route == "decoder":
        return [StepWindow(rng.standard_normal((steps, REAL_DIMS.gpt_hidden)).astype(np.float32),
                           0) for _ in range(batch)]
    return [StepWindow(rng.integers(0, 625, (steps, 4)), 0) for _ in range(batch)]


def _db(err: float, ref: float) -> float:
    return 20 * math.log10(max(err, 1e-12) / max(ref, 1e-12))


def _compare(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    err = max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))
    ref = math.sqrt(float(np.mean(np.concatenate(b).astype(np.float64) ** 2)))
    return _db(err, ref)


def _compare_rms(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """RMS of the difference re the RMS of ``b`` (an SNR, negated), dB."""
    d = np.concatenate([x - y for x, y in zip(a, b, strict=True)]).astype(np.float64)
    ref = np.concatenate(b).astype(np.float64)
    return _db(math.sqrt(float(np.mean(d ** 2))), math.sqrt(float(np.mean(ref ** 2))))


def _time(dec: ChatTTSWindowDecoder, windows: list[StepWindow], repeats: int) -> float:
    dec.decode(windows)  # warm-up (and capture)
    ms = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dec.decode(windows)  # ends with the copy to host: synchronous
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms)


def _lane_check(main: ChatTTSWindowDecoder, route: Route, *, busy_batch: int, busy_steps: int,
                repeats: int) -> dict[str, Any]:
    """The first lane (CUDA graphs): its output vs the main lane's for the same
    first-chunk window, and ms of a first chunk idle, on the lane while another
    thread keeps the main lane busy with ``busy_batch`` steady windows, and the
    busy call itself (what a first chunk waits behind without the lane)."""
    import threading

    lane = main.first_lane(max_batch=8, max_steps=FIRST_STEPS)
    if lane is None:
        return {"available": False}
    first = _windows(route, 1, FIRST_STEPS, seed=7)
    busy = _windows(route, busy_batch, busy_steps, seed=8)  # a captured shape
    out: dict[str, Any] = {"available": True,
                           "lane_vs_main_db": round(_compare(lane.decode(first),
                                                             main.decode(first)), 1),
                           "first_idle_ms": round(_time(lane, first, repeats), 3),
                           "busy_call_ms": round(_time(main, busy, repeats), 3)}
    stop = threading.Event()

    def keep_busy() -> None:
        while not stop.is_set():
            main.decode(busy)

    t = threading.Thread(target=keep_busy, daemon=True)
    t.start()
    try:
        out["first_on_lane_while_busy_ms"] = round(_time(lane, first, repeats), 3)
    finally:
        stop.set()
        t.join()
    return out


def run(device: str, batches: list[int], route: Route, repeats: int,
        steady_steps: tuple[int, ...] = (STEADY_STEPS,)) -> dict[str, Any]:
    """``steady_steps``: steady window lengths to time (101: the exact left
    context; shorter: a left context cut to the measured edge error)."""
    import torch

    dec_m, dvae_m, vocos = random_audio_models(REAL_DIMS, seed=0, layer_scale=0.5)
    mel = dec_m if route == "decoder" else dvae_m
    buckets = (FIRST_STEPS, *steady_steps)  # the shapes timed here (the server's: config)
    common: dict[str, Any] = dict(device=device, graph_max_batch=max(batches),
                                  graph_frame_buckets=buckets,
                                  graph_max_cells=max(batches) * max(steady_steps))
    eager = ChatTTSWindowDecoder(mel, vocos, REAL_DIMS, route, cuda_graphs=False, **common)
    graphs = ChatTTSWindowDecoder(mel, vocos, REAL_DIMS, route, cuda_graphs=True, **common)
    bf16 = ChatTTSWindowDecoder(mel, vocos, REAL_DIMS, route, cuda_graphs=True, bf16=True,
                                **common)
    t0 = time.perf_counter()
    held = graphs.warm_up() + bf16.warm_up()
    capture_s = time.perf_counter() - t0
    rows = []
    for b in batches:
        for steps in (FIRST_STEPS, *steady_steps):
            w = _windows(route, b, steps, seed=b * 1000 + steps)
            ref = eager.decode(w)
            low = bf16.decode(w)
            row: dict[str, Any] = {
                "batch": b, "steps": steps,
                "graph_vs_eager_db": round(_compare(graphs.decode(w), ref), 1),
                "bf16_vs_fp32_db": round(_compare(low, ref), 1),
                "bf16_vs_fp32_rms_db": round(_compare_rms(low, ref), 1),
                "eager_ms": round(_time(eager, w, repeats), 3),
                "graph_ms": round(_time(graphs, w, repeats), 3),
                "graph_bf16_ms": round(_time(bf16, w, repeats), 3),
            }
            if steps != FIRST_STEPS:
                audio_s = b * EMITTED_STEPS * STEP_SAMPLES / SAMPLE_RATE
                for k in ("eager", "graph", "graph_bf16"):
                    row[f"stream_s_per_gpu_s_{k}"] = round(audio_s / (row[f"{k}_ms"] / 1e3), 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    lane_info = _lane_check(graphs, route, busy_batch=min(64, max(batches)),
                            busy_steps=max(steady_steps), repeats=repeats)
    print(json.dumps({"first_lane": lane_info}), flush=True)
    info: dict[str, Any] = {
        "first_lane": lane_info,
        "what": "ChatTTS Decoder+Vocos batched decode, real shapes, random weights",
        "route": route, "device": device, "torch": torch.__version__,
        "python": platform.python_version(), "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "graphs_held": held, "capture_s": round(capture_s, 1),
        "plan": {"steady_window_steps": list(steady_steps), "emitted_steps": EMITTED_STEPS,
                 "first_window_steps": FIRST_STEPS},
        "rows": rows,
    }
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
        info["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    worst = max(r["graph_vs_eager_db"] for r in rows)
    info["ok"] = worst <= -80.0  # graphs replay the eager kernels: rounding only
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--route", choices=["decoder", "dvae"], default="decoder")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--steady-steps", type=int, nargs="+", default=[STEADY_STEPS])
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    info = run(a.device, a.batches, a.route, a.repeats, tuple(a.steady_steps))
    text = json.dumps(info, indent=1)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return 0 if info["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
