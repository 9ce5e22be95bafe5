"""The hidden-state store (``[chattts] hidden_store``): the GPT's hidden states
stay on the engine's device and the decoder gathers its windows there. What a
user hears must not change, and a store row is never reused while its decoder
may still read it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rtserver.engine.base import SamplingSettings, TokenRequest  # noqa: E402
from rtserver.testing.wait import wait_until_async  # noqa: E402
from rtserver.tools.layouts.chattts import write_tiny_chattts  # noqa: E402
from rtserver.tools.layouts.chattts_decoder import write_tiny_decoder_assets  # noqa: E402
from rtserver.voices.base import SynthesisRequest  # noqa: E402
from rtserver.voices.chattts.assets import LmAssets  # noqa: E402
from rtserver.voices.chattts.config import ChatTTSConfig  # noqa: E402
from rtserver.voices.chattts.decoder.checkpoint import load_audio_models  # noqa: E402
from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder, StepWindow  # noqa: E402
from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig  # noqa: E402
from rtserver.voices.chattts.engine.model import ChatLM  # noqa: E402
from rtserver.voices.chattts.voice import build_runtime  # noqa: E402


@contextlib.asynccontextmanager
async def engine_of(assets: LmAssets, *, store: bool, slots: int = 2,
                    **cfg: object) -> AsyncIterator[TorchCodeEngine]:
    engine = TorchCodeEngine(
        lambda: ChatLM(assets.config, assets.gpt, assets.embed, slots=slots, max_len=160),
        TorchEngineConfig(eager_steps=3, stream_interval=4, ignore_eos=True, hidden_store=store,
                          **cfg),  # type: ignore[arg-type]
        eos_id=assets.config.eos_id)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.close()


def request(assets: LmAssets, rid: str, text: str, seed: int, steps: int) -> TokenRequest:
    ids = assets.tokenizer.encode(f"[Stts][speed_5]{text}[Ptts]")
    return TokenRequest(request_id=rid, prompt_token_ids=tuple(ids), max_tokens=steps,
                        sampling=SamplingSettings(temperature=0.3, top_p=0.7, top_k=20,
                                                  seed=seed), want_hidden=True)


TEXTS = [("a", "hello world", 11, 40), ("b", "你好我们", 12, 23), ("c", "one two three", 13, 31),
         ("d", "good day to you all", 14, 17), ("e", "天气很好", 15, 29)]


async def run_all(engine: TorchCodeEngine, reqs: list[TokenRequest], *, release: bool
                  ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each request's codes and hidden states (read out of the store, as the
    decoder would, when the engine keeps one), each request joining once the one
    before it has its first step (prefill beside decode, compaction)."""
    started = [asyncio.Event() for _ in reqs]

    async def one(r: TokenRequest, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k:
            await started[k - 1].wait()
        codes: list[tuple[int, ...]] = []
        hidden: list[np.ndarray] = []
        async for delta in engine.generate(r):
            started[k].set()
            codes.extend(delta.codes)
            assert delta.hidden is not None
            h = np.asarray(delta.hidden)
            if engine.hidden_store is not None:
                assert h.dtype == np.int64 and h.ndim == 1  # indices, not states
                h = engine.hidden_store[torch.from_numpy(h)].numpy()
            hidden.append(h)
        if release:
            engine.release_hidden(r.request_id)
        return np.array(codes), np.concatenate(hidden)

    got = await asyncio.gather(*(one(r, k) for k, r in enumerate(reqs)))
    return {r.request_id: g for r, g in zip(reqs, got, strict=True)}


async def test_the_store_holds_what_the_host_copy_held(assets: LmAssets) -> None:
    """Five requests through two slots (chunked prefill, compaction, handles
    reused): every step's hidden state read from the store at the indices the
    engine handed over equals the one the host copy hands over, and the codes
    are the same."""
    reqs = [request(assets, rid, text, seed, steps) for rid, text, seed, steps in TEXTS]
    async with engine_of(assets, store=False, prefill_chunk=4) as engine:
        host = await run_all(engine, reqs, release=False)
    async with engine_of(assets, store=True, prefill_chunk=4) as engine:
        stored = await run_all(engine, reqs, release=True)
        assert engine.stats().requests_total == len(reqs)
        await wait_until_async(lambda: engine.store_rows_kept() == 0, "every store row released")
    for rid, _text, _seed, steps in TEXTS:
        (c1, h1), (c2, h2) = host[rid], stored[rid]
        assert c1.shape == (steps, 4)
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_allclose(h2, h1, atol=1e-6, rtol=0)


async def test_a_store_row_waits_for_its_consumer(assets: LmAssets) -> None:
    """With every store row held by a consumer that has not released it, the
    next request waits in the queue (its rows would overwrite steps a decoder
    may still read); one release lets it run."""
    async with engine_of(assets, store=True, slots=1, prefill_rows=1) as engine:
        rows = (1 + 1) * 2  # (slots + prefill rows) x 2 handles
        reqs = [request(assets, f"r{i}", "hello", 20 + i, 5) for i in range(rows + 1)]
        first = await run_all(engine, reqs[:rows], release=False)
        assert engine.store_rows_kept() == rows
        last = asyncio.create_task(run_all(engine, reqs[rows:], release=True))
        await wait_until_async(lambda: engine.stats().waiting == 1, "the last request queued")
        assert not last.done() and engine.stats().running == 0
        engine.release_hidden("r0")
        done = await asyncio.wait_for(last, 30)
        assert done[f"r{rows}"][0].shape == (5, 4)
        for r in reqs[1:rows]:
            engine.release_hidden(r.request_id)
        engine.release_hidden("r0")  # twice: a no-op
        await wait_until_async(lambda: engine.store_rows_kept() == 0, "every store row released")
    # what those held rows kept is what they were handed: nothing overwrote them
    assert all(len(h) == 5 for _, h in first.values())


def test_the_decoder_gathers_windows_from_the_store(tmp_path: Path) -> None:
    """The same windows as hidden states and as store indices give the same
    audio, eager and on (CPU-emulated) graphs, padding included."""
    root = write_tiny_decoder_assets(tmp_path, gpt_hidden=32, seed=4)
    mel, vocos, dims = load_audio_models(root)
    rng = np.random.default_rng(7)
    store = torch.from_numpy(rng.standard_normal((50, 32)).astype(np.float32))
    zero = 49
    store[zero] = 0
    picks = [rng.choice(49, size=n, replace=False) for n in (16, 11, 5)]
    for graphs in (False, True):
        kw = dict(graph_max_batch=4, graph_frame_buckets=(16, 24), graph_max_cells=96,
                  emulate_graphs=graphs)
        plain = ChatTTSWindowDecoder(mel, vocos, dims, "decoder", **kw)  # type: ignore[arg-type]
        plain.warm_up()
        gathered = ChatTTSWindowDecoder(mel, vocos, dims, "decoder", **kw)  # type: ignore[arg-type]
        gathered.attach_store(store, zero)
        gathered.warm_up()
        want = plain.decode([StepWindow(store[p].numpy(), 0) for p in picks])
        got = gathered.decode([StepWindow(p[:, None].astype(np.int64), 0) for p in picks])
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="decoder route"):
        ChatTTSWindowDecoder(mel, vocos, dims, "dvae").attach_store(store, zero)


async def test_a_voice_sounds_the_same_with_the_store(tmp_path: Path) -> None:
    """A segment synthesized by the voice with and without the store: the same
    samples (the same seed), and the store rows all released afterwards, a
    segment stopped early included."""
    write_tiny_chattts(tmp_path)

    async def speak(store: bool) -> np.ndarray:
        cfg = ChatTTSConfig(asset_dir=str(tmp_path), device="cpu", slots=2, max_len=256,
                            ignore_eos=True, seed=3, seeds=(1,), hidden_store=store)
        rt = await build_runtime(cfg)
        voice = rt.voice("seed_1")
        try:
            out = [c.samples async for c in voice.stream(
                SynthesisRequest(text="Hello world.", request_id="s1", first=True),
                max_steps=40)]
            gen = voice.stream(SynthesisRequest(text="Stopped early.", request_id="s2"),
                               max_steps=40)
            async with contextlib.aclosing(gen):
                await anext(gen)
            engine = rt.engine
            assert isinstance(engine, TorchCodeEngine)
            assert (engine.hidden_store is not None) == store
            await wait_until_async(lambda: engine.store_rows_kept() == 0,
                                   "every store row released")
        finally:
            await voice.close()
        return np.concatenate(out)

    host, stored = await speak(False), await speak(True)
    assert len(host) == 40 * 512
    np.testing.assert_allclose(stored, host, atol=1e-6, rtol=0)
