"""SNAC 24 kHz: the checkpoint's layout, its local loader, and the layers the
decoder (``snac_model``) swaps into upstream's network.

Checkpoint layout (hubertsiuzdak/snac_24khz): a folder with ``config.json`` (the
keyword arguments of ``snac.SNAC``) and ``pytorch_model.bin`` (its state dict;
``model.safetensors`` is read too). ``snac.SNAC.from_pretrained`` may reach for
the hub; ``load_snac_dir`` reads the folder only. Weight-norm state in either
form loads (``weight_g``/``weight_v`` of old torch, ``parametrizations.weight.
original0/1`` of new): torch's weight-norm parametrization converts the old
keys on load.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn.utils import parametrize

from rtserver.voices.orpheus.snac_kernels import is_depthwise

# hubertsiuzdak/snac_24khz config.json; checked against snac 1.2.1 ``SNAC.__init__``
# (every key is one of its arguments; latent_dim defaults to 48 * 2**4 = 768).
SNAC24_CONFIG: dict[str, Any] = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

# Same rates, strides, kernels and codebook size (identical code layout and
# receptive field), tiny widths: a CPU decode of 60 frames takes milliseconds.
TINY_SNAC_CONFIG: dict[str, Any] = {
    **SNAC24_CONFIG,
    "encoder_dim": 4,  # latent 64
    "decoder_dim": 32,  # 32 -> 16, 8, 4, 2 channels
}

FRAME_CODES = 7  # neutral order [l0, l1_0, l1_1, l2_0, l2_1, l2_2, l2_3]
NOISE_PERIOD_LATENT = 1024  # 1024 latent frames = 21.8 s at 24 kHz before it repeats


def check_frame_layout(config: Mapping[str, Any]) -> None:
    """The 7-code frame needs three codebooks at strides 4, 2, 1."""
    if list(config.get("vq_strides", [])) != [4, 2, 1]:
        raise ValueError(f"SNAC config with vq_strides {config.get('vq_strides')}: the 7-code "
                         "frame layout needs [4, 2, 1] (the 24 kHz model)")
    if config.get("attn_window_size") is not None:
        raise ValueError("SNAC configs with local attention are not supported (not the 24 kHz "
                         "model; the chunk geometry assumes a convolutional decoder)")


def build_snac(config: Mapping[str, Any], *, seed: int | None = None) -> Any:
    """A ``snac.SNAC`` of this config, freshly initialized (seeded if ``seed``)."""
    from snac import SNAC

    check_frame_layout(config)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        model = SNAC(**dict(config))
    return model.eval()


def load_snac_dir(path: Path) -> Any:
    """Load an upstream-layout SNAC folder from disk; never touches a hub."""
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    config = json.loads(config_path.read_text())
    model = build_snac(config)
    bin_path, st_path = path / "pytorch_model.bin", path / "model.safetensors"
    if bin_path.is_file():
        state = torch.load(bin_path, map_location="cpu", weights_only=True)
    elif st_path.is_file():
        from safetensors.torch import load_file

        state = load_file(str(st_path))
    else:
        raise FileNotFoundError(f"no pytorch_model.bin or model.safetensors in {path}")
    model.load_state_dict(state, strict=True)
    return model.eval()


def fold_weight_norm(model: nn.Module) -> None:
    """Weight norm folded into plain weights, in place (what a decode computes
    is unchanged; a folded model can be deep-copied, a parametrized one not)."""
    for m in model.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)


def swap_depthwise(module: nn.Module) -> int:
    """Replace every depthwise stride-1 Conv1d under ``module`` by a
    ``ShiftedDepthwise``; returns how many."""
    n = 0
    for name, child in module.named_children():
        if is_depthwise(child):
            setattr(module, name, ShiftedDepthwise(cast(nn.Conv1d, child)))
            n += 1
        else:
            n += swap_depthwise(child)
    return n


def decoder_support(decoder: nn.Module, hop: int) -> int:
    """One-sided reach, in output samples, of one latent frame beyond its own span.

    Walks the layers in forward order tracking the index interval one latent
    position can influence (Conv1d: ``[lo + p - d(k-1), hi + p]``; ConvTranspose1d
    stride s: ``[lo*s - p, hi*s - p + k - 1]``); pointwise layers and residual
    skips do not widen it. SNAC 24 kHz: 4757 samples.
    """
    lo, hi = 0, 0
    for m in decoder.modules():
        if isinstance(m, nn.ConvTranspose1d):
            k, s, p = m.kernel_size[0], m.stride[0], int(m.padding[0])
            lo, hi = lo * s - p, hi * s - p + k - 1
        elif isinstance(m, ShiftedDepthwise):
            k, d, p = m.kernel, m.dilation, m.padding
            lo, hi = lo + p - d * (k - 1), hi + p
        elif isinstance(m, nn.Conv1d):
            if isinstance(m.padding, str):
                raise ValueError("string padding in a decoder conv")
            k, d, p, s = m.kernel_size[0], m.dilation[0], m.padding[0], m.stride[0]
            if s != 1:
                raise ValueError("strided Conv1d in a decoder")
            lo, hi = lo + p - d * (k - 1), hi + p
    return max(-lo, hi - (hop - 1))


class BatchState:
    """What the hooks and noise layers read during one forward."""

    __slots__ = ("lengths", "masks", "offsets", "t_latent")

    def __init__(self) -> None:
        self.lengths: torch.Tensor | None = None  # (B,) latent frames, None: all full
        self.offsets: torch.Tensor | None = None  # (B,) absolute latent frame of index 0
        self.t_latent = 0
        # (B, 1, T) keep-masks of this forward by upsampling factor: the
        # decoder's convolutions share five time scales, so each is built once
        self.masks: dict[int, torch.Tensor] = {}


class ShiftedDepthwise(nn.Module):
    """A depthwise ``Conv1d`` (one filter per channel, stride 1) as a sum of
    ``kernel`` shifted products: the same sum, which ``torch.compile`` fuses with
    the pointwise work around it into one kernel (on CUDA, PyTorch runs float32
    depthwise convolutions, dilated ones in any dtype, in a generic kernel:
    ~30 % of SNAC's GPU time at 256 Orpheus streams,
    ``bench/results/h200-orpheus-timeline-2026-12-04``). Only with compile:
    eager, its ``kernel`` launches cost more than the one convolution."""

    def __init__(self, conv: nn.Conv1d) -> None:
        super().__init__()
        channels, per_group, k = conv.weight.shape
        if conv.groups != channels or per_group != 1 or conv.stride[0] != 1:
            raise ValueError("not a depthwise stride-1 Conv1d")
        if isinstance(conv.padding, str):
            raise ValueError("string padding in a decoder conv")
        self.weight = nn.Parameter(conv.weight.detach()[:, 0, :].clone(), requires_grad=False)
        bias = conv.bias if conv.bias is not None else torch.zeros(channels)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.kernel = int(k)
        self.dilation = int(conv.dilation[0])
        self.padding = int(conv.padding[0])
        # what decoder_support and the mask hook read
        self.kernel_size = conv.kernel_size
        self.stride = conv.stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xp = torch.nn.functional.pad(x, (self.padding, self.padding))
        t = xp.shape[-1] - self.dilation * (self.kernel - 1)
        w = self.weight.to(x.dtype)
        y = self.bias.to(x.dtype)[None, :, None] + w[None, :, 0, None] * xp[..., :t]
        for k in range(1, self.kernel):
            at = k * self.dilation
            y = y + w[None, :, k, None] * xp[..., at:at + t]
        return y


class PositionalNoise(nn.Module):
    """``x + noise[pos] * linear(x)``: SNAC's NoiseBlock with position-keyed noise."""

    def __init__(self, linear: nn.Module, upsample: int, state: BatchState,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.linear = linear
        self.upsample = upsample
        self.period = NOISE_PERIOD_LATENT * upsample
        self._state = state
        self.table: torch.Tensor
        self.register_buffer("table", torch.randn(self.period, generator=generator),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t = x.shape
        offsets = self._state.offsets
        pos = torch.arange(t, device=x.device).unsqueeze(0)
        if offsets is not None:
            pos = pos + (offsets * self.upsample).unsqueeze(1)
        noise = self.table.to(x.dtype)[pos % self.period].expand(b, t).unsqueeze(1)
        return x + noise * self.linear(x)
