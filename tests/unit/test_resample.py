"""The streaming resampler: chunked output equals one-shot output, lengths,
fidelity, and how little it holds back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserver.audio.resample import Resampler, output_after_chunks


def _sine(rate: int, n: int, hz: float) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(n) / rate)).astype(np.float32)


def _stream(r: Resampler, x: np.ndarray, sizes: list[int]) -> np.ndarray:
    out, i = [], 0
    for size in sizes:
        out.append(r.process(x[i:i + size]))
        i += size
    out.append(r.process(x[i:]))
    out.append(r.flush())
    return np.concatenate(out)


@pytest.mark.parametrize("out_rate", [48000, 16000])
@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 4000), min_size=0, max_size=40))
def test_random_chunks_match_one_shot(out_rate: int, sizes: list[int]) -> None:
    in_rate = 22050
    x = _sine(in_rate, in_rate, 440.0)  # 1 s
    chunked = _stream(Resampler(in_rate, out_rate), x, sizes)
    whole = _stream(Resampler(in_rate, out_rate), x, [])
    assert chunked.dtype == np.float32
    assert len(chunked) == len(whole)
    np.testing.assert_array_equal(chunked, whole)
    assert abs(len(whole) - round(len(x) * out_rate / in_rate)) <= 1


@pytest.mark.parametrize(("in_rate", "out_rate"),
                         [(22050, 48000), (22050, 16000), (24000, 48000), (24000, 8000)])
@pytest.mark.parametrize("hz", [440.0, 3000.0])
def test_length_and_fidelity_against_the_ideal_sine(in_rate: int, out_rate: int,
                                                    hz: float) -> None:
    n = in_rate * 2
    rng = np.random.default_rng(1)
    sizes = [int(s) for s in rng.integers(1, 3000, size=200)]
    y = _stream(Resampler(in_rate, out_rate), _sine(in_rate, n, hz), sizes)
    assert abs(len(y) - n * out_rate / in_rate) <= 2
    ideal = _sine(out_rate, len(y), hz)
    edge = out_rate // 20  # the filter's start/end transients (50 ms)
    err = y[edge:-edge] - ideal[edge:-edge]
    snr = 10 * np.log10(np.sum(ideal[edge:-edge] ** 2) / np.sum(err ** 2))
    assert snr > 110.0  # measured 123-137 dB (resample.FILTER); s16 PCM carries 96 dB


def test_equal_rates_pass_through() -> None:
    r = Resampler(24000, 24000)
    x = _sine(24000, 1000, 440.0)
    assert r.passthrough
    np.testing.assert_array_equal(r.process(x), x)
    assert len(r.flush()) == 0


def test_use_after_flush_and_bad_arguments_raise() -> None:
    r = Resampler(22050, 48000)
    r.process(np.zeros(100, dtype=np.float32))
    r.flush()
    with pytest.raises(RuntimeError):
        r.process(np.zeros(10, dtype=np.float32))
    with pytest.raises(RuntimeError):
        r.flush()
    with pytest.raises(ValueError):
        Resampler(0, 48000)
    with pytest.raises(ValueError):
        Resampler(22050, 48000).process(np.zeros((2, 10), dtype=np.float32))


def test_float64_input_is_accepted_as_float32() -> None:
    x = _sine(22050, 2205, 440.0).astype(np.float64)
    r = Resampler(22050, 48000)
    y = np.concatenate([r.process(x), r.flush()])
    assert y.dtype == np.float32 and abs(len(y) - 4800) <= 2


@pytest.mark.parametrize("out_rate", [48000, 24000, 22050, 16000])
def test_output_after_chunks_is_what_a_resampler_returns(out_rate: int) -> None:
    # Piper's first chunks at 22050 Hz, in samples; speech-like content: the
    # hold-back depends on the sizes only
    sizes = (2410, 10240, 20480, 33280)
    x = _sine(22050, sum(sizes), 220.0)
    r = Resampler(22050, out_rate)
    got, i = [], 0
    for n in sizes:
        got.append((got[-1] if got else 0) + len(r.process(x[i:i + n])))
        i += n
    assert output_after_chunks(22050, out_rate, sizes) == tuple(got)
    if out_rate == 22050:
        assert got == [2410, 12650, 33130, 66410]
    with pytest.raises(ValueError):
        output_after_chunks(22050, out_rate, (10, -1))


@pytest.mark.parametrize("out_rate", [48000, 24000, 16000, 8000])
@pytest.mark.parametrize("in_rate", [22050, 24000])
def test_little_audio_is_held_back(in_rate: int, out_rate: int) -> None:
    # Held-back audio is not sent, so no listener can hear it: at most half
    # the filter (64 taps at the lower rate: 1.5 ms at 22050 -> 48000, 4 ms
    # down to 8000), whatever the chunk sizes (libsoxr HQ held 6-37 ms at
    # 22050 -> 48000), for Piper's (22050 Hz) and SNAC's (24000 Hz) chunks.
    if in_rate == out_rate:
        return
    sizes = tuple(round(ms * in_rate / 1000) for ms in (20, 109.3, 464.4, 928.8, 1509.3))
    sent = output_after_chunks(in_rate, out_rate, sizes)
    total = 0
    for n, out in zip(sizes, sent, strict=True):
        total += n
        held_ms = 1000.0 * (total / in_rate - out / out_rate)
        assert 0.0 <= held_ms <= 1000.0 * 34 / min(in_rate, out_rate), (n, held_ms)
