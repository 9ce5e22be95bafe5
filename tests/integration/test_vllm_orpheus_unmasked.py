"""Orpheus without the logits mask (token_guard "none": the configuration that
lets vLLM pick its faster V2 model runner on a GPU), on the CPU wheel.

The tiny checkpoint has audio-biased random weights (``write_random_orpheus``):
it writes audio tokens of random slots, which the voice re-slots and counts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

pytest.importorskip("vllm")

from rtserver.clock import SYSTEM_CLOCK
from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.voices.base import MODEL_OUTPUT_MARK, Marks, SynthesisRequest
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.orpheus.config import OrpheusConfig
from rtserver.voices.orpheus.layout import write_random_orpheus
from rtserver.voices.orpheus.voice import OrpheusVoice, load_orpheus_voice

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


# inproc: vLLM's EngineCore in this process, so two processes fewer to start
# on the CPU (its mp executor adds a worker process): ~11 s against ~25 s on
# 2 cores. test_vllm_orpheus runs both modes; test_vllm_server the separate one.
@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def voice(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[OrpheusVoice]:
    root = Path(tmp_path_factory.mktemp("orpheus-unmasked"))
    model = write_random_orpheus(root / "llama", shape="tiny", device="cpu")
    snac = write_tiny_snac(root / "snac", seed=0)
    cfg = OrpheusConfig(model_dir=str(model), snac_dir=str(snac), token_guard="none",
                        device="cpu", enforce_eager=True, max_model_len=1024, max_num_seqs=4,
                        engine_process="inproc")
    v = await load_orpheus_voice(cfg, "tara")
    yield v
    await v.close()


async def test_unmasked_stream_is_reslotted_into_audio(voice: OrpheusVoice) -> None:
    engine = voice.runtime.engine
    before = engine.stats().generation_tokens_total
    marks = Marks(SYSTEM_CLOCK)
    req = SynthesisRequest(text="Hello there.", request_id="unmasked-1", first=True,
                           marks=marks)
    chunks = [c async for c in voice.stream(req, max_tokens=10 * ot.FRAME_TOKENS)]
    generated = engine.stats().generation_tokens_total - before
    assert generated == 10 * ot.FRAME_TOKENS  # random weights never end speech
    audio = np.concatenate([c.samples for c in chunks])
    assert len(audio) == 10 * 2048 and np.isfinite(audio).all()
    counters = voice.runtime.counters()
    assert counters["orpheus_reslotted_tokens"][1] > 0  # random slots, none failed
    assert counters["vocoder_calls"][1] >= 2 and counters["vocoder_frames"][1] >= 10
    assert MODEL_OUTPUT_MARK in marks  # the first frame's tokens were marked
