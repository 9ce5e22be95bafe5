"""Decode attention that reads each row's own keys only (a Triton kernel).

A decode step's dense attention (``F.scaled_dot_product_attention`` with a mask)
reads every row's cache up to the step's length bucket, the longest row's
position rounded up: with rows of 100 to 1,000 positions in one batch most of
what it reads is masked out, and reading the cache is most of a step's GPU time
at hundreds of rows (K and V: 20 layers x 2 x 768 x 2 bytes = 61 kB a position a
row in bf16). ``decode_attention`` reads row ``b``'s positions ``0..pos[b]``
only (capped at ``length``), one program per (row, head), an online softmax in
float32 over blocks of ``BLOCK`` positions (FlashAttention's recurrence;
flash-decoding without the split, since a busy step has hundreds of rows x 12
heads of programs already). Plain loads and reductions, no ``tl.dot``: one
query a row is memory-bound, not a matrix product.

It runs on CUDA (inside the engine's CUDA graphs: no host sync, the launch takes
device tensors and ints the graph's shape fixes) and, for tests, on CPU tensors
under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is
imported). Triton comes with CUDA builds of torch; it is imported on first use.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import torch

BLOCK = 64  # positions a loop turn reads: 64 x 64 bf16 = 8 kB of K and as much of V


def interpreted() -> bool:
    """Triton's interpreter is on (kernels run on CPU tensors; tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _build() -> Any:
    """The kernel, built on first use (Triton imported then, interpreter or not)."""
    import triton
    import triton.language as tl

    @triton.jit
    def decode_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, length, scale, sp,
                      sq_b, sq_h, sk_b, sk_h, sk_t, sv_b, sv_h, sv_t, so_b, so_h,
                      GROUP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)  # row offsets pass 2**31 in a large cache
        h = tl.program_id(1)
        kvh = h // GROUP
        n = tl.minimum(tl.load(pos_ptr + b * sp).to(tl.int32) + 1, length)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + b * sq_b + h * sq_h + d).to(tl.float32) * scale
        k_row = k_ptr + b * sk_b + kvh * sk_h
        v_row = v_ptr + b * sv_b + kvh * sv_h
        m_i = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
        l_i = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
        acc = tl.zeros([D], tl.float32)
        for start in range(0, n, BLOCK):
            t = start + tl.arange(0, BLOCK)
            live = t < n
            k = tl.load(k_row + t[:, None] * sk_t + d[None, :], mask=live[:, None], other=0.0)
            s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)
            s = tl.where(live, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new)
            v = tl.load(v_row + t[:, None] * sv_t + d[None, :], mask=live[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        out = acc / l_i
        tl.store(out_ptr + b * so_b + h * so_h + d, out.to(out_ptr.dtype.element_ty))

    return decode_kernel


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     pos: torch.Tensor, length: int) -> torch.Tensor:
    """Attention of ``q`` ``[B, heads, 1, D]`` (row b at position ``pos[b]``;
    ``pos`` of any stride, e.g. a column of the runner's state) over rows
    ``0..B-1`` of one layer's cache ``[slots, kv_heads, max_len, D]``, keys
    ``0..min(pos[b], length - 1)``: what SDPA with the mask ``arange(length) <=
    pos`` gives, ``[B, heads, 1, D]`` in ``q``'s dtype. Grouped heads
    (``heads`` a multiple of ``kv_heads``) share their key-value head."""
    b, heads, one, d = q.shape
    kv_heads = k_cache.shape[1]
    if one != 1 or heads % kv_heads or k_cache.shape[-1] != d or d & (d - 1):
        raise ValueError(f"decode attention takes q [B, heads, 1, D] (D a power of two, "
                         f"heads a multiple of kv heads), not {tuple(q.shape)} over "
                         f"{tuple(k_cache.shape)}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("decode attention needs the head dimension contiguous")
    out = torch.empty((b, heads, 1, d), dtype=q.dtype, device=q.device)
    _build()[(b, heads)](
        q, k_cache, v_cache, pos, out, length, 1.0 / math.sqrt(d), pos.stride(0),
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        GROUP=heads // kv_heads, D=d, BLOCK=BLOCK)
    return out


__all__ = ["BLOCK", "decode_attention", "interpreted"]
