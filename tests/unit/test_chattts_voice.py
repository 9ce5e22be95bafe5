"""A ChatTTS voice on the tiny checkpoint without a server: the refine-text
pass (opt-in) and a segment's audio length."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.chattts.config import ChatTTSConfig
from rtserver.voices.chattts.voice import build_runtime


async def test_refine_then_speak(tmp_path: Path) -> None:
    write_tiny_chattts(tmp_path)
    cfg = ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=2, max_len=256,
                        refine_text=True, refine_slots=2, refine_max_tokens=16,
                        ignore_eos=True, seed=3, seeds=(1,))
    rt = await build_runtime(cfg)
    voice = rt.voice("seed_1")
    try:
        tok = rt.tokenizer
        ids = await rt.refined_prompt_ids("Hello world.", "r1")
        head = tok.encode("[Stts][spk_emb][speed_5]")
        assert ids[:len(head)] == head and ids[-1] == tok.token_id("[Ptts]")
        cut = tok.token_id("[break_0]")
        assert cut is not None and all(t < cut for t in ids[len(head):-1])
        # the same seed, the same rewrite
        assert await rt.refined_prompt_ids("Hello world.", "r2") == ids
        # plain prompt for comparison: refine changed the text
        assert rt.prompt_ids("Hello world.") != ids
        samples = 0
        async for chunk in voice.stream(SynthesisRequest(text="Hello world.", request_id="s1",
                                                         first=True), max_steps=8):
            samples += len(chunk.samples)
        assert samples == 8 * 512
    finally:
        await voice.close()
    assert rt.closed


async def test_upstream_download_without_speaker_statistics_names_them(tmp_path: Path) -> None:
    """Exactly the files upstream 0.2.5 downloads (no spk_stat.pt): seeded
    speakers need chattts.speaker_stats, and the error says where it lives."""
    from rtserver.errors import UnknownVoice
    from rtserver.tools.layouts.chattts import tiny_speaker_stats

    write_tiny_chattts(tmp_path, spk_stat_file=False)
    cfg = ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=1, max_len=64, seeds=(1,))
    with pytest.raises(UnknownVoice, match=r"spk_stat\.pt and chattts\.speaker_stats is empty"):
        await build_runtime(cfg)
    rt = await build_runtime(ChatTTSConfig(
        asset_dir=str(tmp_path), device="cpu", slots=1, max_len=64, seeds=(1,),
        speaker_stats=tiny_speaker_stats(tmp_path)))
    try:
        assert rt.voice("seed_1").info.name
    finally:
        await rt.release()


async def test_a_contexts_speed_reaches_the_speed_token(tmp_path: Path) -> None:
    """``SynthesisRequest.speed`` becomes ``[speed_N]`` in the engine request."""
    write_tiny_chattts(tmp_path)
    cfg = ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=2, max_len=256,
                        ignore_eos=True, seeds=(1,))
    rt = await build_runtime(cfg)
    voice = rt.voice("seed_1")
    try:
        tok = rt.tokenizer

        def head(speed: float) -> tuple[int, ...]:
            req = voice.token_request(SynthesisRequest(text="Hello world.", request_id="s",
                                                       speed=speed))
            assert req is not None
            return req.prompt_token_ids[:len(tok.encode("[Stts][spk_emb][speed_5]"))]

        assert head(1.0) == tuple(tok.encode("[Stts][spk_emb][speed_5]"))
        assert head(2.0) == tuple(tok.encode("[Stts][spk_emb][speed_9]"))
        assert head(0.5) == tuple(tok.encode("[Stts][spk_emb][speed_2]"))
        assert voice.info.controls.speed_range == (0.5, 2.0)
    finally:
        await voice.close()
