"""Framers: Opus (decoded back with libopus) and PCM s16le."""

from __future__ import annotations

import math

import numpy as np
import opuslib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rtserver.audio.framer import FRAME_MS, SAMPLE_RATES, Framer, PcmS16Framer
from rtserver.audio.opus import OPUS_RATE, OpusConfig, OpusFramer


def speechlike(rate: int, seconds: float) -> np.ndarray:
    """Voiced speech stand-in: harmonics of a 120 Hz pitch with vibrato,
    stronger in the formant range, under a 4 syllables/s envelope."""
    n = int(rate * seconds)
    t = np.arange(n) / rate
    f0 = 120.0 * (1 + 0.08 * np.sin(2 * np.pi * 1.3 * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = np.zeros(n)
    for k in range(1, 40):
        if k * 120 * 1.1 > 0.45 * rate:
            break
        x += np.sin(k * phase + k) / k * (1.0 if 300 < k * 120 < 3500 else 0.5)
    x *= np.sin(np.pi * 4 * t) ** 2
    return (0.4 * x / np.max(np.abs(x))).astype(np.float32)


def decode(frames: list[bytes], rate: int, frame_samples: int) -> np.ndarray:
    decoder = opuslib.Decoder(rate, 1)
    out = []
    for packet in frames:
        pcm = np.frombuffer(decoder.decode_float(packet, frame_samples), dtype=np.float32)
        assert len(pcm) == frame_samples  # every packet is one whole frame
        out.append(pcm)
    return np.concatenate(out)


def snr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2)))


def lag_samples(ref: np.ndarray, got: np.ndarray, span: int = 10) -> int:
    """Shift s maximizing sum(ref[i] * got[i + s]) over the middle half."""
    m, w = len(ref) // 4, len(ref) // 2
    scores = [float(np.dot(ref[m:m + w], got[m + s:m + s + w])) for s in range(-span, span + 1)]
    return int(np.argmax(scores)) - span


def push_in_pieces(framer: Framer, x: np.ndarray, sizes: list[int]) -> list[bytes]:
    frames: list[bytes] = []
    i = 0
    for size in sizes:
        frames += framer.push(x[i:i + size])
        i += size
    frames += framer.push(x[i:])
    return frames + framer.finish()


# SNR floors (dB): measured 24.2-30.1 where libopus codes SILK alone (rates up
# to 16 kHz) and 11.6-11.9 in hybrid mode (SILK + CELT above 8 kHz, 24/48 kHz),
# whose noise shaping trades waveform SNR for perceived quality.
SNR_FLOOR = {8000: 20.0, 12000: 20.0, 16000: 20.0, 24000: 8.0, 48000: 8.0}


@pytest.mark.parametrize("rate", SAMPLE_RATES)
@pytest.mark.parametrize("frame_ms", FRAME_MS)
def test_opus_decodes_back_aligned_complete_and_close(rate: int, frame_ms: int) -> None:
    x = speechlike(rate, 1.0)
    framer = OpusFramer(rate, frame_ms)
    n_frame = framer.frame_samples
    assert n_frame == rate * frame_ms // 1000
    assert framer.pre_skip == framer.lookahead * OPUS_RATE // rate
    rng = np.random.default_rng(rate + frame_ms)
    frames = push_in_pieces(framer, x, [int(s) for s in rng.integers(1, 2 * n_frame, 30)])
    assert len(frames) == framer.frames_out == math.ceil((len(x) + framer.lookahead) / n_frame)
    skip = round(framer.pre_skip * rate / OPUS_RATE)  # what a client drops (RFC 7845)
    y = decode(frames, rate, n_frame)[skip:]
    assert len(y) >= len(x)  # nothing lost at the end
    y = y[:len(x)]
    assert abs(lag_samples(x, y)) <= 2
    assert snr_db(x, y) > SNR_FLOOR[rate]
    tail = slice(len(x) - rate // 20, len(x))  # the last 50 ms came through too
    assert snr_db(x[tail], y[tail]) > SNR_FLOOR[rate] - 3.0


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(0, 1500), max_size=30))
def test_odd_pushes_give_the_same_bytes_as_one_push(sizes: list[int]) -> None:
    x = speechlike(48000, 0.5)
    one = OpusFramer(48000, 20)
    whole = one.push(x) + one.finish()
    assert push_in_pieces(OpusFramer(48000, 20), x, sizes) == whole


def test_push_returns_only_complete_frames_and_carries_the_rest() -> None:
    framer = OpusFramer(16000, 20)  # 320 samples a frame
    x = speechlike(16000, 0.1)
    assert framer.push(x[:319]) == []
    assert len(framer.push(x[319:321])) == 1  # 321 samples in: one frame, 1 carried
    assert len(framer.push(x[321:641])) == 1
    assert framer.frames_out == 2 and framer.samples_in == 641


def test_bitrate_and_complexity_reach_the_encoder() -> None:
    x = speechlike(48000, 1.0)
    sizes = {}
    for bitrate in (16000, 64000):
        framer = OpusFramer(48000, 20, bitrate=bitrate, complexity=0)
        sizes[bitrate] = sum(len(p) for p in framer.push(x) + framer.finish())
    seconds = 51 * 0.02
    for bitrate, total in sizes.items():  # VBR lands near the target
        assert 0.6 * bitrate < total * 8 / seconds < 1.3 * bitrate
    custom = OpusFramer(48000, 20, config=OpusConfig(bitrate=16000, complexity=0))
    assert sum(len(p) for p in custom.push(x) + custom.finish()) == pytest.approx(
        sizes[16000], rel=0.2)


def test_finish_ends_the_framer_and_nothing_in_gives_nothing_out() -> None:
    framer = OpusFramer(48000, 20)
    assert framer.finish() == []
    with pytest.raises(RuntimeError):
        framer.push(np.zeros(10, dtype=np.float32))
    with pytest.raises(RuntimeError):
        framer.finish()


def test_bad_opus_parameters_are_rejected() -> None:
    with pytest.raises(ValueError):
        OpusFramer(44100, 20)
    with pytest.raises(ValueError):
        OpusFramer(48000, 25)
    with pytest.raises(ValueError):
        OpusConfig(bitrate=1000)
    with pytest.raises(ValueError):
        OpusConfig(complexity=11)
    with pytest.raises(ValueError):
        OpusConfig(application="speech")
    with pytest.raises(ValueError):
        OpusConfig(signal="speech")


def test_a_nan_from_a_voice_does_not_reach_the_encoder() -> None:
    x = speechlike(48000, 0.1)
    x[100:200] = np.nan
    framer = OpusFramer(48000, 20)
    y = decode(framer.push(x) + framer.finish(), 48000, 960)
    assert np.isfinite(y).all()


# --- PCM s16le -------------------------------------------------------------------------

def test_pcm_frames_are_s16le_clipped_and_padded() -> None:
    framer = PcmS16Framer(16000, 10)  # 160 samples, 320 bytes a frame
    assert framer.pre_skip == 0 and framer.frame_samples == 160
    x = np.zeros(200, dtype=np.float32)
    x[:6] = [0.0, 0.5, -0.5, 1.5, -2.0, 32767 / 32768]
    frames = framer.push(x) + framer.finish()
    assert [len(f) for f in frames] == [320, 320]
    pcm = np.frombuffer(b"".join(frames), dtype="<i2")
    assert pcm[:6].tolist() == [0, 16384, -16384, 32767, -32768, 32767]
    assert not pcm[200:].any()  # padding is silence
    assert framer.frames_out == 2


@pytest.mark.parametrize("rate", SAMPLE_RATES)
@pytest.mark.parametrize("frame_ms", FRAME_MS)
def test_pcm_round_trip_is_exact_on_the_s16_grid(rate: int, frame_ms: int) -> None:
    rng = np.random.default_rng(rate)
    ints = rng.integers(-32768, 32768, size=rate // 3).astype(np.int16)
    x = (ints.astype(np.float32) / 32768.0).astype(np.float32)
    framer = PcmS16Framer(rate, frame_ms)
    sizes = [int(s) for s in rng.integers(0, 3 * framer.frame_samples, 20)]
    frames = push_in_pieces(framer, x, sizes)
    assert len(frames) == math.ceil(len(x) / framer.frame_samples)
    assert all(len(f) == 2 * framer.frame_samples for f in frames)
    back = np.frombuffer(b"".join(frames), dtype="<i2")
    np.testing.assert_array_equal(back[:len(x)], ints)


def test_pcm_accepts_any_rate_with_whole_sample_frames() -> None:
    assert PcmS16Framer(22050, 20).frame_samples == 441
    with pytest.raises(ValueError):
        PcmS16Framer(22050, 10)  # 220.5 samples
