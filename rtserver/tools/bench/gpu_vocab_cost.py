"""What Orpheus's vocabulary costs a vLLM decode step (issue 24), on one CUDA GPU:
``python -m rtserver.tools.bench.gpu_vocab_cost [--rows 128,192,256] [--out F.json]``.

Orpheus-3B writes only audio tokens (7 x 4,096) and its end token, yet every
decode step computes logits over the whole 156,940-token vocabulary and
vLLM's sampler reads them all. This times that vocabulary-wide work with
vLLM's own kernels (the V2 model runner's, vLLM 0.26: ``vllm.v1.worker.gpu
.sample``), at the full width and at the audio tokens' width:

- ``lm_head``: the tied embedding's GEMM, bf16 hidden states to bf16 logits;
- ``penalties``: the repetition penalty (1.3, Orpheus's default), with a
  prompt and an output's counts;
- ``temperature`` (0.6) and ``top_p`` (0.8, vLLM's ``apply_top_k_top_p``, less
  the copy of its input the timing makes);
- ``sample``: vLLM's Gumbel-max sampling kernel.

Each part is timed alone with CUDA events (the mean of ``--iters`` runs after
``--warmup``); logits are random normal, so the top-p cut keeps more tokens
than a trained model's peaked rows would (its cost is an upper bound).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HIDDEN = 3072  # Llama-3.2-3B hidden size (Orpheus-3B's config.json)
FULL_VOCAB = 156_940  # Orpheus-3B's config.json vocab_size
AUDIO_VOCAB = 7 * 4096 + 8  # the audio tokens and a few special tokens beside them
PARTS = ("lm_head", "penalties", "temperature", "top_p", "sample")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="128,192,256", help="decode rows (requests) a step")
    p.add_argument("--vocabs", default=f"{FULL_VOCAB},{AUDIO_VOCAB}")
    p.add_argument("--prompt-tokens", type=int, default=40)
    p.add_argument("--output-tokens", type=int, default=400)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    return p


def shares(row: dict[str, float]) -> dict[str, float]:
    """Each part's share of the row's total (the parts' ms summed)."""
    total = sum(row[p] for p in PARTS)
    return {p: round(row[p] / total, 3) if total else 0.0 for p in PARTS}


def _time(fn: Callable[[], object], iters: int, warmup: int) -> float:
    import torch

    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / iters


def measure(rows: int, vocab: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.worker.gpu.sample.gumbel import apply_temperature, gumbel_sample
    from vllm.v1.worker.gpu.sample.penalties import apply_penalties

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    hidden = torch.randn(rows, HIDDEN, device=dev, dtype=torch.bfloat16, generator=g)
    weight = torch.randn(vocab, HIDDEN, device=dev, dtype=torch.bfloat16, generator=g) * 0.02
    logits = hidden @ weight.t()
    idx = torch.arange(rows, device=dev, dtype=torch.int32)
    pos = torch.full((rows,), args.prompt_tokens + args.output_tokens, device=dev,
                     dtype=torch.int64)
    local_pos = torch.zeros(rows, device=dev, dtype=torch.int32)
    input_ids = torch.randint(0, vocab, (rows,), device=dev, generator=g)
    rep = torch.full((rows,), 1.3, device=dev)
    zero = torch.zeros(rows, device=dev)
    temp = torch.full((rows,), 0.6, device=dev)
    top_p = torch.full((rows,), 0.8, device=dev)
    seeds = torch.arange(rows, device=dev, dtype=torch.int64)
    prompt_mask = torch.zeros(rows, (vocab + 31) // 32, device=dev, dtype=torch.int32)
    words = torch.randint(0, prompt_mask.shape[1], (rows, args.prompt_tokens), device=dev,
                          generator=g)
    prompt_mask.scatter_(1, words, 1)
    counts = torch.zeros(rows, vocab, device=dev, dtype=torch.int32)
    outs = torch.randint(0, vocab, (rows, args.output_tokens), device=dev, generator=g)
    counts.scatter_add_(1, outs, torch.ones_like(outs, dtype=torch.int32))

    def lm_head() -> object:
        return torch.matmul(hidden, weight.t(), out=logits)

    def penalties() -> object:
        apply_penalties(logits, idx, input_ids, local_pos, rep, zero, zero, prompt_mask, counts)
        return None

    def temperature() -> object:
        apply_temperature(logits, idx, temp)
        return None

    def top_p_cut() -> object:  # on a copy: the cut writes -inf into its input
        return apply_top_k_top_p(logits.clone(), None, top_p)

    def copy() -> object:
        return logits.clone()

    # vLLM 0.32 added a required ``is_drafting`` (speculative decoding's drafts)
    drafting: dict[str, Any] = ({"is_drafting": False}
                if "is_drafting" in inspect.signature(gumbel_sample).parameters else {})

    def sample() -> object:
        return gumbel_sample(logits, idx, temp, seeds, pos, apply_temperature=False,
                             **drafting)

    fns = {"lm_head": lm_head, "penalties": penalties, "temperature": temperature,
           "top_p": top_p_cut, "sample": sample}
    row: dict[str, Any] = {"rows": rows, "vocab": vocab}
    for name in PARTS:
        lm_head()  # fresh logits: the in-place parts would drive them to inf
        row[name] = round(_time(fns[name], args.iters, args.warmup), 4)
    row["top_p"] = round(max(row["top_p"] - _time(copy, args.iters, args.warmup), 0.0), 4)
    row["total"] = round(sum(row[p] for p in PARTS), 4)
    row["shares"] = shares(row)
    return row


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import torch
    except ImportError:
        print("needs torch with CUDA and vLLM 0.26's V2 sampler", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (vLLM's sampler kernels are Triton)", file=sys.stderr)
        return 2
    results = []
    for vocab in (int(v) for v in args.vocabs.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            row = measure(rows, vocab, args)
            results.append(row)
            print(f"vocab {vocab:>7} rows {rows:>4}: " + "  ".join(
                f"{p} {row[p]:.3f}" for p in PARTS) + f"  total {row['total']:.3f} ms",
                flush=True)
    doc = {"benchmark": "vocabulary-wide work of one vLLM decode step (ms)",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "settings": {k: str(v) for k, v in vars(args).items()}, "rows": results}
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
