"""Measurements of ChatTTS's streaming decode: receptive field, edge error, seams.

    python -m rtserver.tools.measure.chattts_decoder reach  [--shape real|tiny]
         [--route decoder|dvae]
                                                      [--layer-scale 0.5]
    python -m rtserver.tools.measure.chattts_decoder edges  [--shape real|tiny] [--route ...]
    python -m rtserver.tools.measure.chattts_decoder seams  [--shape real|tiny] [--steps 160]
    python -m rtserver.tools.measure.chattts_decoder cost   [--shape real] [--batches 1,8,16]
    ... --root MODEL_DIR   (any of them on real weights: MODEL_DIR/asset/*.safetensors)

Without ``--root`` the checkpoint has random weights (``--shape real``: the real
shapes; ``narrow``: real depths, narrow widths); hidden states are i.i.d.
N(0, 1) per value, codes uniform (real weights deserve real hidden states: the
figures with them are indicative). Figures are in dB
re the full decode's RMS, worst over 256-sample spans.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rtserver.tools.layouts.chattts_decoder import DEFAULT_LAYER_SCALE
from rtserver.tools.measure.snac import Reach, ReachTally, SeamReport, seam_report
from rtserver.vocoder.chunking import ChunkConfig
from rtserver.voices.chattts.decoder.checkpoint import load_audio_models, random_audio_models
from rtserver.voices.chattts.decoder.dims import (
    REAL_DIMS,
    STEP_SAMPLES,
    exact_support,
    narrow_dims,
    tiny_dims,
)
from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder, Route, StepWindow

F = STEP_SAMPLES


def random_steps(decoder: ChatTTSWindowDecoder, n: int, seed: int = 0) -> npt.NDArray[np.generic]:
    """``n`` random steps for the decoder's route: N(0,1) hidden states or uniform codes."""
    rng = np.random.default_rng(seed)
    if decoder.route == "decoder":
        return rng.standard_normal((n, decoder.width)).astype(np.float32)
    return rng.integers(0, decoder.dims.vq.codebook_size, (n, decoder.width), dtype=np.int64)


SHAPES = {"real": REAL_DIMS, "narrow": narrow_dims(), "tiny": tiny_dims()}


def build_decoder(shape: str, route: Route = "decoder", *, layer_scale: float =
                  DEFAULT_LAYER_SCALE, seed: int = 0, device: str = "cpu",
                  root: Path | None = None, **kwargs: Any) -> ChatTTSWindowDecoder:
    """Load ``root``, or random weights of ``shape`` ("real", "narrow", "tiny")."""
    if root is not None:
        mel, vocos, dims = load_audio_models(root, route)
    else:
        dims = SHAPES[shape]
        dec, dvae, vocos = random_audio_models(dims, seed=seed, layer_scale=layer_scale)
        mel = dec if route == "decoder" else dvae
    return ChatTTSWindowDecoder(mel, vocos, dims, route, device=device, **kwargs)


def _db(x: float, rms: float) -> float:
    return 20 * math.log10(max(x, 1e-12) / rms)


def _span_max(err: npt.NDArray[np.float64], span: int) -> npt.NDArray[np.float64]:
    n = len(err) // span
    return np.asarray(err[:n * span].reshape(n, span).max(axis=1), dtype=np.float64)


def measure_reach(decoder: ChatTTSWindowDecoder, *, n_steps: int = 160, steps: Sequence[int] =
                  (70, 80, 90), thresholds_db: Sequence[float] = (-20, -40, -60, -80, -120),
                  seed: int = 0) -> list[Reach]:
    """Perturb one step (a fresh random hidden state, or all 4 codes changed) at
    each of ``steps`` in turn; worst reach per threshold over them. -120 dB
    stands for "any change" (float rounding sits below it)."""
    x = random_steps(decoder, n_steps, seed)
    base = decoder.decode([StepWindow(x, 0)])[0].astype(np.float64)
    rms = float(np.sqrt(np.mean(base ** 2)))
    alt = random_steps(decoder, n_steps, seed + 1)
    tally = ReachTally(thresholds_db)
    for s in steps:
        y = x.copy()
        y[s] = alt[s]
        tally.add(np.abs(decoder.decode([StepWindow(y, 0)])[0] - base), rms, s * F, (s + 1) * F)
    return tally.result()


def measure_edges(decoder: ChatTTSWindowDecoder, *, n_steps: int = 200, span: int = 256,
                  distances: Sequence[int] = tuple(range(0, 28 * 1024 + 1, 1024)),
                  seed: int = 3) -> dict[int, tuple[float, float]]:
    """Error of windows cut short vs the full decode, by distance from the cut.

    Right edges: windows ``[0, c)`` for c in 70, 100, 130; left edges ``[c, n)``.
    Per distance d (samples from the cut into the window): the worst over the
    cuts of the max error in the ``span`` samples there, dB re RMS, as
    ``(left edge, right edge)``.
    """
    x = random_steps(decoder, n_steps, seed)
    full = decoder.decode([StepWindow(x, 0)])[0].astype(np.float64)
    rms = float(np.sqrt(np.mean(full ** 2)))
    out = {d: [-math.inf, -math.inf] for d in distances}
    cuts = (70, 100, 130)
    rights = decoder.decode([StepWindow(x[:c], 0) for c in cuts])
    lefts = decoder.decode([StepWindow(x[c:], c) for c in cuts])
    for c, r, lft in zip(cuts, rights, lefts, strict=True):
        er = np.abs(r - full[:c * F])
        el = np.abs(lft - full[c * F:])
        for d in distances:
            if d + span <= len(er):
                out[d][1] = max(out[d][1], _db(float(er[len(er) - d - span:len(er) - d].max()),
                                               rms))
            if d + span <= len(el):
                out[d][0] = max(out[d][0], _db(float(el[d:d + span].max()), rms))
    return {d: (v[0], v[1]) for d, v in out.items()}


def chatts_seam_report(decoder: ChatTTSWindowDecoder, x: npt.NDArray[np.generic],
                       config: ChunkConfig, push_sizes: Sequence[int] = (1,), *,
                       deep_from: int | None = None) -> SeamReport:
    """Chunked (planner + joiner) vs full decode of the same steps."""
    return seam_report(decoder, x, config, push_sizes, window=StepWindow, deep_from=deep_from)


def window_steps(emitted: int) -> int:
    """Steps of a steady window that emits ``emitted`` steps (the default plan's
    context and lookahead, and the crossfade's extra step)."""
    from rtserver.voices.chattts.decoder.config import ChatTTSDecodeConfig

    c = ChatTTSDecodeConfig()
    return (c.context_samples + c.lookahead_samples + c.crossfade_samples) // F + 1 + emitted


def decode_cost(decoder: ChatTTSWindowDecoder, batch: int, *, seed: int = 0,
                repeats: int = 5) -> dict[int, float]:
    """Seconds of one call of ``batch`` steady windows, best of ``repeats``, for
    the default plan's chunk (``max_chunk_frames``) and a deep chunk
    (``DEEP_CHUNK_STEPS``)."""
    from rtserver.voices.chattts.decoder.config import DEEP_CHUNK_STEPS, ChatTTSDecodeConfig

    c = ChatTTSDecodeConfig()
    out: dict[int, float] = {}
    for emitted in (c.max_chunk_frames, DEEP_CHUNK_STEPS):
        x = random_steps(decoder, window_steps(emitted) * batch, seed)
        n = window_steps(emitted)
        windows = [StepWindow(x[i * n:(i + 1) * n], 100) for i in range(batch)]
        decoder.decode(windows)  # first-call costs
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            decoder.decode(windows)
            best = min(best, time.perf_counter() - t0)
        out[emitted] = best
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("what", choices=["reach", "edges", "seams", "cost"])
    p.add_argument("--shape", choices=list(SHAPES), default="real")
    p.add_argument("--root", type=Path, default=None, help="real weights: MODEL_DIR")
    p.add_argument("--route", choices=["decoder", "dvae"], default="decoder")
    p.add_argument("--layer-scale", type=float, default=DEFAULT_LAYER_SCALE)
    p.add_argument("--steps", type=int, default=160)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batches", default="1,8,16", help="cost: windows a call")
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)
    dec = build_decoder(a.shape, a.route, layer_scale=a.layer_scale, seed=a.seed, root=a.root,
                        device=a.device)
    what = (f"weights from {a.root}" if a.root else
            f"shape={a.shape} layer_scale={a.layer_scale} (random weights)")
    print(f"{what} route={a.route}; exact support "
          f"{exact_support(dec.dims.decoder, dec.dims.vocos)} samples")
    if a.what == "reach":
        for r in measure_reach(dec, seed=a.seed):
            print(f"change above {r.threshold_db:6.1f} dB: left {r.left:6d} samples "
                  f"({r.left / F:5.1f} steps), right {r.right:6d} ({r.right / F:5.1f} steps)")
    elif a.what == "edges":
        for d, (left, right) in measure_edges(dec, seed=a.seed + 3).items():
            print(f"{d:6d} samples ({d / F:5.1f} steps) from the cut: left edge {left:7.1f} dB, "
                  f"right edge {right:7.1f} dB")
    elif a.what == "cost":
        for batch in (int(b) for b in a.batches.split(",")):
            for emitted, seconds in decode_cost(dec, batch, seed=a.seed).items():
                print(f"{batch:3d} windows of {window_steps(emitted):3d} steps ({emitted} "
                      f"emitted): {1000 * seconds:8.1f} ms a call, "
                      f"{1e6 * seconds / (batch * emitted):7.1f} us per emitted step")
    else:
        from rtserver.voices.chattts.decoder.config import ChatTTSDecodeConfig

        cfg = ChatTTSDecodeConfig().chunk_config()
        x = random_steps(dec, a.steps, a.seed)
        for pushes in ((1,), (3, 1, 7), (40,)):
            rep = chatts_seam_report(dec, x, cfg, pushes)
            print(f"pushes {pushes}: worst {rep.worst_db:.1f} dB, first chunk "
                  f"{rep.first_chunk_samples} samples, seams "
                  f"{', '.join(f'{s:.1f}' for s in rep.seam_db)}")


if __name__ == "__main__":
    main()
