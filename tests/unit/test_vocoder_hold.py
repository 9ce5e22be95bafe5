"""The batcher's hold: later chunks wait briefly for company so a GPU decoder
runs fewer, larger calls; first chunks and full batches never wait."""

from __future__ import annotations

import asyncio
import time

import pytest

from rtserver.vocoder.batcher import BatcherConfig, DecodeBatcher
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
