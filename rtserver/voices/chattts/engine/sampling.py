"""Batched sampling per request and per codebook, as upstream ChatTTS samples.

Upstream (``ChatTTS/core.py`` ``_infer_code`` + ``model/gpt.py`` ``generate`` +
``model/processors.py``), per row (one request's codebook):

1. logits / temperature;
2. repetition penalty over the last 16 generated ids of that codebook
   (``CustomRepetitionPenaltyLogitsProcessorRepeat(penalty, _, 16)``):
   ``alpha = penalty ** count``, negative logits times alpha, others divided;
3. top-p (transformers ``TopPLogitsWarper``, ``min_tokens_to_keep=3``), then
   top-k (``TopKLogitsWarper``, ``min_tokens_to_keep=3``);
4. EOS masked while fewer than ``min_new`` steps are out;
5. softmax and one draw.

Every row's parameters are tensors, so one call samples a whole batch with
different settings, and the draw is the exponential race (``argmax p / E``,
``E ~ Exp(1)``, the same distribution as ``torch.multinomial``) with ``E``
from a counter-based hash of (seed, step, codebook, id): a request's draws
depend on its own seed and step only, never on its batch neighbours or on
the order requests arrived in. Graph-safe: no host syncs, static shapes.
"""

from __future__ import annotations

import torch

MIN_KEEP = 3  # upstream gen_logits: min_tokens_to_keep=3 for both warpers
PENALTY_WINDOW = 16  # upstream gen_logits: past_window=16

_M32 = 0xFFFFFFFF
# A Python float, not a tensor: a CUDA tensor made from a host value is a copy,
# which a CUDA graph capture refuses.
NEG_INF = float("-inf")


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """The murmur3 32-bit finaliser on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def race_noise(seed: torch.Tensor, step: torch.Tensor, n_codebooks: int,
               vocab: int) -> torch.Tensor:
    """``E ~ Exp(1)`` of shape ``[N, vq, vocab]``, a pure function of each row's
    ``seed`` and ``step`` (int64 ``[N]``)."""
    dev = seed.device
    q = torch.arange(n_codebooks, device=dev, dtype=torch.int64)[None, :, None]
    v = torch.arange(vocab, device=dev, dtype=torch.int64)[None, None, :]
    s = _mix32((seed[:, None, None] & _M32) ^ 0x9E3779B9)
    x = _mix32(s ^ ((step[:, None, None] * 0x27D4EB2F) & _M32))
    x = _mix32(x ^ ((q * 0x165667B1) & _M32))
    x = _mix32(x ^ ((v * 0x61C88647) & _M32))
    u = (x.to(torch.float64) + 0.5) / 4294967296.0  # (0, 1)
    return (-torch.log(u)).to(torch.float32)


def penalty_counts(history: torch.Tensor, vocab: int) -> torch.Tensor:
    """``history`` ``[N, vq, W]`` ids, ``vocab`` (and above) for empty places ->
    counts ``[N, vq, vocab]`` float32."""
    n, q, _ = history.shape
    counts = torch.zeros((n, q, vocab + 1), device=history.device, dtype=torch.float32)
    counts.scatter_add_(2, history.clamp(max=vocab),
                        torch.ones(history.shape, device=history.device, dtype=torch.float32))
    return counts[..., :vocab]


def sample_codes(logits: torch.Tensor, *, temperature: torch.Tensor, top_p: torch.Tensor,
                 top_k: torch.Tensor, penalty: torch.Tensor, history: torch.Tensor,
                 seed: torch.Tensor, step: torch.Tensor, min_new: torch.Tensor,
                 eos_id: int) -> torch.Tensor:
    """``logits`` float32 ``[N, vq, vocab]`` -> ids ``[N, vq]`` (int64).

    ``temperature`` ``[N]`` (> 0), ``top_p`` ``[N]`` (1: off), ``top_k`` ``[N]``
    int (0: off), ``penalty`` ``[N]`` (1: off), ``history`` ``[N, vq, W]``,
    ``seed``/``step``/``min_new`` int64 ``[N]``.
    """
    probs = code_probs(logits, temperature=temperature, top_p=top_p, top_k=top_k,
                       penalty=penalty, history=history, step=step, min_new=min_new,
                       eos_id=eos_id)
    _, q, vocab = logits.shape
    return (probs / race_noise(seed, step, q, vocab)).argmax(dim=-1)


def code_probs(logits: torch.Tensor, *, temperature: torch.Tensor, top_p: torch.Tensor,
               top_k: torch.Tensor, penalty: torch.Tensor, history: torch.Tensor,
               step: torch.Tensor, min_new: torch.Tensor, eos_id: int) -> torch.Tensor:
    """The distribution ``sample_codes`` draws from (steps 1-4 of the module
    docstring), float32 ``[N, vq, vocab]``."""
    n, q, vocab = logits.shape
    x = logits / temperature[:, None, None]
    alpha = torch.pow(penalty[:, None, None], penalty_counts(history, vocab))
    x = torch.where(x < 0, x * alpha, x / alpha)
    # top-p: drop the low tail whose mass is <= 1 - p (ascending order)
    asc, order = torch.sort(x, dim=-1)
    cum = asc.softmax(dim=-1).cumsum(dim=-1)
    drop = cum <= (1.0 - top_p)[:, None, None]
    drop[..., -MIN_KEEP:] = False
    x = x.masked_fill(drop.scatter(-1, order, drop), NEG_INF)
    # top-k: keep what is >= the k-th largest (ties kept, as transformers)
    k = torch.where(top_k > 0, top_k.clamp(min=MIN_KEEP), torch.full_like(top_k, vocab))
    k = k.clamp(max=vocab)
    desc = torch.sort(x, dim=-1, descending=True).values
    kth = desc.gather(-1, (k - 1)[:, None, None].expand(n, q, 1))
    x = x.masked_fill(x < kth, NEG_INF)
    # no EOS before min_new steps
    early = (step < min_new)[:, None]
    x[..., eos_id] = x[..., eos_id].masked_fill(early, NEG_INF)
    return x.softmax(dim=-1)
