"""How vLLM graphs its steps for a speech engine: ``[orpheus] cudagraph_mode``
resolved into vLLM's ``cudagraph_mode`` and ``max_num_batched_tokens`` (pure:
no vLLM import, so the choice is tested without it).

A speech engine's every text segment is a new request, so under load a
large share of vLLM's steps hold a prefill (30-46 % at 256 Orpheus streams
on an H100, ``tools.measure.worker_intervals``). vLLM's own default,
FULL_AND_PIECEWISE, runs such a step piecewise: attention and the KV-cache
writes launched from Python, layer by layer; on a slower host that Python
set the step's pace. FULL graphs mixed batches too; on the same H100 host, one
run each, 256 streams underran in 228 of 438 contexts with vLLM's default and
in 0 of 507 with FULL, vLLM's steps 85-103 a second against 138-141, the GPU
busy 79 % against 96 % (``bench/results/h100-2026-12-07-s32``).

vLLM graphs batches of up to ``largest_graphed_batch`` tokens only (its
default ``max_cudagraph_capture_size``); a larger batch runs with no graph at
all (vLLM PR 20059 measured that path at about twice piecewise's host time),
so under FULL the engine's tokens a step are capped there unless set.
"""

from __future__ import annotations

# What "auto" means on a CUDA GPU; elsewhere (vLLM on the CPU) vLLM's own choice.
AUTO_ON_CUDA = "FULL"


def largest_graphed_batch(max_num_seqs: int) -> int:
    """Tokens of the largest batch vLLM 0.26 captures by default
    (vllm/config/vllm.py: ``min(max_num_seqs * 2, 512)``, no speculation)."""
    return min(2 * max_num_seqs, 512)


def graph_settings(mode: str, max_num_seqs: int, max_num_batched_tokens: int | None,
                   *, cuda: bool, eager: bool) -> tuple[str | None, int | None]:
    """(vLLM's ``cudagraph_mode`` by name, ``max_num_batched_tokens``) for the
    setting ``mode``; None: vLLM's own. "auto" is ``AUTO_ON_CUDA`` on a CUDA GPU
    (``cuda``) and vLLM's choice elsewhere; ``eager`` (no graphs) leaves both to
    vLLM. Under "FULL", unset tokens a step become the largest graphed batch,
    never fewer than ``max_num_seqs`` (vLLM's own floor)."""
    if eager:
        return None, max_num_batched_tokens
    resolved = (AUTO_ON_CUDA if cuda else None) if mode == "auto" else mode
    if resolved == "FULL" and max_num_batched_tokens is None:
        max_num_batched_tokens = max(max_num_seqs, largest_graphed_batch(max_num_seqs))
    return resolved, max_num_batched_tokens
