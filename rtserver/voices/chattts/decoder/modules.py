"""Torch modules for ChatTTS's audio side, batched with exact padding.

Written from the upstream definitions (2noise/ChatTTS ``ChatTTS/model/dvae.py``:
``ConvNeXtBlock``, ``DVAEDecoder``, ``GFSQ``, ``DVAE.forward`` decode path;
gemelo-ai/vocos ``VocosBackbone``, ``ConvNeXtBlock``, ``ISTFTHead``), with the
same parameter names, so upstream state dicts load as they are.

Every forward takes ``mask`` (B, 1, T) of 1.0 for the frames of each batch row
and 0.0 for its padding. The padding is zeroed after every layer that could
make it nonzero, so each conv sees zeros past a row's end exactly as when the
row is decoded alone (its own zero padding), and the ISTFT normalises each row
by the window envelope of its own frames: a row's audio does not depend on
what it is batched with (to float rounding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rtserver.voices.chattts.decoder.dims import MelDecoderDims, VocosDims, VQDims


class DilatedConvNeXt(nn.Module):
    """ChatTTS's ConvNeXt block: depthwise conv (kernel 7, dilation 2), LayerNorm,
    4x MLP with GELU, per-channel scale ``weight``, residual."""

    def __init__(self, dim: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel, padding=dilation * (kernel // 2),
                                dilation=dilation, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.weight = nn.Parameter(torch.full((dim,), 1e-6))  # upstream init

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).transpose(1, 2)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y)))) * self.weight
        return (x + y.transpose(1, 2)) * mask


class MelDecoderStack(nn.Module):
    """Upstream ``DVAEDecoder``: conv_in (conv3, GELU, conv3), blocks, 1x1 conv_out."""

    def __init__(self, d: MelDecoderDims) -> None:
        super().__init__()
        self.conv_in = nn.Sequential(nn.Conv1d(d.idim, d.bn_dim, 3, 1, 1), nn.GELU(),
                                     nn.Conv1d(d.bn_dim, d.hidden, 3, 1, 1))
        self.decoder_block = nn.ModuleList(
            DilatedConvNeXt(d.hidden, d.kernel, d.dilation) for _ in range(d.n_layer))
        self.conv_out = nn.Conv1d(d.hidden, d.odim, 1, bias=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        conv0, act, conv1 = self.conv_in
        y = act(conv0(x)) * mask
        y = conv1(y) * mask
        for block in self.decoder_block:
            y = block(y, mask)
        return self.conv_out(y)  # 1x1, no bias: zero stays zero


class ResidualFSQDecode(nn.Module):
    """The decode half of one ``ResidualFSQ`` (lucidrains/vector-quantize-pytorch,
    the version upstream trained with, 2023-11 .. 2025-11): index -> digits in
    base ``levels`` -> codes ``(digit - L//2) / (L//2)``, layer r scaled by
    ``(L-1)**-r``, summed, then ``project_out``. ``project_in`` (encode only) is
    kept so the state dict loads whole."""

    _levels: torch.Tensor
    _basis: torch.Tensor
    _half: torch.Tensor
    _scales: torch.Tensor

    def __init__(self, dim: int, levels: tuple[int, ...], n_residual: int) -> None:
        super().__init__()
        cdim = len(levels)
        self.project_in = nn.Linear(dim, cdim)
        self.project_out = nn.Linear(cdim, dim)
        lv = torch.tensor(levels, dtype=torch.float32)
        basis = torch.cumprod(torch.tensor([1, *levels[:-1]], dtype=torch.int64), 0)
        self.register_buffer("_levels", torch.tensor(levels, dtype=torch.int64), persistent=False)
        self.register_buffer("_basis", basis, persistent=False)
        self.register_buffer("_half", (lv // 2), persistent=False)
        scales = torch.stack([(lv - 1) ** -r for r in range(n_residual)])  # (R, cdim)
        self.register_buffer("_scales", scales, persistent=False)

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        """``indices`` (B, T, R) int -> (B, T, dim)."""
        digits = (indices.unsqueeze(-1) // self._basis) % self._levels  # (B, T, R, cdim)
        codes = (digits.to(self._half.dtype) - self._half) / self._half
        summed = (codes * self._scales).sum(dim=2)
        return self.project_out(summed)


class _Quantizer(nn.Module):
    def __init__(self, vq: VQDims) -> None:
        super().__init__()
        self.rvqs = nn.ModuleList(ResidualFSQDecode(vq.dim // vq.groups, vq.levels, vq.residual)
                                  for _ in range(vq.groups))


class GFSQDecode(nn.Module):
    """Upstream ``GFSQ._embed``: codes (B, T, G*R), group g reads columns
    ``g*R .. g*R+R-1``; outputs (B, dim, T), the groups' outputs concatenated."""

    def __init__(self, vq: VQDims) -> None:
        super().__init__()
        self.groups, self.residual = vq.groups, vq.residual
        self.quantizer = _Quantizer(vq)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        b, t, _ = codes.shape
        split = codes.view(b, t, self.groups, self.residual)
        outs = [rvq(split[:, :, g]) for g, rvq in enumerate(self.quantizer.rvqs)]
        return torch.cat(outs, dim=-1).transpose(1, 2)


class MelDecoder(nn.Module):
    """Upstream ``DVAE`` decode path (the Decoder file, or the DVAE file with VQ).

    In: per GPT step one vector of ``2*idim`` (B, 2*idim, T) -- a hidden state, or
    the VQ output for codes -- split into two mel frames (first half frame 2t,
    second half 2t+1), decoded, ``out_conv``, times ``coef``: mel (B, n_mels, 2T).
    """

    coef: torch.Tensor

    def __init__(self, d: MelDecoderDims, n_mels: int, vq: VQDims | None = None) -> None:
        super().__init__()
        self.register_buffer("coef", torch.ones(1, n_mels, 1))
        self.decoder = MelDecoderStack(d)
        self.out_conv = nn.Conv1d(d.idim, n_mels, 3, 1, 1, bias=False)
        self.vq_layer = GFSQDecode(vq) if vq is not None else None
        self.idim = d.idim

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``x`` (B, 2*idim, T) float, or codes (B, T, G*R) int with a VQ;
        ``mask`` (B, 1, 2T) over mel frames."""
        if self.vq_layer is not None:
            x = self.vq_layer(x)
        b, c, t = x.shape
        # view (B, 2, C/2, T) -> (B, C/2, T, 2) -> (B, C/2, 2T), as upstream
        frames = x.view(b, 2, c // 2, t).permute(0, 2, 3, 1).reshape(b, c // 2, 2 * t)
        y = self.out_conv(self.decoder(frames * mask, mask))
        return y * self.coef * mask


class VocosBlock(nn.Module):
    """Vocos ConvNeXt block: depthwise conv 7, LayerNorm, MLP, ``gamma``, residual."""

    def __init__(self, dim: int, intermediate: int, kernel: int, n_layers: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate)
        self.pwconv2 = nn.Linear(intermediate, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1.0 / n_layers))  # vocos init

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).transpose(1, 2)
        y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return (x + y.transpose(1, 2)) * mask


class VocosBackbone(nn.Module):
    def __init__(self, v: VocosDims) -> None:
        super().__init__()
        self.embed = nn.Conv1d(v.n_mels, v.dim, v.kernel, padding=v.kernel // 2)
        self.norm = nn.LayerNorm(v.dim, eps=1e-6)
        self.convnext = nn.ModuleList(VocosBlock(v.dim, v.intermediate, v.kernel, v.n_layers)
                                      for _ in range(v.n_layers))
        self.final_layer_norm = nn.LayerNorm(v.dim, eps=1e-6)

    def forward(self, mel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, n_mels, T) -> (B, T, dim)."""
        x = self.norm(self.embed(mel).transpose(1, 2)).transpose(1, 2) * mask
        for block in self.convnext:
            x = block(x, mask)
        return self.final_layer_norm(x.transpose(1, 2))


class MaskedISTFT(nn.Module):
    """``torch.istft(center=True, length=T*hop)`` with a per-row frame mask.

    Overlap-add of the windowed inverse FFTs, divided by the summed squared
    window of the row's own frames (padding frames add neither signal nor
    envelope), then ``n_fft//2`` trimmed at the front as ``center=True`` does.
    """

    window: torch.Tensor

    def __init__(self, n_fft: int, hop: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, real: torch.Tensor, imag: torch.Tensor, mask: torch.Tensor
                ) -> torch.Tensor:
        """``real``/``imag`` (B, n_fft//2+1, T), ``mask`` (B, 1, T) -> (B, T*hop)."""
        b, _, t = real.shape
        frames = torch.fft.irfft(torch.complex(real, imag), self.n_fft, dim=1)
        frames = frames * self.window[None, :, None] * mask
        size = (t - 1) * self.hop + self.n_fft
        y = F.fold(frames, output_size=(1, size), kernel_size=(1, self.n_fft),
                   stride=(1, self.hop))[:, 0, 0]
        env_frames = (self.window.square()[None, :, None] * mask).expand(b, -1, t)
        env = F.fold(env_frames, output_size=(1, size), kernel_size=(1, self.n_fft),
                     stride=(1, self.hop))[:, 0, 0]
        lo = self.n_fft // 2
        y, env = y[:, lo:lo + t * self.hop], env[:, lo:lo + t * self.hop]
        return y / env.clamp_min(1e-11)


class ISTFTHead(nn.Module):
    """Vocos ``ISTFTHead``: Linear to log-magnitude and phase, ``exp`` clipped at
    100, then the ISTFT (padding "center", as ChatTTS configures it)."""

    def __init__(self, v: VocosDims) -> None:
        super().__init__()
        self.out = nn.Linear(v.dim, v.n_fft + 2)
        self.istft = MaskedISTFT(v.n_fft, v.hop)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        spec = self.out(x).transpose(1, 2)
        mag, phase = spec.chunk(2, dim=1)
        mag = torch.exp(mag).clamp(max=1e2)
        return self.istft(mag * torch.cos(phase), mag * torch.sin(phase), mask)


class Vocos(nn.Module):
    """Mel (B, n_mels, T) -> audio (B, T*hop). ``feature_extractor`` (audio -> mel,
    for training) is not built: its buffers in the file are skipped."""

    def __init__(self, v: VocosDims) -> None:
        super().__init__()
        self.backbone = VocosBackbone(v)
        self.head = ISTFTHead(v)

    def forward(self, mel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(mel, mask), mask)


def init_random_(module: nn.Module, seed: int, *, layer_scale: float) -> None:
    """Random weights of a plausible scale (tiny and real-shape benchmark
    checkpoints): convs and linears ~ U(+-1/sqrt(fan_in)) (PyTorch's default
    bound), LayerNorm (1, 0), every block's residual scale (``weight``, ``gamma``)
    ``layer_scale``, ``coef`` ~ U(0.5, 1.5). Deterministic in ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv1d, nn.Linear)):
                fan_in = m.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in)
                m.weight.uniform_(-bound, bound, generator=gen)
                if m.bias is not None:
                    m.bias.uniform_(-bound, bound, generator=gen)
            elif isinstance(m, nn.LayerNorm):
                m.weight.fill_(1.0)
                m.bias.fill_(0.0)
            elif isinstance(m, DilatedConvNeXt):
                m.weight.fill_(layer_scale)
            elif isinstance(m, VocosBlock):
                m.gamma.fill_(layer_scale)
            elif isinstance(m, MelDecoder):
                m.coef.uniform_(0.5, 1.5, generator=gen)
