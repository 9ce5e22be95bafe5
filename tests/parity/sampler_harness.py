"""A distribution test for any ChatTTS code sampler against upstream's sampling.

A *sampler* here is ``fn(logits, history, settings, generator) -> ids``:
``logits`` float32 ``[N, vocab]`` (one codebook's raw head output per row),
``history`` int64 ``[N, W]`` (the codes generated so far in that codebook,
oldest first, ``W`` may exceed the penalty window), ``settings`` a
:class:`Settings`, ``generator`` a seeded ``torch.Generator`` the sampler
takes its randomness from (or derives its seeds from); returns int64 ``[N]``.
Rows are independent draws. Point the harness at another sampler by writing
such an adapter (``today_sample_codes`` is the one for
``rtserver.voices.chattts.engine.sampling.sample_codes``).

The reference is upstream ChatTTS 0.2.5's own code (``ChatTTS.model.processors
.gen_logits`` and the order ``GPT.generate`` applies it in): logits /
temperature, the repetition penalty over the last 16 codes, top-p then top-k
(transformers' warpers, ``min_tokens_to_keep=3``), EOS masked before
``min_new`` steps, softmax. Upstream draws with ``torch.multinomial`` and
rtserver with a counter-hash exponential race, so draws are compared as
distributions: every draw must lie in upstream's support (probability > 0),
and a chi-square goodness-of-fit test over the draws (cells with expected
count >= 5, the rest pooled) must not reject at ``ALPHA``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats as sps

EOS = 625
ALPHA = 1e-4  # per test; several settings run, so a false alarm stays below 1e-3


@dataclass(frozen=True)
class Settings:
    temperature: float = 0.3
    top_p: float = 0.7
    top_k: int = 20
    penalty: float = 1.05
    step: int = 5  # steps out so far (for min_new)
    min_new: int = 0
    scale: float = 2.0  # of the test logits (case), not a sampler setting


Sampler = Callable[[torch.Tensor, torch.Tensor, Settings, torch.Generator], torch.Tensor]


def upstream_probs(logits: torch.Tensor, history: torch.Tensor, s: Settings) -> torch.Tensor:
    """Upstream's sampling distribution for one row: ``logits`` ``[vocab]``,
    ``history`` ``[W]`` -> probabilities ``[vocab]`` (float64)."""
    from ChatTTS.model.processors import gen_logits

    warpers, processors = gen_logits(num_code=EOS, top_P=s.top_p, top_K=s.top_k or None,
                                     repetition_penalty=s.penalty)
    x = logits[None].clone().float()
    x /= torch.tensor([[s.temperature]])
    for proc in (*processors, *warpers):
        x = proc(history[None].long(), x)
    if s.step < s.min_new:
        x[:, EOS] = -torch.inf
    return torch.softmax(x, dim=-1)[0].double()


def today_sample_codes(logits: torch.Tensor, history: torch.Tensor, s: Settings,
                       gen: torch.Generator) -> torch.Tensor:
    """Adapter for ``engine.sampling.sample_codes``: one codebook per row, the
    last ``PENALTY_WINDOW`` codes as its history (what the engine keeps), a
    seed per row drawn from ``gen``."""
    from rtserver.voices.chattts.engine import sampling

    n = logits.shape[0]
    hist = history[:, -sampling.PENALTY_WINDOW:]
    seeds = torch.randint(0, 2**62, (n,), generator=gen, dtype=torch.int64)

    def full(v: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.full((n,), v, dtype=dtype)

    ids = sampling.sample_codes(
        logits[:, None, :], temperature=full(s.temperature), top_p=full(s.top_p),
        top_k=full(s.top_k, torch.int64), penalty=full(s.penalty), history=hist[:, None, :],
        seed=seeds, step=full(s.step, torch.int64), min_new=full(s.min_new, torch.int64),
        eos_id=EOS)
    return ids[:, 0]


@dataclass(frozen=True)
class FitResult:
    outside_support: int  # draws where upstream's probability is 0
    chi2: float
    dof: int
    p_value: float
    cells: int

    @property
    def rejected(self) -> bool:
        return self.outside_support > 0 or self.p_value < ALPHA


def goodness_of_fit(draws: torch.Tensor, probs: torch.Tensor) -> FitResult:
    """Draws (ids) against the reference probabilities."""
    counts = np.bincount(draws.numpy(), minlength=len(probs)).astype(np.float64)
    p = probs.numpy()
    n = counts.sum()
    outside = int(counts[p <= 0].sum())
    exp = n * p
    big = exp >= 5.0
    obs_c = list(counts[big])
    exp_c = list(exp[big])
    rest_exp = float(exp[~big].sum())
    if rest_exp > 0:
        obs_c.append(float(counts[~big & (p > 0)].sum()))
        exp_c.append(rest_exp)
    o, e = np.array(obs_c), np.array(exp_c)
    if len(o) < 2:  # one cell: nothing to test beyond the support
        return FitResult(outside, 0.0, 0, 1.0, len(o))
    chi2 = float(((o - e) ** 2 / e).sum())
    dof = len(o) - 1
    return FitResult(outside, chi2, dof, float(sps.chi2.sf(chi2, dof)), len(o))


def case(seed: int, vocab: int = EOS + 1, scale: float = 2.0, hist_len: int = 24
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits like a code head's (a few units), and a history that repeats
    some of the likeliest ids, so the penalty changes the distribution."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=g) * scale
    top = torch.topk(logits, 12).indices
    # some negative logits among the repeated ids (the penalty multiplies those)
    logits[top[8:]] = -logits[top[8:]].abs() * 0.1
    pick = torch.randint(0, 12, (hist_len,), generator=g)
    return logits, top[pick]


def run(sampler: Sampler, logits: torch.Tensor, history: torch.Tensor, s: Settings,
        reference: Settings | None = None, n: int = 10_000, seed: int = 0) -> FitResult:
    """``n`` draws of ``sampler`` with ``s`` against upstream's distribution for
    ``reference`` (default ``s``)."""
    gen = torch.Generator().manual_seed(seed)
    draws = sampler(logits[None].expand(n, -1).contiguous(),
                    history[None].expand(n, -1).contiguous(), s, gen)
    assert draws.shape == (n,)
    return goodness_of_fit(draws.long(), upstream_probs(logits, history, reference or s))
