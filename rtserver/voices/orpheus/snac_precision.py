"""Which dtype the SNAC decoder runs in (``[orpheus.vocoder] dtype``).

``"auto"`` (the default) runs float16 on CUDA when this checkpoint's float16
decode passes a start-up check against its float32 decode, else float32; on
the CPU always float32 (float16 convolutions there are slower, not faster).

Why float16 on CUDA: on one H100 at 192 and 256 Orpheus streams the decoder
took 0.60 instead of 0.77-0.80 s of decode a second, and 0 of ~375 contexts
underran at 192 against 9 and 25 with float32
(``bench/results/h100-2026-12-07-s27``). Why a check: float16's range (65,504)
is proven only on random weights of the real shape (-44.9 dB max error re RMS,
``snac_model``); a checkpoint whose activations overflow it would give noise,
so the server measures before it trusts it.

The check decodes ``CHECK_WINDOWS`` windows of ``CHECK_FRAMES`` frames of
seeded uniform random codes (every code row a real stream can index, in
harsher orders than speech) in both dtypes, eagerly, and takes the max
absolute difference re the float32 audio's RMS. Within ``HALF_BOUND_DB``
(issue 24's bound for a cheaper vocoder) float16 is used; non-finite samples
or a larger error keep float32, with a warning.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from rtserver.vocoder.config import VOCODER_DTYPES
from rtserver.voices.orpheus.snac_model import CodeWindow, NoiseMode, SnacDecoder
from rtserver.voices.orpheus.snac_net import FRAME_CODES, fold_weight_norm

log = logging.getLogger(__name__)

HALF_BOUND_DB = -40.0  # issue 24: a cheaper vocoder's error stays at or below -40 dB
CHECK_WINDOWS = 4
CHECK_FRAMES = 24  # the longest window the graphs take (graph_max_frames; steady ones: 21)
CHECK_SEED = 0


def half_error_db(model: Any, *, device: str, noise: NoiseMode = "positional",
                  noise_seed: int = 0, snake_conv: str = "auto") -> float:
    """Max |float16 - float32| (``snake_conv``'s float16 against torch's float32
    layers) over eager decodes of seeded random codes with
    ``model`` (a SNAC model: its weight norm folded in place, as ``SnacDecoder``
    does, and otherwise left as it is), dB re the float32 audio's RMS; ``inf``
    when the float16 audio holds a non-finite sample."""
    fold_weight_norm(model)
    # the reference on torch's layers (the kernels' float32 decode equals it bit
    # for bit on an H100, bench/results/h100-2026-12-06-s24), so the check compiles
    # no float32 kernels the server never runs
    decoders = [SnacDecoder(copy.deepcopy(model), device=device, noise=noise,
                            noise_seed=noise_seed, dtype=dtype, snake_conv=conv)
                for dtype, conv in (("float32", "torch"), ("float16", snake_conv))]
    rng = np.random.default_rng(CHECK_SEED)
    windows = [CodeWindow(rng.integers(0, decoders[0].codebook_size, (CHECK_FRAMES, FRAME_CODES),
                                       dtype=np.int64), k * CHECK_FRAMES)
               for k in range(CHECK_WINDOWS)]
    ref, half = (np.concatenate(d.decode(windows)) for d in decoders)
    return max_error_db(half, ref)


def max_error_db(got: npt.NDArray[Any], ref: npt.NDArray[Any]) -> float:
    """Max |got - ref|, dB re ``ref``'s RMS; ``inf`` when ``got`` holds a
    non-finite sample."""
    got, ref = got.astype(np.float64), ref.astype(np.float64)
    if not np.isfinite(got).all():
        return math.inf
    rms = float(np.sqrt(np.mean(ref ** 2)))
    return 20 * math.log10(max(float(np.abs(got - ref).max()), 1e-12) / max(rms, 1e-12))


def resolve_dtype(requested: str, device: str,
                  measure: Callable[[], float]) -> tuple[str, float | None]:
    """The dtype to run and the float16 error measured for it (None: not measured).
    ``measure`` is called only for ``"auto"`` on CUDA."""
    if requested not in VOCODER_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(VOCODER_DTYPES)}, not {requested!r}")
    if requested != "auto":
        return requested, None
    if not device.startswith("cuda"):
        return "float32", None
    err = measure()
    if err <= HALF_BOUND_DB:
        log.info("SNAC decoder in float16: %.1f dB from float32 on this checkpoint "
                 "(bound %.0f dB)", err, HALF_BOUND_DB)
        return "float16", err
    log.warning("SNAC decoder stays float32: float16 is %s dB from float32 on this "
                "checkpoint (bound %.0f dB)", f"{err:.1f}" if math.isfinite(err) else "non-finite",
                HALF_BOUND_DB)
    return "float32", err


__all__ = ["CHECK_FRAMES", "CHECK_WINDOWS", "HALF_BOUND_DB", "half_error_db", "max_error_db",
           "resolve_dtype"]
