"""The batcher's first lane: a stream's first chunk decodes beside a long call
in flight instead of behind it (no GPU needed: decoders that block on events)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from rtserver.testing.wait import wait_until_async
from rtserver.vocoder.batcher import BatcherConfig, DecodeBatcher
from rtserver.voices.orpheus.snac_model import CodeWindow

F = 2048
GUARD_S = 10.0  # a hang fails the test instead of blocking the suite


def window(frames: int, start: int = 0, value: int = 0) -> CodeWindow:
    return CodeWindow(np.full((frames, 7), value, dtype=np.int64), start)


class GatedDecoder:
    """Decodes to each window's first code, after ``gate`` opens; logs its calls."""

    def __init__(self, gate: threading.Event | None = None, max_frames: int = 2,
                 max_windows: int = 4) -> None:
        self.gate = gate
        self.calls: list[list[int]] = []  # frames of each window, per call
        self.threads: set[str] = set()
        self.entered = threading.Event()  # a call has begun (and waits on the gate)
        self.max_frames, self.max_windows = max_frames, max_windows

    def fits(self, windows: int, frames: int) -> bool:
        return windows <= self.max_windows and frames <= self.max_frames

    def decode(self, windows: Sequence[CodeWindow]) -> list[np.ndarray]:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if self.gate is not None and not self.gate.wait(GUARD_S):
            raise TimeoutError("gate never opened")
        self.calls.append([int(w.codes.shape[0]) for w in windows])
        return [np.full(int(w.codes.shape[0]) * F, float(w.codes[0, 0]), dtype=np.float32)
                for w in windows]


async def test_first_chunk_is_answered_while_a_main_call_runs() -> None:
    gate = threading.Event()
    main, lane = GatedDecoder(gate), GatedDecoder()
    batcher = DecodeBatcher(main)
    await batcher.start()
    batcher.enable_first_lane(lane)
    try:
        long_call = asyncio.ensure_future(batcher.decode([window(16, value=5)]))
        # the main worker has taken it and its thread blocks on the gate
        await wait_until_async(main.entered.is_set, "the long call is in the decoder",
                               GUARD_S)
        first = await asyncio.wait_for(batcher.decode([window(1, value=7)], urgent=True),
                                       GUARD_S)
        assert not long_call.done()  # answered beside the call in flight, not after
        assert first[0].shape == (F,) and first[0][0] == 7.0
        gate.set()
        (audio,) = await asyncio.wait_for(long_call, GUARD_S)
        assert audio.shape == (16 * F,) and audio[0] == 5.0
    finally:
        gate.set()
        await batcher.close()
    assert lane.calls == [[1]] and main.calls == [[16]]
    assert main.threads.isdisjoint(lane.threads)
    assert batcher.stats.calls == 2 and batcher.stats.first_lane_calls == 1


async def test_first_chunks_of_one_tick_share_a_lane_call_within_its_shapes() -> None:
    main, lane = GatedDecoder(), GatedDecoder(max_windows=4)
    batcher = DecodeBatcher(main)
    await batcher.start()
    batcher.enable_first_lane(lane)
    try:
        firsts = [batcher.decode([window(1, value=i)], urgent=True) for i in range(6)]
        too_long = batcher.decode([window(3, value=9)], urgent=True)  # the lane has no graph
        results = await asyncio.wait_for(asyncio.gather(*firsts, too_long), GUARD_S)
    finally:
        await batcher.close()
    assert [r[0][0] for r in results] == [0, 1, 2, 3, 4, 5, 9]  # each its own audio
    assert lane.calls == [[1, 1, 1, 1], [1, 1]]  # batched, at most 4 windows a call
    assert main.calls == [[3]]


async def test_lane_failure_fails_only_its_windows_and_close_drains() -> None:
    class Broken(GatedDecoder):
        def decode(self, windows: Sequence[CodeWindow]) -> list[np.ndarray]:
            raise RuntimeError("CUDA error")

    batcher = DecodeBatcher(GatedDecoder(), BatcherConfig())
    await batcher.start()
    batcher.enable_first_lane(Broken())
    with pytest.raises(RuntimeError):
        batcher.enable_first_lane(GatedDecoder())  # once
    try:
        with pytest.raises(RuntimeError, match="CUDA error"):
            await batcher.decode([window(1)], urgent=True)
        (audio,) = await batcher.decode([window(4, value=3)])
        assert audio[0] == 3.0
    finally:
        await batcher.close()
    assert batcher.stats.failures == 1
    with pytest.raises(RuntimeError):
        await batcher.decode([window(1)], urgent=True)
