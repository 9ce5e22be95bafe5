"""``[chattts] decoder_deep_steps``: read from the config, checked, the size
the runtime's decoder takes its deep chunks at (0: none), and a segment's
request deadline counted in them."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserver.clock import SYSTEM_CLOCK
from rtserver.config import ConfigError, load_config
from rtserver.tools.layouts.chattts import write_tiny_chattts
from rtserver.voices.base import SynthesisRequest
from rtserver.voices.chattts.config import ChatTTSConfig
from rtserver.voices.chattts.voice import build_runtime


def test_the_environment_sets_it_and_a_size_within_the_plan_is_refused() -> None:
    cfg = load_config(env={"RTSERVER_CHATTTS_DECODER_DEEP_STEPS": "0"}, flags={})
    assert cfg.family("chattts", ChatTTSConfig).decoder_deep_steps == 0
    assert ChatTTSConfig().decoder_deep_steps == 0  # off until an A/B on a GPU
    for bad in ("32", "-1", "400"):
        with pytest.raises(ConfigError, match="decoder_deep_steps"):
            load_config(env={"RTSERVER_CHATTTS_DECODER_DEEP_STEPS": bad}, flags={})


@pytest.mark.parametrize("steps", [0, 40, 63])
async def test_the_runtime_decodes_deep_chunks_of_that_size(tmp_path: Path, steps: int) -> None:
    write_tiny_chattts(tmp_path)
    rt = await build_runtime(ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=2,
                                           max_len=256, decoder_deep_steps=steps))
    try:
        assert rt.decoder.chunking.deep_chunk_frames == steps
    finally:
        await rt.release()


async def test_a_segment_whose_listener_holds_audio_decodes_deep_chunks(tmp_path: Path) -> None:
    """The voice hands the vocoder what the request's deadline says the
    listener holds before the segment: 10 s, so the decode after the first
    is a deep chunk (63 steps) at once."""
    write_tiny_chattts(tmp_path)
    rt = await build_runtime(ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=2,
                                           max_len=256, ignore_eos=True, seeds=(1,),
                                           decoder_deep_steps=63))
    voice = rt.voice("seed_1")
    try:
        request = SynthesisRequest(text="Hello world.", request_id="r1",
                                   deadline=SYSTEM_CLOCK.now() + 10.0, clock=SYSTEM_CLOCK)
        sizes = [len(c.samples) async for c in voice.stream(request, max_steps=120)]
        assert sum(sizes) == 120 * 512
        assert sizes[1] == 63 * 512
    finally:
        await voice.close()
