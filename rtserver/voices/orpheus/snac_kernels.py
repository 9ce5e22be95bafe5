"""SNAC's Snake activations and depthwise convolutions as fused Triton kernels.

On a GPU the SNAC decoder's time is memory-bound pointwise work: at 256
Orpheus streams on an H200 its top kernels were PyTorch's generic depthwise
convolution (174 ms of 586), the padding masks' broadcast multiplies (155), the
Snake activation (151, already one TorchScript kernel) and the residual adds
(56); its tensor-core convolutions under a fifth
(``bench/results/h200-orpheus-timeline-2026-12-04``). Two kernels cover the
first three, each one read and one write of the activations:

- ``snake``: ``Snake(x)`` (``x + sin(alpha x)**2 / (alpha + 1e-9)``, snac 1.2.1
  ``layers.snake``) times the keep-mask of the convolution after it (samples
  past a row's length zeroed: the padding rule of ``snac_model``);
- ``depthwise_snake``: a depthwise stride-1 convolution (zero padding, any
  dilation) plus bias, then a Snake: the middle of SNAC's ``ResidualUnit``.

``fuse`` swaps them into a decoder: every depthwise ``ResidualUnit`` runs
``snake`` (masked), ``depthwise_snake``, its 1x1 convolution and the residual
add; every other ``Snake1d`` followed by a convolution of kernel > 1 runs
``snake`` with that convolution's mask. Arithmetic in float32 whatever the
decoder's dtype; loads and stores in it.

CUDA (also inside CUDA graphs: the launches take device tensors and ints) or,
for tests, CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1`` set
before Triton is imported). Triton comes with CUDA builds of torch; it is
imported on first use.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol, cast

import torch
from torch import nn

BLOCK_T = 1024  # samples a program computes (4 kB of float32 a row)


class MaskState(Protocol):
    """What the fused layers read of a forward's batch state (``snac_net.BatchState``)."""

    lengths: torch.Tensor | None  # (B,) latent frames of each row; None: every row full
    t_latent: int  # latent frames of the batch's longest row


@functools.cache
def _build() -> tuple[Any, Any]:
    """The two kernels, built on first use (Triton imported then)."""
    import triton
    import triton.language as tl

    # channels, scale, dilation and padding as plain ints: no compile per value
    # (t_len stays specialized: a multiple of 16 makes the loads vector loads)
    @triton.jit(do_not_specialize=["channels", "scale"])
    def snake_kernel(x_ptr, alpha_ptr, keep_ptr, out_ptr, channels, t_len, scale,
                     HAS_KEEP: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # b * channels + c
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = t < t_len
        x = tl.load(x_ptr + row * t_len + t, mask=inside, other=0.0).to(tl.float32)
        a = tl.load(alpha_ptr + row % channels).to(tl.float32)
        s = tl.sin(a * x)
        y = x + (1.0 / (a + 1e-9)) * (s * s)
        if HAS_KEEP:
            n = tl.load(keep_ptr + row // channels) * scale
            y = tl.where(t < n, y, 0.0)
        tl.store(out_ptr + row * t_len + t, y.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit(do_not_specialize=["channels", "dilation", "padding"])
    def depthwise_snake_kernel(x_ptr, w_ptr, bias_ptr, alpha_ptr, out_ptr, channels, t_len,
                               dilation, padding, K: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        c = row % channels
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], tl.float32) + tl.load(bias_ptr + c).to(tl.float32)
        for k in tl.static_range(K):
            src = t + k * dilation - padding
            live = (src >= 0) & (src < t_len)
            x = tl.load(x_ptr + row * t_len + src, mask=live, other=0.0).to(tl.float32)
            acc += tl.load(w_ptr + c * K + k).to(tl.float32) * x
        a = tl.load(alpha_ptr + c).to(tl.float32)
        s = tl.sin(a * acc)
        y = acc + (1.0 / (a + 1e-9)) * (s * s)
        tl.store(out_ptr + row * t_len + t, y.to(out_ptr.dtype.element_ty), mask=t < t_len)

    return snake_kernel, depthwise_snake_kernel


def _check(x: torch.Tensor, alpha: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() != 3 or not x.is_contiguous():
        raise ValueError(f"the fused SNAC kernels take contiguous (B, C, T), not "
                         f"{tuple(x.shape)} of strides {x.stride()}")
    b, c, t = x.shape
    if alpha.numel() != c:
        raise ValueError(f"alpha of {alpha.numel()} values for {c} channels")
    return b, c, t


def snake(x: torch.Tensor, alpha: torch.Tensor, keep: torch.Tensor | None = None,
          scale: int = 1) -> torch.Tensor:
    """``Snake(x)`` of ``x`` (B, C, T) with ``alpha`` (C values); with ``keep``
    ((B,) ints), row b's samples from ``keep[b] * scale`` on are zero."""
    b, c, t = _check(x, alpha)
    out = torch.empty_like(x)
    _build()[0][(b * c, (t + BLOCK_T - 1) // BLOCK_T)](
        x, alpha, keep if keep is not None else x, out, c, t, scale,
        HAS_KEEP=keep is not None, BLOCK=BLOCK_T)
    return out


def depthwise_snake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, dilation: int,
                    padding: int, alpha: torch.Tensor) -> torch.Tensor:
    """``Snake(conv(x))`` for a depthwise stride-1 ``conv`` of ``weight`` (C, 1, K)
    or (C, K), ``bias`` (C,), ``dilation`` and zero ``padding`` on both sides
    (output as long as ``x``: ``2 * padding == dilation * (K - 1)``)."""
    b, c, t = _check(x, alpha)
    w = weight.reshape(c, -1).contiguous()
    k = w.shape[1]
    if 2 * padding != dilation * (k - 1):
        raise ValueError(f"a depthwise convolution of kernel {k}, dilation {dilation} and "
                         f"padding {padding} changes the length")
    out = torch.empty_like(x)
    _build()[1][(b * c, (t + BLOCK_T - 1) // BLOCK_T)](
        x, w, bias, alpha, out, c, t, dilation, padding, K=k, BLOCK=BLOCK_T)
    return out


def _keep(state: MaskState, t: int) -> tuple[torch.Tensor | None, int]:
    """The mask's lengths and time scale for a (B, C, t) activation of this forward."""
    if state.lengths is None:
        return None, 1
    return state.lengths, t // state.t_latent


def is_depthwise(conv: nn.Module) -> bool:
    """A depthwise (one filter per channel) stride-1 ``Conv1d`` with numeric padding."""
    return (isinstance(conv, nn.Conv1d) and conv.groups > 1
            and conv.groups == conv.in_channels == conv.out_channels
            and conv.stride[0] == 1 and not isinstance(conv.padding, str))


class MaskedSnake(nn.Module):
    """A ``Snake1d`` and the keep-mask of the convolution after it, one kernel."""

    def __init__(self, snake_layer: nn.Module, state: MaskState) -> None:
        super().__init__()
        self.alpha = cast(torch.Tensor, snake_layer.alpha)
        self._state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep, scale = _keep(self._state, x.shape[-1])
        return snake(x.contiguous(), self.alpha, keep, scale)


class FusedResidualUnit(nn.Module):
    """snac's depthwise ``ResidualUnit`` (Snake, depthwise conv, Snake, 1x1 conv,
    residual add) in two kernels, the 1x1 convolution and the add. The original
    convolutions stay submodules, in forward order (``decoder_support`` walks them)."""

    def __init__(self, unit: nn.Module, state: MaskState) -> None:
        super().__init__()
        block = cast(nn.Sequential, unit.block)
        snake1, conv, snake2, pointwise = list(block.children())
        self.alpha1 = cast(torch.Tensor, snake1.alpha)
        self.conv = cast(nn.Conv1d, conv)
        # fuse picks units whose convolution is_depthwise (numeric padding) with a bias
        self.dilation = int(self.conv.dilation[0])
        self.padding = int(cast(tuple[int], self.conv.padding)[0])
        self.alpha2 = cast(torch.Tensor, snake2.alpha)
        self.pointwise = pointwise
        self._state = state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep, scale = _keep(self._state, x.shape[-1])
        x = x.contiguous()
        h = snake(x, self.alpha1, keep, scale)
        h = depthwise_snake(h, self.conv.weight, cast(torch.Tensor, self.conv.bias),
                            self.dilation, self.padding, self.alpha2)
        y: torch.Tensor = self.pointwise(h)
        return x + y


def fuse(decoder: nn.Module, state: MaskState) -> set[nn.Module]:
    """Swap the fused layers into ``decoder`` (snac 1.2.1 ``Decoder``) in place;
    returns the convolutions whose input mask they apply (no mask hook for those)."""
    from snac.layers import ResidualUnit, Snake1d

    masked: set[nn.Module] = set()

    def walk(module: nn.Module) -> None:
        for name, child in module.named_children():
            conv = child.block[1] if isinstance(child, ResidualUnit) else None
            if conv is not None and is_depthwise(conv) and conv.bias is not None:
                fused = FusedResidualUnit(child, state)
                setattr(module, name, fused)
                masked.add(fused.conv)
            elif isinstance(child, nn.Sequential):
                layers = list(child)
                for i, layer in enumerate(layers[:-1]):
                    after = layers[i + 1]
                    if (isinstance(layer, Snake1d)
                            and isinstance(after, nn.Conv1d | nn.ConvTranspose1d)
                            and after.kernel_size[0] > 1):
                        child[i] = MaskedSnake(layer, state)
                        masked.add(after)
                walk(child)
            else:
                walk(child)

    walk(decoder)
    return masked


__all__ = ["BLOCK_T", "FusedResidualUnit", "MaskState", "MaskedSnake", "depthwise_snake",
           "fuse", "is_depthwise", "snake"]
