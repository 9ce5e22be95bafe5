"""The batcher's hold: later chunks wait briefly for company so a GPU decoder
runs fewer, larger calls; first chunks and full batches never wait."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

from rtserver.testing.wait import wait_until_async
from rtserver.vocoder.batcher import BatcherConfig, DecodeBatcher
from rtserver.vocoder.chunking import ChunkConfig
from rtserver.vocoder.planned_stream import PlannedStream
from rtserver.voices.orpheus.snac_model import CodeWindow
from tests.unit.test_vocoder_first_lane import GatedDecoder, window

GUARD_S = 10.0


async def _started(cfg: BatcherConfig) -> tuple[GatedDecoder, DecodeBatcher[CodeWindow]]:
    dec = GatedDecoder()
    batcher = DecodeBatcher(dec, cfg)
    await batcher.start()
    return dec, batcher


async def test_windows_pushed_apart_within_the_hold_share_one_call() -> None:
    dec, batcher = await _started(BatcherConfig(hold_s=1.0, max_batch=3))
    try:
        first = asyncio.ensure_future(batcher.decode([window(2, value=1)], may_wait=True))
        for _ in range(5):  # several loop turns: without a hold the first would go alone
            await asyncio.sleep(0)
        assert dec.calls == []  # held, not decoded
        rest = [asyncio.ensure_future(batcher.decode([window(2, value=v)], may_wait=True))
                for v in (2, 3)]
        # the third window fills max_batch: decoded at once, long before the 1 s hold
        out = await asyncio.wait_for(asyncio.gather(first, *rest), 0.9)
        assert [float(o[0][0]) for o in out] == [1.0, 2.0, 3.0]
        assert dec.calls == [[2, 2, 2]]  # one call
    finally:
        await batcher.close()


async def test_a_lone_window_waits_out_the_hold_then_decodes() -> None:
    hold = 0.05
    dec, batcher = await _started(BatcherConfig(hold_s=hold))
    try:
        t0 = time.perf_counter()
        out = await asyncio.wait_for(batcher.decode([window(2, value=4)], may_wait=True), GUARD_S)
        waited = time.perf_counter() - t0
        assert float(out[0][0]) == 4.0
        assert waited >= hold * 0.9  # it was held (the loop's timer may round down a bit)
        assert dec.calls == [[2]]
    finally:
        await batcher.close()


async def test_a_first_chunk_is_never_held() -> None:
    _dec, batcher = await _started(BatcherConfig(hold_s=1.0))
    try:
        later = asyncio.ensure_future(batcher.decode([window(4, value=1)], may_wait=True))
        await asyncio.sleep(0)
        first = await asyncio.wait_for(batcher.decode([window(1, value=9)], urgent=True), 0.9)
        assert float(first[0][0]) == 9.0
        # the held window went with it (the urgent one opens the gate for the queue)
        assert float((await asyncio.wait_for(later, 0.9))[0][0]) == 1.0
    finally:
        await batcher.close()


async def test_close_decodes_what_is_held_at_once() -> None:
    _dec, batcher = await _started(BatcherConfig(hold_s=1.0))
    pending = asyncio.ensure_future(batcher.decode([window(3, value=6)], may_wait=True))
    await asyncio.sleep(0)
    await asyncio.wait_for(batcher.close(), 0.9)
    assert float((await pending)[0][0]) == 6.0


def test_hold_is_bounded() -> None:
    with pytest.raises(ValueError, match="hold_s"):
        BatcherConfig(hold_s=2.0)
    with pytest.raises(ValueError, match="hold_s"):
        BatcherConfig(hold_s=-0.1)


async def test_a_window_that_may_not_wait_takes_the_held_ones_along() -> None:
    dec, batcher = await _started(BatcherConfig(hold_s=1.0))
    try:
        held = asyncio.ensure_future(batcher.decode([window(2, value=1)], may_wait=True))
        for _ in range(5):
            await asyncio.sleep(0)
        assert dec.calls == []
        # an early chunk of another stream (little audio queued ahead): not held
        now = await asyncio.wait_for(batcher.decode([window(2, value=2)]), 0.9)
        assert float(now[0][0]) == 2.0
        assert float((await asyncio.wait_for(held, 0.9))[0][0]) == 1.0
        assert dec.calls == [[2, 2]]
    finally:
        await batcher.close()


def test_device_defaults_hold_on_cuda_only_and_keep_what_is_set() -> None:
    from rtserver.vocoder.batcher import device_batcher_config

    def cfg(cuda: bool, pad: float, hold: float) -> BatcherConfig:
        return device_batcher_config(cuda, max_batch=8, max_batch_frames=64,
                                     max_pad_fraction=pad, hold_s=hold)

    assert (cfg(True, -1, -1).max_pad_fraction, cfg(True, -1, -1).hold_s) == (4.0, 0.04)
    assert (cfg(False, -1, -1).max_pad_fraction, cfg(False, -1, -1).hold_s) == (0.25, 0.0)
    assert (cfg(True, 0.5, 0.0).max_pad_fraction, cfg(True, 0.5, 0.0).hold_s) == (0.5, 0.0)


async def test_a_stream_about_to_run_dry_is_not_held() -> None:
    """A window whose stream's listener would run out of audio within the
    margin is decoded at once, however long the hold."""
    dec, batcher = await _started(BatcherConfig(hold_s=1.0, hold_margin_s=0.1))
    try:
        out = await asyncio.wait_for(batcher.decode(
            [window(2, value=5)], may_wait=True, deadline=batcher.clock() + 0.05), 0.5)
        assert float(out[0][0]) == 5.0 and dec.calls == [[2]]
    finally:
        await batcher.close()


async def test_a_held_window_goes_by_its_deadline_less_the_margin() -> None:
    """Deep enough for some hold but not for all of it: held until its deadline
    less the margin, not for the whole hold."""
    _dec, batcher = await _started(BatcherConfig(hold_s=1.0, hold_margin_s=0.02))
    try:
        t0 = batcher.clock()
        out = await asyncio.wait_for(batcher.decode(
            [window(2, value=7)], may_wait=True, deadline=t0 + 0.1), 0.9)
        waited = batcher.clock() - t0
        assert float(out[0][0]) == 7.0
        assert 0.08 * 0.9 <= waited < 0.9  # ~80 ms: held, and let go before the hold's 1 s
    finally:
        await batcher.close()


class _Recorder:
    """A batcher as a stream sees it: records each decode's deadline, answers
    each window with its frames' samples at once, on a clock the test sets."""

    def __init__(self, spf: int) -> None:
        self.now = 100.0
        self.spf = spf
        self.deadlines: list[float | None] = []

    def clock(self) -> float:
        return self.now

    async def decode(self, windows: list[Any], *, urgent: bool = False,
                     may_wait: bool = False, deadline: float | None = None) -> list[Any]:
        self.deadlines.append(deadline)
        return [np.zeros(w.n_frames * self.spf, dtype=np.float32) for w in windows]


async def test_a_streams_deadline_is_its_first_audio_plus_what_it_emitted() -> None:
    """The deadline a stream gives the batcher: when a listener who started at
    its first audio would have heard every sample it emitted so far."""
    from rtserver.vocoder.chunking import ChunkConfig
    from rtserver.vocoder.planned_stream import PlannedStream
    from rtserver.voices.orpheus.snac_model import CodeWindow as Win

    class Stream(PlannedStream[Win]):
        __slots__ = ()

        def _check(self, x: Any) -> Any:
            return np.asarray(x, dtype=np.int64)

        def _window(self, frames: Any, start_frame: int) -> Win:
            return Win(frames, start_frame)

    spf, rate = 100, 1000
    rec = _Recorder(spf)
    cfg = ChunkConfig(samples_per_frame=spf, first_frames=1, growth=1.0, max_chunk_frames=1,
                      context_samples=0, first_lookahead_samples=0, lookahead_samples=0,
                      crossfade_samples=0)
    stream = Stream(rec, cfg, samples_per_frame=spf, sample_rate=rate,  # type: ignore[arg-type]
                    width=7, dtype=np.int64)
    emitted = 0
    first_at = None
    for k in range(4):
        chunks = await stream.push(np.zeros((1, 7), dtype=np.int64))
        if k == 0:
            assert rec.deadlines == [None]  # nothing out yet: no deadline
            first_at = rec.now
        else:
            assert first_at is not None
            assert rec.deadlines[-1] == pytest.approx(first_at + emitted / rate)
        emitted += sum(len(c.samples) for c in chunks)
        rec.now += 0.03
    assert emitted == 4 * spf


class _RecordingBatcher:
    """The batcher's ``decode`` as a stream calls it: records each call's
    urgency, may-wait and deadline, and decodes every window to zeros."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[tuple[bool, bool, float | None]] = []

    def clock(self) -> float:
        return self.now

    async def decode(self, windows: Any, *, urgent: bool = False, may_wait: bool = False,
                     deadline: float | None = None) -> list[np.ndarray]:
        self.calls.append((urgent, may_wait, deadline))
        return [np.zeros(w.n_frames * 2048, np.float32) for w in windows]


class _Frames(PlannedStream[CodeWindow]):
    def _check(self, x: Any) -> np.ndarray:
        return np.asarray(x, dtype=np.int64)

    def _window(self, frames: np.ndarray, start_frame: int) -> CodeWindow:
        return CodeWindow(frames, start_frame)


@pytest.mark.parametrize(("held_s", "first_urgent"), [(None, True), (0.3, True), (2.0, False)])
def test_a_segment_whose_listener_holds_audio_is_not_urgent(held_s: float | None,
                                                             first_urgent: bool) -> None:
    """A context's later segment whose listener still holds HOLD_AFTER_S of
    earlier audio leaves the first lane to contexts' first audio: its first
    decode is neither urgent nor unholdable, and its deadline is when that
    audio runs out; without it (or with less) the first decode is urgent."""
    batcher = _RecordingBatcher()
    stream = _Frames(batcher, ChunkConfig(), samples_per_frame=2048,  # type: ignore[arg-type]
                     sample_rate=24000, width=7, dtype=np.int64, held_s=held_s)

    async def go() -> None:
        for _ in range(6):
            await stream.push(np.zeros((1, 7), np.int64))
            batcher.now += 2048 / 24000  # generated at real time

    asyncio.run(go())
    urgent, may_wait, deadline = batcher.calls[0]
    assert urgent == first_urgent and may_wait == (not first_urgent)
    if held_s is None:
        assert deadline is None  # nothing known of the listener yet
    else:
        assert deadline == pytest.approx(held_s)  # its earlier audio runs out then
    assert not any(u for u, _, _ in batcher.calls[1:])  # later decodes never are


async def _queued_behind_a_call(order: str) -> list[list[int]]:
    """One call in the decoder, then three windows queued, in arrival order:
    5 s of audio left (3 frames), 1 s left (2 frames), no deadline (1 frame);
    the frames of each call the decoder then made."""
    gate = threading.Event()
    dec = GatedDecoder(gate)
    batcher = DecodeBatcher(dec, BatcherConfig(max_batch=1, order=order))
    await batcher.start()
    try:
        busy = asyncio.ensure_future(batcher.decode([window(4, value=4)]))
        await wait_until_async(dec.entered.is_set, "the first call is in the decoder", GUARD_S)
        now = batcher.clock()
        queued = [asyncio.ensure_future(batcher.decode([window(frames, value=frames)],
                                                       deadline=deadline))
                  for frames, deadline in ((3, now + 5.0), (2, now + 1.0), (1, None))]
        for _ in range(5):
            await asyncio.sleep(0)
        gate.set()
        out = await asyncio.wait_for(asyncio.gather(busy, *queued), GUARD_S)
        assert [float(o[0][0]) for o in out] == [4.0, 3.0, 2.0, 1.0]  # each its own audio
        return dec.calls
    finally:
        gate.set()
        await batcher.close()


async def test_a_busy_decoder_takes_queued_windows_in_arrival_order() -> None:
    assert await _queued_behind_a_call("arrival") == [[4], [3], [2], [1]]


async def test_deadline_order_takes_the_stream_nearest_an_underrun_next() -> None:
    # no deadline counts as now: before the stream 1 s from running dry
    assert await _queued_behind_a_call("deadline") == [[4], [1], [2], [3]]


def test_the_queue_order_is_checked_and_reaches_the_batcher() -> None:
    from rtserver.vocoder.config import VocoderConfig

    with pytest.raises(ValueError, match="order"):
        BatcherConfig(order="lifo")
    with pytest.raises(ValueError, match="queue_order"):
        VocoderConfig(queue_order="lifo")
    assert VocoderConfig().batcher_config("cuda").order == "arrival"
    assert VocoderConfig(queue_order="deadline").batcher_config("cpu").order == "deadline"


async def _speak_together(order: str, streams: int, frames: int) -> list[np.ndarray]:
    """Each of ``streams`` SNAC streams (the tiny checkpoint) pushed a frame at a
    time, all at once through one batcher in ``order``; each stream's audio."""
    from rtserver.tools.measure.snac import random_codes
    from rtserver.vocoder.config import VocoderConfig
    from rtserver.voices.orpheus.snac_model import SnacDecoder
    from rtserver.voices.orpheus.snac_net import TINY_SNAC_CONFIG, build_snac
    from rtserver.voices.orpheus.snac_stream import SnacVocoder

    vocoder = SnacVocoder(SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=1)),
                          VocoderConfig(queue_order=order, max_batch=3))
    await vocoder.start(warm_up=False)
    try:
        async def one(k: int) -> np.ndarray:
            codes = random_codes(frames, seed=k)
            stream = vocoder.open_stream(first=True)
            out = [c.samples for i in range(frames) for c in await stream.push(codes[i:i + 1])]
            out += [c.samples for c in await stream.finish()]
            return np.concatenate(out)

        return list(await asyncio.wait_for(
            asyncio.gather(*(one(k) for k in range(streams))), GUARD_S * 3))
    finally:
        await vocoder.close()


async def test_the_queue_order_changes_when_audio_comes_never_what_it_is() -> None:
    arrival = await _speak_together("arrival", streams=6, frames=12)
    deadline = await _speak_together("deadline", streams=6, frames=12)
    assert [len(a) for a in arrival] == [12 * 2048] * 6
    # equal to batching's rounding: which windows share a call follows the threads'
    # timing, and a window decoded in a batch is ~5e-7 from itself alone on the
    # tiny checkpoint (the bound test_snac_seams' batched-equals-unbatched uses);
    # two streams' audio differ by ~0.3
    for a, d in zip(arrival, deadline, strict=True):
        np.testing.assert_allclose(a, d, atol=1e-5)
