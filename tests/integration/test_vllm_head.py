"""Orpheus with ``audio_head = "on"`` on real vLLM (CPU wheel, its V1 model
runner, so without a repetition penalty): the model computes logits for the
audio and end tokens only (engine/vllm_head.py).

A tiny checkpoint with plain random weights (which favour no token), loaded
through vLLM's loader (so the embedding's rows are reordered at load), greedy:
every token vLLM writes must be the full model's best audio or end token for
its prefix, by a float32 reference computed here with transformers from the
same files (at some of those prefixes the best token overall is not audio).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

pytest.importorskip("vllm")

from rtserver.engine.base import SamplingSettings
from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.orpheus.config import OrpheusConfig
from rtserver.voices.orpheus.layout import write_tiny_orpheus
from rtserver.voices.orpheus.voice import OrpheusVoice, load_orpheus_voice

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

TOKENS = 3 * ot.FRAME_TOKENS


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def voice(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OrpheusVoice]:
    root = Path(tmp_path_factory.mktemp("orpheus-head"))
    model = write_tiny_orpheus(root / "llama", shape="tiny", with_weights=True)
    snac = write_tiny_snac(root / "snac", seed=0)
    cfg = OrpheusConfig(model_dir=str(model), snac_dir=str(snac), token_guard="none",
                        audio_head="on", dtype="float32",
                        sampling=SamplingSettings(temperature=0.0, repetition_penalty=1.0),
                        device="cpu", enforce_eager=True, max_model_len=512, max_num_seqs=4,
                        engine_process="inproc")
    v = await load_orpheus_voice(cfg, "tara")
    yield v
    await v.close()


async def _generate(voice: OrpheusVoice, rid: str) -> tuple[list[int], list[int]]:
    """(prompt ids, written ids) of one request run to TOKENS, both in the
    checkpoint's numbering."""
    import dataclasses

    req = voice.token_request(SynthesisRequest(text="Hello there.", request_id=rid,
                                               first=True))
    req = dataclasses.replace(req, max_tokens=TOKENS, stop_token_ids=())
    out: list[int] = []
    async for delta in voice.runtime.engine.generate(req):
        out.extend(delta)
    return list(req.prompt_token_ids), out


async def test_head_writes_the_full_models_best_audio_token(voice: OrpheusVoice) -> None:
    import torch
    from transformers import LlamaForCausalLM

    engine = voice.runtime.engine
    head = engine.config.head  # type: ignore[attr-defined]
    assert head is not None and head.head_size == ot.FRAME_TOKENS * ot.CODEBOOK_SIZE + 2
    prompt, written = await _generate(voice, "head-1")
    assert len(written) == TOKENS
    assert all(head.in_head(t) for t in written)

    model = LlamaForCausalLM.from_pretrained(voice.runtime.config.model_dir,
                                             torch_dtype=torch.float32).eval()
    head_ids = torch.tensor(head.from_model(list(range(head.head_size))))
    with torch.no_grad():
        logits = model(torch.tensor([prompt + written])).logits[0, len(prompt) - 1:-1]
    best_overall = logits.argmax(dim=-1)
    in_head = logits[:, head_ids]
    best = in_head.max(dim=-1).values
    chosen = logits[torch.arange(len(written)), torch.tensor(written)]
    # each written token is the best of the head (up to float32 rounding between
    # vLLM's kernels and transformers')
    assert torch.all(best - chosen <= 1e-4 * best.abs().clamp(min=1.0)), (best - chosen).max()
    # and the head matters: somewhere the whole vocabulary's best was another id
    assert any(not head.in_head(int(t)) for t in best_overall)


async def test_same_prompt_same_tokens(voice: OrpheusVoice) -> None:
    _, a = await _generate(voice, "head-2")
    _, b = await _generate(voice, "head-3")
    assert a == b  # greedy
