"""Write ChatTTS's audio checkpoints in the upstream layout, with random weights.

    root/asset/Decoder.safetensors  root/asset/DVAE.safetensors  root/asset/Vocos.safetensors

Tensor names and shapes are upstream's (see ``rtserver.voices.chattts.decoder.dims``),
the DVAE encoder and the mel feature extractors' buffers included, so the files
load into upstream ChatTTS as well. ``shape="tiny"`` keeps the real kernels,
dilation, mel count, FFT and hop with tiny widths (KBs); ``shape="real"`` is the
real shape with random weights (~150 MB: benchmarks, which must say so).

    python -m rtserver.tools.layouts.chattts_decoder ROOT [--shape tiny|real] [--seed N]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from rtserver.voices.chattts.decoder.checkpoint import random_audio_models
from rtserver.voices.chattts.decoder.dims import (
    REAL_DIMS,
    ChatTTSAudioDims,
    dvae_encoder_shapes,
    tiny_dims,
)

Shape = Literal["tiny", "real"]
# Residual scale of the random blocks: trained ConvNeXt stacks keep their
# branches well above upstream's 1e-6 init; 0.5 makes every block matter (see
# ``rtserver.tools.measure.chattts_decoder`` for how the reach depends on it).
DEFAULT_LAYER_SCALE = 0.5


def htk_mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int) -> np.ndarray:
    """(n_freqs, n_mels) triangular HTK mel filters, 0 Hz .. Nyquist, no norm
    (the filterbank torchaudio's ``MelSpectrogram`` holds as ``mel_scale.fb``)."""
    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    freqs = np.linspace(0, sample_rate // 2, n_freqs)
    m = np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sample_rate / 2)), n_mels + 2)
    f_pts = 700.0 * (10 ** (m / 2595.0) - 1.0)
    f_diff = np.diff(f_pts)
    slopes = f_pts[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return np.maximum(0.0, np.minimum(down, up)).astype(np.float32)


def _mel_buffers(prefix: str, dims: ChatTTSAudioDims) -> dict[str, torch.Tensor]:
    n_fft = dims.vocos.n_fft
    fb = htk_mel_filterbank(n_fft // 2 + 1, dims.n_mels, 24000)
    return {prefix + "spectrogram.window": torch.hann_window(n_fft),
            prefix + "mel_scale.fb": torch.from_numpy(fb)}


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}


def write_decoder_assets(root: Path, dims: ChatTTSAudioDims, *, seed: int = 0,
                         layer_scale: float = DEFAULT_LAYER_SCALE) -> Path:
    """Write the three files for ``dims`` under ``root/asset``; returns ``root``."""
    from safetensors.torch import save_file

    root = Path(root)
    asset = root / "asset"
    asset.mkdir(parents=True, exist_ok=True)

    decoder, dvae, vocos = random_audio_models(dims, seed=seed, layer_scale=layer_scale)
    save_file(_state(decoder), str(asset / "Decoder.safetensors"))

    state = _state(dvae)
    gen = torch.Generator().manual_seed(seed + 2)
    for key, shape in dvae_encoder_shapes(dims).items():
        if key.startswith("preprocessor_mel."):
            continue
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
        state[key] = (torch.rand(shape, generator=gen) * 2 - 1) / math.sqrt(fan_in)
    state.update(_mel_buffers("preprocessor_mel.mel_spec.", dims))
    save_file(state, str(asset / "DVAE.safetensors"))

    state = _state(vocos)
    state.update(_mel_buffers("feature_extractor.mel_spec.", dims))
    save_file(state, str(asset / "Vocos.safetensors"))
    return root


def write_tiny_decoder_assets(root: Path, *, gpt_hidden: int = 768, seed: int = 0,
                              layer_scale: float = DEFAULT_LAYER_SCALE) -> Path:
    """Tiny widths (``dims.tiny_dims``); the Decoder reads hidden states of ``gpt_hidden``."""
    return write_decoder_assets(root, tiny_dims(gpt_hidden), seed=seed, layer_scale=layer_scale)


def write_real_shape_decoder_assets(root: Path, *, seed: int = 0,
                                    layer_scale: float = DEFAULT_LAYER_SCALE) -> Path:
    """The real shapes (``dims.REAL_DIMS``) with random weights, for benchmarks."""
    return write_decoder_assets(root, REAL_DIMS, seed=seed, layer_scale=layer_scale)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("root", type=Path)
    p.add_argument("--shape", choices=["tiny", "real"], default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpt-hidden", type=int, default=768, help="tiny only")
    a = p.parse_args(argv)
    if a.shape == "real":
        print(write_real_shape_decoder_assets(a.root, seed=a.seed))
    else:
        print(write_tiny_decoder_assets(a.root, gpt_hidden=a.gpt_hidden, seed=a.seed))


if __name__ == "__main__":
    main()
