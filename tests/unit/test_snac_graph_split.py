"""A SNAC decoder call too big for one CUDA graph runs as several graph replays
of at most the graph's rows, never as an eager call, and gives the audio one
call gives. The graphs need CUDA, so on the CPU the replay is stood in for by
an eager decoder of the same weights (what a replay computes), and the eager
forward of the decoder under test is made to fail."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from rtserver.tools.measure.snac import random_codes
from rtserver.voices.orpheus.snac_model import CodeWindow, SnacDecoder
from rtserver.voices.orpheus.snac_net import TINY_SNAC_CONFIG, build_snac

CELLS = 512  # SnacDecoder's default graph_max_cells


def _windows(lengths: Sequence[int]) -> list[CodeWindow]:
    return [CodeWindow(random_codes(n, seed=i), start_frame=5 * i)
            for i, n in enumerate(lengths)]


@pytest.fixture
def graphed(monkeypatch: pytest.MonkeyPatch) -> tuple[SnacDecoder, list[tuple[int, int, int]]]:
    """A CPU decoder whose graph path is on, each replay recorded as (bucket
    rows, bucket frames, windows) and computed by an eager twin."""
    dec = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0), graph_max_cells=CELLS)
    twin = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0))
    dec._use_graphs = True
    replays: list[tuple[int, int, int]] = []

    def graph_for(lane: Any, b: int, n: int) -> tuple[int, int] | None:
        return dec._bucket(b, n)

    def replay(lane: Any, graph: tuple[int, int], windows: Sequence[CodeWindow]
               ) -> list[np.ndarray]:
        replays.append((*graph, len(windows)))
        return twin.decode(windows)

    def no_eager(*args: Any) -> Any:
        raise AssertionError("an eager forward where graphs cover the call")

    monkeypatch.setattr(dec, "_graph_for", graph_for)
    monkeypatch.setattr(dec, "_replay", replay)
    monkeypatch.setattr(dec, "_forward", no_eager)
    return dec, replays


def test_a_call_too_big_for_one_graph_replays_several(
        graphed: tuple[SnacDecoder, list[tuple[int, int, int]]]) -> None:
    dec, replays = graphed
    # 20 windows of 22 frames: one graph would be 32 x 24 cells, over 512
    lengths = [22] * 12 + [21] * 5 + [9] * 3
    windows = _windows(lengths)
    audio = dec.decode(windows)
    assert [w for _, _, w in replays] == [16, 4]
    for rows, frames, n in replays:
        assert n <= rows and rows * frames <= CELLS
    assert replays[1][1] == 24  # the second part's longest window is 21 frames
    eager = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0))
    ref = eager.decode(windows)
    assert [a.shape for a in audio] == [r.shape for r in ref]
    for a, r in zip(audio, ref, strict=True):
        np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5)


def test_a_call_that_fits_one_graph_is_one_replay(
        graphed: tuple[SnacDecoder, list[tuple[int, int, int]]]) -> None:
    dec, replays = graphed
    dec.decode(_windows([16] * 9))
    assert replays == [(16, 16, 9)]


def test_windows_longer_than_any_graph_still_decode_eagerly(
        graphed: tuple[SnacDecoder, list[tuple[int, int, int]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    dec, replays = graphed
    monkeypatch.undo()  # the real eager forward; graphs stay on
    dec._use_graphs = True
    audio = dec.decode(_windows([30, 12]))
    assert replays == []
    assert [a.shape[0] for a in audio] == [30 * dec.samples_per_frame,
                                           12 * dec.samples_per_frame]


def test_a_call_replays_the_smallest_configured_count_that_holds_it() -> None:
    """With ``graph_batch_buckets`` a call of 9 windows of 22 frames replays the
    10-row graph, not the 16-row one (powers of two), and 23 replays the most
    rows a 24-frame graph holds under the cells bound, then the rest."""
    counts = (1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)
    dec = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0), graph_max_cells=CELLS,
                      graph_batch_buckets=counts)
    assert [dec._bucket(b, 22) for b in (1, 3, 9, 11, 17, 20)] == [
        (1, 24), (4, 24), (10, 24), (12, 24), (20, 24), (20, 24)]
    assert dec._bucket(21, 22) is None  # 24 x 24 cells: over 512
    assert dec._graph_rows(22) == 20 and dec._graph_rows(8) == 64
    assert all(b in counts and b * n <= CELLS for b, n in dec.graph_buckets())
    powers = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0), graph_max_cells=CELLS)
    assert powers._bucket(9, 22) == (16, 24) and powers._graph_rows(22) == 16


def test_the_vocoder_config_gives_its_counts_to_the_decoder() -> None:
    from rtserver.vocoder.config import VocoderConfig
    from rtserver.voices.orpheus.snac_stream import SnacVocoder

    config = VocoderConfig(graph_batch_buckets=(1, 3, 5))
    vocoder = SnacVocoder.load(None, dummy=True, config=config)
    assert [b for b, n in vocoder.decoder.graph_buckets() if n == 1] == [1, 3, 5, 64]
    default = SnacVocoder.load(None, dummy=True).decoder
    assert default._bucket(9, 22) == (10, 24)
    with pytest.raises(ValueError, match="graph_batch_buckets"):
        VocoderConfig(graph_batch_buckets=(0, 4))


def test_every_count_up_to_a_max_batch_off_the_powers_of_two_has_a_bucket() -> None:
    dec = SnacDecoder(build_snac(TINY_SNAC_CONFIG, seed=0), graph_max_batch=48,
                      graph_max_cells=4096)
    assert [dec._bucket(b, 4) for b in (33, 40, 48, 49)] == [(48, 4), (48, 4), (48, 4), None]
