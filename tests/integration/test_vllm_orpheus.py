"""Orpheus on real vLLM (CPU wheel): tiny Llama with dummy weights, tiny random SNAC.

The voice with vLLM's EngineCore in this process (engine/vllm_inproc.py) and
the checks of tests/integration/orpheus_checks.py: audio of exactly frames x
2048 samples at 24 kHz for the tokens the engine generated, cancel and close
free the vLLM request at once, and two segments are generated together.
test_vllm_server runs the same checks on its server's voice, whose EngineCore
is in a process of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

pytest.importorskip("vllm")

from rtserver.tools.layouts.snac import write_tiny_snac
from rtserver.voices.orpheus.config import OrpheusConfig
from rtserver.voices.orpheus.layout import write_tiny_orpheus
from rtserver.voices.orpheus.voice import OrpheusVoice, load_orpheus_voice

from . import orpheus_checks as check

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["inproc"])
async def voice(tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> AsyncIterator[OrpheusVoice]:
    """The voice with vLLM's EngineCore in this process (the EngineCore in its
    own process: test_vllm_server's server, one Orpheus engine per process)."""
    root = Path(tmp_path_factory.mktemp("orpheus"))
    model = write_tiny_orpheus(root / "llama", shape="tiny")
    snac = write_tiny_snac(root / "snac", seed=0)
    cfg = OrpheusConfig(model_dir=str(model), snac_dir=str(snac), dummy_weights=True,
                        device="cpu", enforce_eager=True, max_model_len=2048, max_num_seqs=8,
                        engine_process=request.param, budget=check.BUDGET)
    v = await load_orpheus_voice(cfg, "tara")
    await v.warm_up()
    yield v
    await v.close()


async def test_segment_audio_matches_generated_frames(voice: OrpheusVoice) -> None:
    await check.segment_audio_matches_generated_frames(voice)


async def test_cancel_frees_the_vllm_request(voice: OrpheusVoice) -> None:
    await check.first_chunk_then_stop(voice, "cancel-1", "cancel")


async def test_closing_the_stream_frees_the_vllm_request(voice: OrpheusVoice) -> None:
    await check.first_chunk_then_stop(voice, "close-1", "aclose")


async def test_two_segments_at_once(voice: OrpheusVoice) -> None:
    await check.two_segments_at_once(voice)


async def test_warm_up_runs_a_batch_of_requests_at_once(
        voice: OrpheusVoice, monkeypatch: pytest.MonkeyPatch) -> None:
    await check.warm_up_runs_a_batch_of_requests_at_once(voice, monkeypatch)
