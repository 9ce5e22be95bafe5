"""Do the reported word times match the audio? Energy minima against boundaries.

``python -m rtserver.tools.measure.word_timings [--out DIR] [--sentences N]``
speaks a corpus of 50 sentences with the embedded Piper voice through the
speech core, as a server's context would (segmenter, voice, resampler, Opus
at 48 kHz, 20 ms frames), decodes the frames as a client does (libopus, the
``pre_skip`` dropped) and checks every boundary between two words against
the decoded audio:

- the boundary reported: from the first word's ``end_ms`` to the next
  word's ``start_ms`` (a pause between them is part of the boundary);
- the audio's own: the minima of short-time energy (20 ms Hann windows,
  5 ms apart) between the two words: searched over the outer third of each
  word (``OUTER``; the middle third of a word is its own) and any pause
  between them, at most ``SEARCH_MS`` either side of the reported boundary;
  every point within ``TIE_DB`` (3 dB) of the lowest counts as a minimum
  (a stop's closure inside a word is often as quiet as the junction);
- a word passes when a minimum lies within ``TOLERANCE_MS`` (60) of its
  boundary with the next word (the last word of each utterance has none).

Energy is a weak witness of a word boundary: two voiced sounds run into
each other without a dip ("tomorrow looks"), and the closure of a stop
inside a word ("pass|port", "sta|tion") is silent. A strict variant, which
searches between the words' middles and takes the single lowest point, is
reported beside the check, with the controls below.

A second witness that does not lean on energy (``forced``): each sentence
is aligned (DTW over log-mel frames, ``dtw_path``) with its words spoken
alone by the same voice, trimmed of silence and put one after another; the
joins of that concatenation are known, so the alignment says where each
word meets the next in the sentence, from the audio alone. A reported
boundary passes when that point lies within ``TOLERANCE_MS`` of it.

Controls, so the figures have something to be compared with (a measurement
that any timing passes would say nothing): the same check on the words
spread by character count over each segment's actual audio (the estimate a
client makes with ``rtserver.client.word_times``; the server's own estimate,
for voices that cannot time words, spreads over the expected audio and can
only be worse), and on the model's times moved 60 and 100 ms either way;
for both witnesses.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from rtserver.protocol.messages import SegmentStarted, Start, Words, WordSpan

if TYPE_CHECKING:
    from rtserver.core import SpeechCore

TOLERANCE_MS = 60.0
SEARCH_MS = 250.0
OUTER = 1 / 3
TIE_DB = 3.0
WINDOW_MS = 20.0
HOP_MS = 5.0

CORPUS = (
    "Sure, I can help with that.",
    "What would you like to know first?",
    "Tomorrow looks sunny, with a light breeze in the afternoon.",
    "The meeting moved to Thursday at ten in the morning.",
    "Please bring your passport and a printed copy of the ticket.",
    "I found three restaurants near the station that are open late.",
    "The second option costs more, so I would pick the first one.",
    "Your package left the warehouse this morning and should arrive soon.",
    "Turn left at the bakery, then walk straight for two blocks.",
    "That sounds like a great plan for the weekend.",
    "The battery lasts about nine hours on a single charge.",
    "Let me check the calendar and get back to you.",
    "Dr. Smith will see you at half past four.",
    "We shipped twelve new features in the last release.",
    "The museum is closed on Mondays but open every other day.",
    "Could you tell me which size you usually wear?",
    "The train to Boston leaves from platform seven.",
    "Remember to water the plants while I am away.",
    "Her presentation was clear, short and very convincing.",
    "The total comes to forty two dollars and fifty cents.",
    "Most people find the hiking trail easy in the dry season.",
    "I am sorry, but that flight is already fully booked.",
    "Mix the flour with two eggs and a cup of warm milk.",
    "Bake the bread for about thirty minutes until it turns golden.",
    "The library has a quiet room on the second floor.",
    "You can cancel the order any time before it ships.",
    "The forecast says rain tonight and snow by Friday.",
    "He said he would call back after lunch.",
    "This laptop is lighter than the old one and much faster.",
    "The hotel offers free breakfast and a shuttle to the airport.",
    "Our team won the final match by a single goal.",
    "Every answer depends on what you want to achieve.",
    "The river rises quickly after a heavy storm.",
    "Keep the receipt in case you need to return it.",
    "The concert starts at eight, and the doors open an hour earlier.",
    "My sister moved to a small village near the coast.",
    "Write down the number before you forget it.",
    "The new bridge will open to traffic next spring.",
    "Nobody expected the old clock to work again.",
    "Add a pinch of salt and stir the soup gently.",
    "The children painted the fence bright yellow.",
    "It took twenty minutes to get there by bus.",
    "The doctor asked me to rest for a few days.",
    "Good question! The answer is in the second chapter.",
    "Our office is on the corner of Main Street and Oak Avenue.",
    "The garden looks wonderful after the summer rain.",
    "Please speak slowly, because the line is very noisy.",
    "The report is due on Monday, so there is still time.",
    "A cold wind blew across the empty parking lot.",
    "Thank you for waiting, your table is ready now.",
)


@dataclass(frozen=True, slots=True)
class BoundaryCheck:
    """One word's boundary with the next: reported and found in the audio (ms)."""

    word: str
    end_ms: float  # the word's reported end
    next_start_ms: float  # the next word's reported start
    minimum_ms: float  # where the audio's energy is lowest between the two
    error_ms: float  # distance from the minimum to [end_ms, next_start_ms]

    @property
    def passed(self) -> bool:
        return self.error_ms <= TOLERANCE_MS


def energy_db(pcm: npt.NDArray[np.float32], rate: int) -> tuple[npt.NDArray[np.float64], float]:
    """Short-time energy in dB (Hann windows of ``WINDOW_MS``, every
    ``HOP_MS``; a window's time is its centre) and the time of the first."""
    win = round(rate * WINDOW_MS / 1000.0)
    hop = round(rate * HOP_MS / 1000.0)
    x = np.asarray(pcm, dtype=np.float64)
    if len(x) < win:
        return np.zeros(0), 0.0
    frames = np.lib.stride_tricks.sliding_window_view(x, win)[::hop]
    window = np.hanning(win)
    energy = (frames * window).__pow__(2).sum(axis=1) / window.__pow__(2).sum()
    return 10.0 * np.log10(energy + 1e-10), 1000.0 * (win / 2) / rate


def boundary_checks(pcm: npt.NDArray[np.float32], rate: int, words: Sequence[WordSpan], *,
                    outer: float = OUTER, tie_db: float = TIE_DB) -> list[BoundaryCheck]:
    """Each word (but the last) with a spoken length, checked against the
    energy minima between it and the next (see the module docstring):
    ``outer`` of each word's length on the boundary's side is searched, and
    points within ``tie_db`` of the lowest energy there count as minima."""
    db, t0 = energy_db(pcm, rate)
    spoken = [w for w in words if w.end_ms > w.start_ms]
    checks: list[BoundaryCheck] = []
    for a, b in itertools.pairwise(spoken):
        lo_b, hi_b = a.end_ms, max(a.end_ms, b.start_ms)
        lo = max(a.end_ms - outer * (a.end_ms - a.start_ms), lo_b - SEARCH_MS)
        hi = min(b.start_ms + outer * (b.end_ms - b.start_ms), hi_b + SEARCH_MS)
        i0 = max(0, int(np.ceil((lo - t0) / HOP_MS)))
        i1 = min(len(db), int(np.floor((hi - t0) / HOP_MS)) + 1)
        if i1 <= i0:
            continue
        window = db[i0:i1]
        minima = t0 + HOP_MS * (i0 + np.nonzero(window <= window.min() + tie_db)[0])
        errors = np.maximum(0.0, np.maximum(lo_b - minima, minima - hi_b))
        k = int(np.argmin(errors))
        checks.append(BoundaryCheck(a.text, a.end_ms, b.start_ms, round(float(minima[k]), 1),
                                    round(float(errors[k]), 1)))
    return checks


def char_spread(segments: Sequence[SegmentStarted], frame_ms: int, audio_ms: float
                ) -> list[WordSpan]:
    """The words of each segment spread by character offset over the
    segment's audio (its first frame to the next segment's), the estimate of
    ``rtserver.client.word_times``."""
    from rtserver.core.words import word_source
    from rtserver.text.segmenter import Segment
    from rtserver.text.words import text_words

    out: list[WordSpan] = []
    for k, seg in enumerate(segments):
        start = seg.seq * frame_ms
        end = segments[k + 1].seq * frame_ms if k + 1 < len(segments) else audio_ms
        n = max(1, len(seg.text))
        core_seg = Segment(seg.index, seg.text, seg.source)
        for a, b in text_words(seg.text):
            out.append(WordSpan(text=seg.text[a:b], start_ms=start + (end - start) * a / n,
                                end_ms=start + (end - start) * b / n,
                                source=word_source(core_seg, a, b)))
    return out


@dataclass(frozen=True, slots=True)
class Spoken:
    """One utterance as a client got it."""

    text: str
    pcm: npt.NDArray[np.float32]
    rate: int
    words: tuple[Words, ...]
    segments: tuple[SegmentStarted, ...]
    frame_ms: int
    # each word of ``model_words`` with a spoken length, spoken alone (``forced``)
    alone: tuple[npt.NDArray[np.float32], ...] = ()

    @property
    def model_words(self) -> list[WordSpan]:
        return [w for event in self.words for w in event.words]

    def estimated_words(self) -> list[WordSpan]:
        return char_spread(self.segments, self.frame_ms, 1000.0 * len(self.pcm) / self.rate)


async def speak_corpus(texts: Sequence[str], *, alone: bool = True) -> list[Spoken]:
    """Each text through the speech core with the embedded Piper voice, as
    Opus; with ``alone`` each of its words too, one context each (``forced``)."""
    from rtserver.config import Config
    from rtserver.core import SpeechCore
    from rtserver.voices.registry import load_voices

    config = Config()
    voices = await load_voices(config.voice, config.families, progress=lambda m: None)
    try:
        core = SpeechCore(voices.voices, segmenter_config=config.segmenter,
                          hint_config=config.hints, opus_config=config.opus)
        out: list[Spoken] = []
        for i, text in enumerate(texts):
            spoken = await _speak(core, f"w{i}", text)
            if alone:
                words = [w for w in spoken.model_words if w.end_ms > w.start_ms]
                parts = [trim((await _speak(core, f"w{i}-{k}", w.text)).pcm, 48000)
                         for k, w in enumerate(words)]
                spoken = dataclasses.replace(spoken, alone=tuple(parts))
            out.append(spoken)
        return out
    finally:
        await voices.close()


async def _speak(core: SpeechCore, name: str, text: str) -> Spoken:
    from rtserver.client.decode import decode_frames
    from rtserver.core import AudioFrames, speak
    from rtserver.protocol.messages import Done, ErrorMessage

    start = Start(context=name, format="opus", sample_rate=48000, frame_ms=20)
    frames: list[bytes] = []
    words: list[Words] = []
    segments: list[SegmentStarted] = []
    async with speak(core, start) as stream:
        pre_skip = stream.context.framer.pre_skip
        stream.feed(text)
        stream.end()
        async for event in stream.events():
            if isinstance(event, AudioFrames):
                frames.extend(event.frames)
            elif isinstance(event, Words):
                words.append(event)
            elif isinstance(event, SegmentStarted):
                segments.append(event)
            elif isinstance(event, ErrorMessage):
                raise RuntimeError(f"{event.code}: {event.message}")
            elif isinstance(event, Done):
                break
    pcm = decode_frames(frames, format="opus", sample_rate=48000, frame_ms=20,
                        pre_skip=pre_skip)
    return Spoken(text, pcm, 48000, tuple(words), tuple(segments), 20)


# --- forced alignment: the sentence against its words spoken alone ---------------


def trim(pcm: npt.NDArray[np.float32], rate: int, floor_db: float = -45.0
         ) -> npt.NDArray[np.float32]:
    """``pcm`` without the silence before and after its speech (energy in 10 ms
    more than ``floor_db`` below its loudest)."""
    win = max(1, rate // 100)
    energy = np.convolve(np.asarray(pcm, dtype=np.float64) ** 2, np.ones(win) / win, "same")
    loud = np.nonzero(energy > energy.max() * 10.0 ** (floor_db / 10.0))[0]
    return pcm[loud[0]:loud[-1] + 1] if loud.size else pcm


def log_mel(pcm: npt.NDArray[np.float32], rate: int, n_mels: int = 40
            ) -> npt.NDArray[np.float64]:
    """Log mel energies per ``HOP_MS`` (25 ms Hann windows, 60-7600 Hz),
    each band normalized over the utterance."""
    hop = round(rate * HOP_MS / 1000.0)
    win = round(rate * 0.025)
    nfft = 1 << (win - 1).bit_length()
    x = np.asarray(pcm, dtype=np.float64)
    if len(x) < win:
        x = np.pad(x, (0, win - len(x)))
    frames = np.lib.stride_tricks.sliding_window_view(x, win)[::hop] * np.hanning(win)
    power = np.abs(np.fft.rfft(frames, nfft)) ** 2
    freqs = np.fft.rfftfreq(nfft, 1.0 / rate)
    mel = np.linspace(2595 * np.log10(1 + 60 / 700), 2595 * np.log10(1 + 7600 / 700),
                      n_mels + 2)
    hz = 700 * (10 ** (mel / 2595) - 1)
    bank = np.stack([np.clip(np.minimum((freqs - hz[i]) / (hz[i + 1] - hz[i]),
                                        (hz[i + 2] - freqs) / (hz[i + 2] - hz[i + 1])), 0, None)
                     for i in range(n_mels)])
    feats = np.log(power @ bank.T + 1e-8)
    return np.asarray((feats - feats.mean(0)) / (feats.std(0) + 1e-5))


def dtw_path(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> list[tuple[int, int]]:
    """The cheapest monotone path through ``1 - cos`` distances of ``a``'s
    frames to ``b``'s (steps right, down, diagonal), as (i, j) pairs."""
    an = a / (np.linalg.norm(a, axis=1, keepdims=True) + 1e-9)
    bn = b / (np.linalg.norm(b, axis=1, keepdims=True) + 1e-9)
    cost = 1.0 - an @ bn.T
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for i in range(1, n + 1):
        c = cost[i - 1]
        enter = np.minimum(acc[i - 1, 1:], acc[i - 1, :-1]) + c  # from above or diagonal
        # then moves right along the row: cur[j] = min(enter[j], cur[j-1] + c[j]),
        # a running minimum of enter[k] - sum(c[..k]) plus sum(c[..j])
        cs = np.cumsum(c)
        acc[i, 1:] = cs + np.minimum.accumulate(enter - cs)
    i, j = n, m
    path: list[tuple[int, int]] = []
    while i > 0 and j > 0:
        path.append((i - 1, j - 1))
        step = int(np.argmin((acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])))
        i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
    return path[::-1]


def forced_boundaries(pcm: npt.NDArray[np.float32], rate: int,
                      alone: Sequence[npt.NDArray[np.float32]]) -> list[float]:
    """Where (ms into ``pcm``) each word meets the next, found without the
    reported times: ``pcm`` aligned (``dtw_path``) with its words spoken
    alone, one after another, whose joins are known."""
    joins = np.cumsum([len(w) for w in alone])[:-1] / rate * 1000.0
    path = dtw_path(log_mel(pcm, rate), log_mel(np.concatenate(alone), rate))
    rows = np.asarray([i for i, _ in path], dtype=np.float64)
    cols = np.asarray([j for _, j in path], dtype=np.float64)
    half = 12.5  # a frame's time is its 25 ms window's centre
    out: list[float] = []
    for t in joins:
        j = (t - half) / HOP_MS
        near = rows[np.abs(cols - j) <= 0.5]
        out.append(float(near.mean()) * HOP_MS + half if near.size else float("nan"))
    return out


def forced_checks(words: Sequence[WordSpan], boundaries: Sequence[float]) -> list[BoundaryCheck]:
    """Each reported boundary (words with a spoken length) against the forced
    one (``forced_boundaries``, one per pair of those words)."""
    spoken = [w for w in words if w.end_ms > w.start_ms]
    if len(spoken) != len(boundaries) + 1:
        raise ValueError(f"{len(spoken)} words for {len(boundaries)} boundaries")
    checks: list[BoundaryCheck] = []
    for (a, b), at in zip(itertools.pairwise(spoken), boundaries, strict=False):
        if not np.isfinite(at):
            continue
        hi = max(a.end_ms, b.start_ms)
        checks.append(BoundaryCheck(a.text, a.end_ms, b.start_ms, round(at, 1),
                                    round(max(0.0, a.end_ms - at, at - hi), 1)))
    return checks


def shifted(words: Sequence[WordSpan], ms: float) -> list[WordSpan]:
    """``words`` moved ``ms`` later (a control: wrong times must fail)."""
    return [WordSpan(text=w.text, start_ms=w.start_ms + ms, end_ms=w.end_ms + ms,
                     source=w.source) for w in words]


def _shifted_model(s: Spoken, ms: float) -> list[WordSpan]:
    return shifted(s.model_words, ms)


def summarize(checks: Sequence[BoundaryCheck]) -> dict[str, float]:
    errors = np.asarray([c.error_ms for c in checks]) if checks else np.zeros(1)
    return {"boundaries": len(checks),
            "passed": sum(c.passed for c in checks),
            "pass_rate": round(sum(c.passed for c in checks) / max(1, len(checks)), 4),
            "error_ms_p50": round(float(np.percentile(errors, 50)), 1),
            "error_ms_p90": round(float(np.percentile(errors, 90)), 1),
            "error_ms_max": round(float(errors.max()), 1)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=len(CORPUS))
    parser.add_argument("--out", type=Path, default=None, help="write result.json here")
    args = parser.parse_args(argv)
    spoken = asyncio.run(speak_corpus(CORPUS[:args.sentences]))
    timings = sorted({e.timing for s in spoken for e in s.words})

    def run(words: Callable[[Spoken], Sequence[WordSpan]], **kw: float) -> list[BoundaryCheck]:
        return [c for s in spoken for c in boundary_checks(s.pcm, s.rate, words(s), **kw)]

    model = run(lambda s: s.model_words)
    result: dict[str, object] = {
        "sentences": len(spoken), "tolerance_ms": TOLERANCE_MS, "search_ms": SEARCH_MS,
        "outer": round(OUTER, 3), "tie_db": TIE_DB, "timing_reported": timings,
        "model": summarize(model),
        "char_spread": summarize(run(Spoken.estimated_words)),
        # controls: the model's times moved by a fixed amount should fail more
        "model_shifted": {f"{ms:+d}": summarize(run(functools.partial(_shifted_model, ms=ms)))
                          for ms in (-100, -60, 60, 100)},
        "strict": {"model": summarize(run(lambda s: s.model_words, outer=0.5, tie_db=0.0)),
                   "char_spread": summarize(run(Spoken.estimated_words, outer=0.5,
                                                tie_db=0.0))},
        "failed_model": [asdict(c) for c in model if not c.passed],
    }
    forced = [forced_boundaries(s.pcm, s.rate, s.alone) for s in spoken]

    def against(words: Callable[[Spoken], Sequence[WordSpan]]) -> list[BoundaryCheck]:
        return [c for s, b in zip(spoken, forced, strict=True)
                for c in forced_checks(words(s), b)]

    result["forced"] = {
        "model": summarize(against(lambda s: s.model_words)),
        "char_spread": summarize(against(Spoken.estimated_words)),
        "model_shifted": {f"{ms:+d}": summarize(against(functools.partial(_shifted_model, ms=ms)))
                          for ms in (-100, -60, 60, 100)},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
