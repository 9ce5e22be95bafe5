"""Hand-offs between the ChatTTS engine, the voice and the decoder are copies:
nothing a consumer holds is a view of a buffer the producer rewrites (on CUDA,
a view of a graph's static output would change under the consumer)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtserver.engine.base import SamplingSettings, TokenRequest  # noqa: E402
from rtserver.tools.layouts.chattts import write_tiny_chattts  # noqa: E402
from rtserver.tools.layouts.chattts_decoder import write_tiny_decoder_assets  # noqa: E402
from rtserver.voices.chattts.assets import load_lm_assets  # noqa: E402
from rtserver.voices.chattts.decoder.checkpoint import load_audio_models  # noqa: E402
from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder, StepWindow  # noqa: E402
from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig  # noqa: E402
from rtserver.voices.chattts.engine.model import ChatLM  # noqa: E402


def test_engine_hidden_states_are_copies(tmp_path: Path) -> None:
    """Each step's hidden state, kept as delivered, still equals what it was
    when delivered after later steps rewrote the engine's output buffer."""
    write_tiny_chattts(tmp_path, decoder=False)
    assets = load_lm_assets(tmp_path)
    engine = TorchCodeEngine(
        lambda: ChatLM(assets.config, assets.gpt, assets.embed, slots=2, max_len=128),
        TorchEngineConfig(eager_steps=2, stream_interval=3, ignore_eos=True),
        eos_id=assets.config.eos_id)
    ids = assets.tokenizer.encode("[Stts][speed_5]hello[Ptts]")

    async def go() -> tuple[list[np.ndarray], list[np.ndarray]]:
        await engine.start()
        kept, snapshots = [], []
        try:
            req = TokenRequest(request_id="a", prompt_token_ids=tuple(ids), max_tokens=12,
                               sampling=SamplingSettings(seed=3), want_hidden=True)
            async for delta in engine.generate(req):
                assert delta.hidden is not None
                h = np.asarray(delta.hidden)
                assert not np.shares_memory(h, engine.runner.np_ring_h)
                kept.append(h)
                snapshots.append(h.copy())
        finally:
            await engine.close()
        return kept, snapshots

    kept, snapshots = asyncio.run(go())
    assert sum(len(h) for h in kept) == 12 and len(kept) > 1
    for h, snap in zip(kept, snapshots, strict=True):
        np.testing.assert_array_equal(h, snap)


def test_decoder_audio_is_not_a_view_of_a_graph_output(tmp_path: Path) -> None:
    """Audio of a call replayed on a (CPU-emulated) graph survives the next
    replay of the same graph; the first lane's static buffers are its own."""
    root = write_tiny_decoder_assets(tmp_path, gpt_hidden=32, seed=4)
    mel, vocos, dims = load_audio_models(root)
    dec = ChatTTSWindowDecoder(mel, vocos, dims, "decoder", graph_max_batch=4,
                               graph_frame_buckets=(16, 24), graph_max_cells=96,
                               emulate_graphs=True)
    dec.warm_up()
    rng = np.random.default_rng(5)
    a = [StepWindow(rng.standard_normal((16, 32)).astype(np.float32), 0) for _ in range(2)]
    b = [StepWindow(rng.standard_normal((16, 32)).astype(np.float32), 0) for _ in range(2)]
    got_a = dec.decode(a)
    kept = [x.copy() for x in got_a]
    dec.decode(b)  # same bucket: the same static buffers
    for x, k in zip(got_a, kept, strict=True):
        np.testing.assert_array_equal(x, k)
    lane = dec.first_lane(max_batch=2, max_steps=16)
    assert lane is not None
    main_ptrs = {t.data_ptr() for g in dec._graphs.values() for t in (g.x, g.lengths, g.out)
                 if t is not None}
    lane_ptrs = {t.data_ptr() for g in lane._graphs.values() for t in (g.x, g.lengths, g.out)
                 if t is not None}
    assert lane_ptrs and not main_ptrs & lane_ptrs
