"""Decoder, DVAE and Vocos: rtserver's batched modules against upstream's
``Chat.decoder`` / ``Chat.dvae`` / ``Chat.vocos`` on the same files.

Inputs: 150 steps of GPT-like hidden states (Decoder route) or codes (DVAE
route). Upstream's full decode is ``decoder(x)`` (its ``_decode_to_wavs``) then
``vocos.decode(mel)``, whose ISTFT (``center=True``, no length) gives
``(2T - 1) * 256`` samples; rtserver gives ``T * 512`` (``length=T * hop``), so
the waveforms are compared over upstream's samples.

Tolerances (float32 both sides, the same convolutions in another batching and
masking): mel max |diff| <= 1e-5 x max |mel|; waveform max |diff| <= -100 dB
re upstream's RMS (measured -121 dB, float32 rounding; mels bit-equal; a wrong weight,
coef, kernel, dilation or ISTFT window is at -40 dB or worse). Streaming
(rtserver's default chunk schedule, steps pushed one at a time and in bursts)
against upstream's full decode: the seam limits tests/unit/test_chattts_dec_seams.py
states for the tiny checkpoint, first seam <= -25 dB, later seams <= -60 dB.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rtserver.tools.measure.snac import decode_chunked
from rtserver.voices.chattts.decoder.checkpoint import load_audio_models
from rtserver.voices.chattts.decoder.config import DEEP_CHUNK_STEPS, ChatTTSDecodeConfig
from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder, StepWindow

from .conftest import Pair

T = 150
HOP = 256
WAVE_DB = -100.0
FIRST_SEAM_DB, LATER_SEAM_DB = -25.0, -60.0


def steps(route: str, width: int) -> np.ndarray:
    g = np.random.default_rng(9)
    if route == "decoder":
        return g.standard_normal((T, width)).astype(np.float32)
    return g.integers(0, 625, (T, width)).astype(np.int64)


def upstream_decode(pair: Pair, route: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    chat = pair.chat
    module = chat.decoder if route == "decoder" else chat.dvae
    with torch.inference_mode():
        mel = module(torch.from_numpy(x).T[None].contiguous())  # [1, 100, 2T]
        wav = chat.vocos.decode(mel)
    return mel[0].numpy(), wav[0].numpy()


def db(x: float, rms: float) -> float:
    return 20 * math.log10(max(x, 1e-12) / rms)


@pytest.fixture(scope="module", params=["decoder", "dvae"])
def routed(request: pytest.FixtureRequest, pair: Pair) -> dict[str, object]:
    route = request.param
    mel, vocos, dims = load_audio_models(pair.root, route)
    dec = ChatTTSWindowDecoder(mel, vocos, dims, route)
    x = steps(route, dec.width)
    up_mel, up_wav = upstream_decode(pair, route, x)
    return {"route": route, "dec": dec, "x": x, "up_mel": up_mel, "up_wav": up_wav}


def test_full_decode_mel_and_waveform_equal(routed: dict[str, object]) -> None:
    dec, x = routed["dec"], routed["x"]
    assert isinstance(dec, ChatTTSWindowDecoder) and isinstance(x, np.ndarray)
    up_mel, up_wav = routed["up_mel"], routed["up_wav"]
    assert isinstance(up_mel, np.ndarray) and isinstance(up_wav, np.ndarray)
    with torch.inference_mode():
        xt = torch.from_numpy(x)[None]
        inp = xt.transpose(1, 2) if dec.route == "decoder" else xt
        mask = torch.ones(1, 1, 2 * T)
        mel = dec.mel(inp, mask)[0].numpy()
    wav = dec.decode([StepWindow(x, 0)])[0]
    assert mel.shape == up_mel.shape == (100, 2 * T)
    assert len(up_wav) == (2 * T - 1) * HOP and len(wav) == T * 2 * HOP
    mel_err = float(np.abs(mel - up_mel).max())
    rms = float(np.sqrt(np.mean(up_wav.astype(np.float64) ** 2)))
    wav_db = db(float(np.abs(wav[:len(up_wav)] - up_wav).max()), rms)
    print(f"\n{dec.route}: mel max |diff| {mel_err:.3g} (max |mel| {np.abs(up_mel).max():.3g}); "
          f"waveform max |diff| {wav_db:.1f} dB re RMS {rms:.3g}")
    assert mel_err <= 1e-5 * float(np.abs(up_mel).max())
    assert wav_db <= WAVE_DB


@pytest.mark.parametrize(("pushes", "deep_from"), [((1,), None), ((5, 1, 17), None),
                                                   ((1,), 40)])
def test_streaming_decode_within_the_seam_limits(routed: dict[str, object],
                                                 pushes: tuple[int, ...],
                                                 deep_from: int | None) -> None:
    """``deep_from``: the listener holds a deep chunk from that step on (63-step
    windows with the same context and lookahead)."""
    dec, x, up_wav = routed["dec"], routed["x"], routed["up_wav"]
    assert isinstance(dec, ChatTTSWindowDecoder) and isinstance(x, np.ndarray)
    assert isinstance(up_wav, np.ndarray)
    cfg = ChatTTSDecodeConfig(deep_chunk_frames=DEEP_CHUNK_STEPS).chunk_config()
    chunks, jobs = decode_chunked(dec, x, cfg, pushes, window=StepWindow, deep_from=deep_from)
    if deep_from is not None:
        assert any(j.emit_end - j.emit_start == cfg.deep_chunk_frames * cfg.samples_per_frame
                   for j in jobs)
    out = np.concatenate(chunks).astype(np.float64)
    assert len(out) == T * 2 * HOP
    ref = up_wav.astype(np.float64)
    err = np.abs(out[:len(ref)] - ref)
    rms = float(np.sqrt(np.mean(ref ** 2)))
    f = cfg.samples_per_frame
    seams = [db(float(err[max(0, j.emit_start - f):min(len(ref), j.emit_start + j.fade + f)]
                      .max()), rms) for j in jobs[1:] if j.emit_start < len(ref)]
    print(f"\n{dec.route} pushes {pushes} deep from {deep_from}: "
          f"worst {db(float(err.max()), rms):.1f} dB, seams "
          f"{', '.join(f'{s:.1f}' for s in seams)} dB re upstream's full decode")
    assert len(seams) >= 3
    assert seams[0] <= FIRST_SEAM_DB
    assert max(seams[1:]) <= LATER_SEAM_DB
