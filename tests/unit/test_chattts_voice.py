"""A ChatTTS voice on the tiny checkpoint without a server: the refine-text
pass (opt-in) and a segment's audio length."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.chattts.config import ChatTTSConfig
from rtserver.voices.chattts.voice import ChatTTSRuntime, ChatTTSVoice, build_runtime


async def tiny_voice(tmp_path: Path) -> tuple[ChatTTSRuntime, ChatTTSVoice]:
    """The tiny checkpoint's seed_1 on the CPU, EOS off (two slots of 256)."""
    write_tiny_chattts(tmp_path)
    rt = await build_runtime(ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=2,
                                           max_len=256, ignore_eos=True, seeds=(1,)))
    return rt, rt.voice("seed_1")


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
    rt, voice = await tiny_voice(tmp_path)
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


async def test_the_eos_step_is_never_pushed_to_the_decoder(tmp_path: Path) -> None:
    """Steps go to the decoder stream as they arrive, less any step holding EOS in
    a codebook (upstream drops it); a delta of EOS steps alone pushes nothing."""
    import numpy as np

    from rtserver.engine.base import CodeDelta

    write_tiny_chattts(tmp_path)
    cfg = ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=1, max_len=64,
                        seeds=(1,))
    rt = await build_runtime(cfg)
    eos = rt.eos_id
    hidden = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    deltas = [CodeDelta(((1, 2, 3, 4), (5, 6, 7, 8)), hidden[0:2]),
              CodeDelta(((9, 9, 9, 9), (eos, 1, 1, 1)), hidden[2:4]),
              CodeDelta(((eos, eos, eos, eos),), hidden[4:5])]
    pushed: list[np.ndarray] = []

    class Engine:
        async def generate(self, request: object):  # type: ignore[no-untyped-def]
            for d in deltas:
                yield d

        def release_hidden(self, request_id: str) -> None:
            pass

    class Stream:
        async def push(self, x: object) -> list[object]:
            pushed.append(np.array(x))
            return []

        async def finish(self) -> list[object]:
            return []

        def close(self) -> None:
            pass

    class Decoder:
        def open_stream(self, **_: object) -> Stream:
            return Stream()

    engine, decoder = rt.engine, rt.decoder
    rt.engine, rt.decoder = Engine(), Decoder()  # type: ignore[assignment]
    voice = rt.voice("seed_1")
    try:
        chunks = [c async for c in voice.stream(SynthesisRequest(text="Hello.", request_id="e"))]
        assert chunks == []
        assert [p.tolist() for p in pushed] == [hidden[0:2].tolist(), hidden[2:3].tolist()]
    finally:
        rt.engine, rt.decoder = engine, decoder
        await voice.close()


async def test_the_decoders_counters_show_what_padding_cost(tmp_path: Path) -> None:
    """/metrics' decoder counters: the frames asked for, those computed with the
    batch's padding, and those computed with the padding of the calls' shapes."""
    rt, voice = await tiny_voice(tmp_path)
    try:
        async for _ in voice.stream(SynthesisRequest(text="Hello world.", request_id="s1",
                                                     first=True), max_steps=40):
            pass
        # the torch engine fails a non-finite step itself: the decoder's streams
        # skip their own check of every hidden state
        assert rt.decoder.config.finite_input is True  # type: ignore[attr-defined]
        counters = {name: value for name, (_, value) in rt.counters().items()}
        frames = counters["chattts_decoder_frames"]
        assert frames >= 40  # every step, with the windows' context and look-ahead
        assert counters["chattts_decoder_computed_frames"] >= counters[
            "chattts_decoder_padded_frames"] >= frames
    finally:
        await voice.close()
