"""Chunked ChatTTS decode vs the full decode at every seam, for several schedules.

Two random-weight checkpoints: ``tiny`` (2 + 2 blocks: exact reach 13 steps)
and ``narrow`` (the real depths, kernels and dilation, so the real 52-step
reach, with narrow widths). Each report prints the worst error and every seam's
in dB re the full decode's RMS (``pytest -s`` shows them). Measured (seed 5,
150 steps), default schedule, narrow: first seam -30.4 dB, later seams -74.9
.. -79.7 dB; tiny: -46.7 dB, later -112 dB or below.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rtserver.tools.measure.chattts_decoder import build_decoder, chatts_seam_report, random_steps
from rtserver.tools.measure.snac import SeamReport
from rtserver.vocoder.chunking import ChunkPlanner
from rtserver.voices.chattts.decoder.config import (
    CHATTTS_EXACT_SUPPORT,
    DEEP_CHUNK_STEPS,
    ChatTTSDecodeConfig,
)
from rtserver.voices.chattts.decoder.dims import REAL_DIMS, exact_support
from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder

F = 512
EXACT_DB = -100.0  # equal to the full decode: float32 rounding sits near -110 dB
BASE = ChatTTSDecodeConfig()
SCHEDULES = {
    "default": BASE,
    # later seams with a 12-step lookahead: the -40 dB point at residual scale 0.5
    "lookahead12": replace(BASE, lookahead_samples=6144),
    # a smaller first chunk: after 12 steps, lookahead 6
    "small_first": replace(BASE, first_frames=12, first_lookahead_samples=3072, second_frames=4,
                           growth=1.5, max_chunk_frames=24),
    # every window with the exact support both sides: equal to the full decode
    "exact": replace(BASE, first_frames=53, first_lookahead_samples=CHATTTS_EXACT_SUPPORT,
                     lookahead_samples=CHATTTS_EXACT_SUPPORT, max_chunk_frames=53),
}
# (schedule, first seam bound, later seams bound) in dB; the first seam is cut
# inside the reach by design (see config), the rest must be inaudible.
BOUNDS = {"default": (-25.0, -60.0), "lookahead12": (-25.0, -40.0),
          "small_first": (-12.0, -60.0), "exact": (EXACT_DB, EXACT_DB)}


@pytest.fixture(scope="module")
def decoders() -> dict[str, ChatTTSWindowDecoder]:
    return {"tiny": build_decoder("tiny", seed=0), "narrow": build_decoder("narrow", seed=0)}


def _report(dec: ChatTTSWindowDecoder, name: str, pushes: tuple[int, ...]) -> SeamReport:
    x = random_steps(dec, 150, seed=5)
    rep = chatts_seam_report(dec, x, SCHEDULES[name].chunk_config(), pushes)
    print(f"{name} pushes={pushes}: worst {rep.worst_db:.1f} dB, first chunk "
          f"{rep.first_chunk_samples} samples, seams "
          f"{', '.join(f'{s:.1f}' for s in rep.seam_db)} dB")
    return rep


def test_narrow_has_the_real_reach() -> None:
    dec = build_decoder("narrow")
    assert exact_support(dec.dims.decoder, dec.dims.vocos) == exact_support(
        REAL_DIMS.decoder, REAL_DIMS.vocos) == CHATTTS_EXACT_SUPPORT


def _cases() -> list[object]:
    """Every schedule x push pattern on tiny; on narrow (~1.5 s each on CPU) the
    default schedule with steps one at a time, the rest under ``-m slow``."""
    cases: list[object] = []
    for model in ("tiny", "narrow"):
        for name in SCHEDULES:
            for pushes in ((1,), (5, 1, 17)):
                fast = model == "tiny" or (name == "default" and pushes == (1,))
                marks = () if fast else (pytest.mark.slow,)
                cases.append(pytest.param(model, name, pushes, marks=marks,
                                          id=f"{model}-{name}-{'-'.join(map(str, pushes))}"))
    return cases


@pytest.mark.parametrize(("model", "name", "pushes"), _cases())
def test_chunked_equals_full_decode_at_every_seam(decoders: dict[str, ChatTTSWindowDecoder],
                                                  model: str, name: str,
                                                  pushes: tuple[int, ...]) -> None:
    rep = _report(decoders[model], name, pushes)
    assert rep.total_samples == 150 * F  # seam_report also checked chunks == full length
    assert len(rep.seam_db) >= 3
    first_bound, later_bound = BOUNDS[name]
    # the first seam: cut inside the reach when steps come one at a time; with
    # bursts the first decode takes every step there as lookahead (at least as good)
    assert rep.seam_db[0] <= first_bound
    assert max(rep.seam_db[1:]) <= later_bound


def test_first_chunk_plan() -> None:
    """Default plan: first audio after 16 steps (3840 samples), then chunks of
    8, 16, 32, 32 ... steps, each once its 16 steps of lookahead are there."""
    cfg = BASE.chunk_config()
    planner = ChunkPlanner(cfg)
    sizes: list[int] = []
    at: list[int] = []
    for step in range(1, 200):
        for job in planner.push(1):
            sizes.append(job.emit_end - job.emit_start)
            at.append(step)
    assert at[0] == 16 and sizes[0] == 16 * F - 4096 - 256 == 3840
    assert [cfg.chunk_frames(k) for k in range(1, 5)] == [8, 16, 32, 32]
    for size, target in zip(sizes[1:], [8, 16, 32, 32], strict=False):
        assert target * F <= size < (target + 1) * F
    # decode k+1 runs when its emitted end plus 16 steps of lookahead have arrived
    emitted = np.cumsum(sizes) + 256
    for k in range(1, len(at)):
        assert at[k] * F >= emitted[k] + 8192 - 256
    assert sizes[-1] == 32 * F


@pytest.mark.parametrize("model", ["tiny", "narrow"])
def test_deep_chunks_keep_the_seams(decoders: dict[str, ChatTTSWindowDecoder],
                                    model: str) -> None:
    """Once its listener holds a deep chunk, a stream decodes windows of 63
    steps with the context and lookahead of the 32-step ones: their seams
    are as inaudible, and the audio is the full decode's, sample for sample."""
    dec, steps, deep_from = decoders[model], 220, 40
    cfg = replace(BASE, deep_chunk_frames=DEEP_CHUNK_STEPS).chunk_config()
    planner = ChunkPlanner(cfg)
    sizes = [(j.emit_end - j.emit_start) // F
             for n in range(steps) for j in planner.push(1, deep=n >= deep_from)]
    assert sizes.count(DEEP_CHUNK_STEPS) >= 2 and max(sizes) == DEEP_CHUNK_STEPS
    rep = chatts_seam_report(dec, random_steps(dec, steps, seed=5), cfg, (1,),
                             deep_from=deep_from)
    print(f"{model} deep from step {deep_from}: seams "
          f"{', '.join(f'{s:.1f}' for s in rep.seam_db)} dB")
    assert rep.total_samples == steps * F
    assert max(rep.seam_db[1:]) <= BOUNDS["default"][1]
