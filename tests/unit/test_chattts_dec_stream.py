"""ChatTTS streaming vocoder: the voice's API, input checks, batching across streams."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from rtserver.errors import EngineFailed
from rtserver.tools.layouts.chattts_decoder import write_tiny_decoder_assets
from rtserver.voices.chattts.decoder.config import DEEP_CHUNK_STEPS, ChatTTSDecodeConfig
from rtserver.voices.chattts.decoder.model import StepWindow
from rtserver.voices.chattts.decoder.stream import ChatTTSStream, ChatTTSVocoder

F = 512


def frozen() -> float:
    """A clock that never moves: a listener who never plays, so a stream
    decodes deep chunks exactly when it has sent one's worth (the same
    windows in every run, whatever the machine's speed)."""
    return 0.0


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_decoder_assets(tmp_path_factory.mktemp("chattts"), gpt_hidden=32, seed=4)


def steps(n: int, seed: int, width: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


async def run_stream(stream: ChatTTSStream, x: np.ndarray, pushes: tuple[int, ...]
                     ) -> np.ndarray:
    out: list[np.ndarray] = []
    pos, i = 0, 0
    while pos < len(x):
        n = pushes[i % len(pushes)]
        out += [c.samples for c in await stream.push(x[pos:pos + n])]
        pos, i = pos + n, i + 1
    out += [c.samples for c in await stream.finish()]
    return np.concatenate(out)


def test_streams_batched_together_equal_each_alone(root: Path) -> None:
    """Four streams at once (different lengths and push patterns) through one
    batcher: each stream's audio equals the same stream decoded alone."""
    xs = [steps(n, seed) for n, seed in ((70, 1), (45, 2), (90, 3), (20, 4))]
    patterns = [(1,), (3, 1), (7,), (1, 2)]

    async def together() -> tuple[list[np.ndarray], dict[int, int]]:
        vocoder = ChatTTSVocoder.load(root, clock=frozen)
        await vocoder.start()
        try:
            outs = await asyncio.gather(*(run_stream(vocoder.open_stream(), x, p)
                                          for x, p in zip(xs, patterns, strict=True)))
            return list(outs), vocoder.stats.call_sizes
        finally:
            await vocoder.close()

    async def alone(x: np.ndarray, p: tuple[int, ...]) -> np.ndarray:
        vocoder = ChatTTSVocoder.load(root, clock=frozen)
        await vocoder.start(warm_up=False)
        try:
            return await run_stream(vocoder.open_stream(), x, p)
        finally:
            await vocoder.close()

    outs, call_sizes = asyncio.run(together())
    assert max(call_sizes) > 1  # streams did share decoder calls
    for x, p, out in zip(xs, patterns, outs, strict=True):
        assert out.shape == (len(x) * F,)
        ref = asyncio.run(alone(x, p))
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * float(np.abs(ref).max()))


def test_window_decoder_batch_equals_alone(root: Path) -> None:
    vocoder = ChatTTSVocoder.load(root)
    windows = [StepWindow(steps(n, n), 0) for n in (3, 17, 1, 40)]
    batched = vocoder.decoder.decode(windows)
    for w, audio in zip(windows, batched, strict=True):
        alone = vocoder.decoder.decode([w])[0]
        assert audio.shape == (w.n_frames * F,)
        np.testing.assert_allclose(audio, alone, rtol=0, atol=2e-6 * float(np.abs(alone).max()))


def test_dvae_route_takes_codes(root: Path) -> None:
    codes = np.random.default_rng(0).integers(0, 625, (30, 4))

    async def go() -> np.ndarray:
        vocoder = ChatTTSVocoder.load(root, route="dvae")
        await vocoder.start()
        try:
            assert vocoder.route == "dvae" and vocoder.width == 4
            s = vocoder.open_stream()
            with pytest.raises(ValueError, match=r"codes must be in \[0, 625\)"):
                await s.push(np.full((1, 4), 625))
            return await run_stream(s, codes, (2,))
        finally:
            await vocoder.close()

    out = asyncio.run(go())
    full = ChatTTSVocoder.load(root, route="dvae").decoder.decode([StepWindow(codes, 0)])[0]
    assert out.shape == full.shape == (30 * F,)
    rms = float(np.sqrt(np.mean(full.astype(np.float64) ** 2)))
    assert rms > 0
    # the chunked stream is the full decode but near the first seam (see config)
    assert 20 * np.log10(float(np.abs(out - full).max()) / rms) <= -25.0


def test_bad_input_is_refused_and_the_stream_goes_on(root: Path) -> None:
    async def go() -> None:
        vocoder = ChatTTSVocoder.load(root)
        await vocoder.start(warm_up=False)
        try:
            s = vocoder.open_stream()
            with pytest.raises(ValueError, match=r"shape \(steps, 32\)"):
                await s.push(np.zeros((3, 31), np.float32))
            with pytest.raises(ValueError, match="must be floats"):
                await s.push(np.zeros((3, 32), np.int64))
            bad = steps(2, 0)
            bad[1, 3] = np.nan
            with pytest.raises(ValueError, match="NaN"):
                await s.push(bad)
            assert s.steps == 0
            # torch tensors are accepted too (the engine's hidden states)
            await s.push(torch.from_numpy(steps(20, 1)))
            tail = await s.finish()
            assert sum(len(c.samples) for c in tail) > 0 and s.closed
            with pytest.raises(RuntimeError, match="closed"):
                await s.push(steps(1, 2))
        finally:
            await vocoder.close()
        # a producer that vouches its hidden states are finite (the torch engine)
        # spares every push the check; shapes and dtypes are still checked
        vouching = ChatTTSVocoder.load(root, config=ChatTTSDecodeConfig(finite_input=True))
        await vouching.start(warm_up=False)
        try:
            vouched = vouching.open_stream()
            with pytest.raises(ValueError, match=r"shape \(steps, 32\)"):
                await vouched.push(np.zeros((3, 31), np.float32))
            await vouched.push(bad)
            assert vouched.steps == 2
            vouched.close()
        finally:
            await vouching.close()

    asyncio.run(go())


def test_close_drops_a_stream_without_touching_others(root: Path) -> None:
    async def go() -> None:
        vocoder = ChatTTSVocoder.load(root)
        await vocoder.start(warm_up=False)
        try:
            a, b = vocoder.open_stream(), vocoder.open_stream()
            await a.push(steps(10, 1))
            a.close()
            out = await run_stream(b, steps(25, 2), (4,))
            assert out.shape == (25 * F,)
        finally:
            await vocoder.close()

    asyncio.run(go())


def test_config_rejects_unknown_route_and_dummy_needs_no_files() -> None:
    with pytest.raises(ValueError, match="route"):
        ChatTTSDecodeConfig(route="snac")
    with pytest.raises(ValueError, match="folder"):
        ChatTTSVocoder.load(None)
    v = ChatTTSVocoder.load(None, dummy=True)  # the real shapes, random weights
    assert v.width == 768 and v.chunking.samples_per_frame == F


def test_non_finite_decoder_output_fails_that_stream_only(root: Path) -> None:
    async def go() -> None:
        vocoder = ChatTTSVocoder.load(root)
        await vocoder.start(warm_up=False)
        try:
            healthy, broken = vocoder.open_stream(), vocoder.open_stream()
            await healthy.push(steps(10, 1))
            with torch.no_grad():  # a weight gone bad: this decode returns NaN
                saved = vocoder.decoder.vocos.head.out.bias.clone()
                vocoder.decoder.vocos.head.out.bias.fill_(float("nan"))
            with pytest.raises(EngineFailed, match="NaN"):
                await broken.push(steps(40, 2))
            assert broken.closed and not healthy.closed
            with torch.no_grad():
                vocoder.decoder.vocos.head.out.bias.copy_(saved)
            out = await run_stream(healthy, steps(30, 3), (5,))
            assert np.all(np.isfinite(out)) and len(out) == 40 * F  # its 10 + 30 steps
        finally:
            await vocoder.close()

    asyncio.run(go())


def _emulated(root: Path) -> ChatTTSVocoder:
    """A vocoder whose decoder runs the CUDA-graph bookkeeping (buckets, static
    buffers, zero-length padding rows, the first lane) on the CPU."""
    from rtserver.voices.chattts.decoder.checkpoint import load_audio_models
    from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder

    cfg = ChatTTSDecodeConfig(graph_frame_buckets=(16, 24, 48, 104), graph_max_cells=512,
                              max_batch=8)
    mel, vocos, dims = load_audio_models(root)
    dec = ChatTTSWindowDecoder(mel, vocos, dims, "decoder", graph_max_batch=cfg.max_batch,
                               graph_frame_buckets=cfg.graph_frame_buckets,
                               graph_max_cells=cfg.graph_max_cells, emulate_graphs=True)
    return ChatTTSVocoder(dec, cfg, clock=frozen)


def test_graph_buckets_pad_exactly(root: Path) -> None:
    vocoder = _emulated(root)
    dec = vocoder.decoder
    assert dec.warm_up() == len(dec.graph_buckets()) > 0
    assert dec.fits(3, 20) and not dec.fits(9, 20) and not dec.fits(1, 105)
    eager = ChatTTSVocoder.load(root).decoder
    for sizes in ((3,), (17, 1, 40), (104, 2), (5,) * 6, (120,)):  # 120: past the buckets
        windows = [StepWindow(steps(n, i), 0) for i, n in enumerate(sizes)]
        for got, ref in zip(dec.decode(windows), eager.decode(windows), strict=True):
            np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * float(np.abs(ref).max()))


def test_a_call_runs_on_the_smallest_batch_bucket_that_holds_it(root: Path) -> None:
    """Graphs take the configured window counts (not only powers of two); a call
    runs on the smallest that holds it, equal to the eager decode; the lane keeps
    the counts up to its own size; every graph reads one shared input buffer."""
    from rtserver.voices.chattts.decoder.checkpoint import load_audio_models
    from rtserver.voices.chattts.decoder.model import ChatTTSWindowDecoder

    mel, vocos, dims = load_audio_models(root)
    dec = ChatTTSWindowDecoder(mel, vocos, dims, "decoder", graph_max_batch=8,
                               graph_frame_buckets=(16, 48), graph_max_cells=512,
                               graph_batch_buckets=(1, 3, 6, 12), emulate_graphs=True)
    assert dec.graph_buckets() == [(b, n) for b in (1, 3, 6, 8) for n in (16, 48)]
    assert dec.warm_up() == 8
    assert [dec._bucket(b, 20) for b in (1, 2, 3, 4, 5, 6, 7, 8, 9)] == [
        (1, 48), (3, 48), (3, 48), (6, 48), (6, 48), (6, 48), (8, 48), (8, 48), None]
    bases = {g.x.untyped_storage().data_ptr() for g in dec._graphs.values()}
    assert len(bases) == 1
    eager = ChatTTSVocoder.load(root).decoder
    for sizes in ((20, 3, 7, 11, 40), (16, 16), (9,) * 7):  # 5, 2 and 7 windows
        windows = [StepWindow(steps(n, i), 0) for i, n in enumerate(sizes)]
        for got, ref in zip(dec.decode(windows), eager.decode(windows), strict=True):
            np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * float(np.abs(ref).max()))
    # what the graphs computed: 6 x 48, 3 x 16 and 8 x 16 steps; then 2 x 60, eager
    assert dec.computed_steps == 6 * 48 + 3 * 16 + 8 * 16
    dec.decode([StepWindow(steps(n, 1), 0) for n in (60, 5)])
    assert dec.computed_steps == 6 * 48 + 3 * 16 + 8 * 16 + 2 * 60
    lane = ChatTTSWindowDecoder(mel, vocos, dims, "decoder", graph_max_batch=4,
                                graph_frame_buckets=(16,), graph_max_cells=64,
                                graph_batch_buckets=(1, 3, 6, 12), emulate_graphs=True)
    assert lane.graph_buckets() == [(1, 16), (3, 16), (4, 16)]


def test_first_lane_streams_equal_plain_streams(root: Path) -> None:
    """With the first lane on (first chunks on the lane's graphs and thread),
    every stream's audio equals the plain vocoder's."""
    xs = [steps(n, seed) for n, seed in ((40, 1), (30, 2), (55, 3))]

    async def go(vocoder: ChatTTSVocoder) -> list[np.ndarray]:
        await vocoder.start()
        try:
            return list(await asyncio.gather(*(run_stream(vocoder.open_stream(), x, (1,))
                                               for x in xs)))
        finally:
            await vocoder.close()

    emulated = _emulated(root)
    lane_outs = asyncio.run(go(emulated))
    assert emulated.stats.first_lane_calls >= 1
    plain = ChatTTSVocoder.load(root, clock=frozen)
    for out, ref in zip(lane_outs, asyncio.run(go(plain)), strict=True):
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * float(np.abs(ref).max()))


def test_a_stream_decodes_deep_chunks_only_while_its_listener_holds_one(root: Path) -> None:
    """Later decodes grow to ``deep_chunk_frames`` (63 steps) while the
    listener (playing since the stream's first audio) holds that much audio,
    and stay at 32 steps for a listener kept near the end of what it was
    sent; the audio is whole either way."""
    cfg = ChatTTSDecodeConfig(deep_chunk_frames=DEEP_CHUNK_STEPS)
    deep = cfg.deep_chunk_frames
    x = steps(300, 7)

    async def sizes(clock_of: Callable[[ChatTTSStream], float]) -> list[int]:
        stream: ChatTTSStream | None = None
        vocoder = ChatTTSVocoder.load(root, config=cfg, clock=lambda: clock_of(stream))
        await vocoder.start(warm_up=False)
        try:
            stream = vocoder.open_stream()
            out: list[int] = []  # samples of each chunk
            for i in range(len(x)):
                out += [len(c.samples) for c in await stream.push(x[i:i + 1])]
            tail = await stream.finish()
            assert sum(out) + sum(len(c.samples) for c in tail) == len(x) * F
            return [n // F for n in out[1:]]  # later chunks, in steps
        finally:
            await vocoder.close()

    # never plays: it holds everything sent
    assert asyncio.run(sizes(lambda s: 0.0)).count(deep) >= 2

    # plays all but 0.5 s of what it was sent: never a deep chunk's worth
    def near_the_end(s: ChatTTSStream | None) -> float:
        sent = 0.0 if s is None else s.emitted_samples / 24000
        return sent - 0.5
    got = asyncio.run(sizes(near_the_end))
    assert max(got) == cfg.max_chunk_frames and got.count(cfg.max_chunk_frames) >= 4


@pytest.mark.parametrize(("held_s", "deep_chunks"), [(None, False), (0.5, False), (5.0, True)])
def test_audio_the_listener_holds_before_a_segment_counts_for_deep_chunks(
        root: Path, held_s: float | None, deep_chunks: bool) -> None:
    """A later segment whose listener still holds audio from the segments
    before it (``held_s``, from the request's deadline) takes deep chunks
    from its second decode on when that covers one, though the segment itself
    is generated at real time (here: one step of audio per step of clock),
    which alone never builds a deep chunk's worth (and uses up what it held:
    3 s would be down to 1.3 s when the first deep chunk is due)."""
    cfg = ChatTTSDecodeConfig(deep_chunk_frames=DEEP_CHUNK_STEPS)
    x = steps(200, 9)
    now = [0.0]

    async def later_chunks() -> list[int]:
        vocoder = ChatTTSVocoder.load(root, config=cfg, clock=lambda: now[0])
        await vocoder.start(warm_up=False)
        try:
            stream = vocoder.open_stream(held_s=held_s)
            out: list[int] = []
            for i in range(len(x)):
                now[0] = i * F / 24000
                out += [len(c.samples) for c in await stream.push(x[i:i + 1])]
            out += [len(c.samples) for c in await stream.finish()]
            assert sum(out) == len(x) * F
            return [n // F for n in out[1:-1]]
        finally:
            await vocoder.close()

    got = asyncio.run(later_chunks())
    if deep_chunks:
        assert got[0] == cfg.deep_chunk_frames and got.count(cfg.deep_chunk_frames) >= 2
    else:
        assert max(got) == cfg.max_chunk_frames
