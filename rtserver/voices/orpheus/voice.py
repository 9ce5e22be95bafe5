"""Orpheus voices: a Llama that writes SNAC codes as vocabulary tokens.

A segment becomes the upstream Orpheus prompt (``codes.build_prompt``
over the checkpoint's own tokenizer), goes to the token engine (vLLM), and
the tokens stream back as sampled; every complete 7-token frame goes to a
chunked SNAC vocoder stream at once, and its PCM is yielded as it comes.
Cancelling (or closing) ``synthesize`` aborts the engine request, which frees
its KV cache, and closes the vocoder stream.

One engine and one vocoder per process serve every speaker: the voices
``orpheus:tara``, ``orpheus:leah``... share an ``OrpheusRuntime``.

Checkpoints are local folders: the HF Llama folder (config.json,
tokenizer.json, safetensors) and the SNAC folder (config.json +
pytorch_model.bin). ``dummy_weights``: the Llama gets random weights of its
config's shape (vLLM ``load_format="dummy"``; without a model folder the
Orpheus-3B config, or the tiny one, is written to a temporary folder), and
without a SNAC folder SNAC gets random weights of the real 24 kHz shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import PcmChunk
from rtserver.engine.base import (
    CyclicTokenMask,
    SamplingSettings,
    SingleCodebookEngine,
    TokenRequest,
)
from rtserver.engine.quantization import (
    check_setting,
    declared_quantization,
    resolve_quantization,
)
from rtserver.errors import ConfigError, EngineFailed, UnknownVoice
from rtserver.vocoder.base import Vocoder, VocoderStream
from rtserver.vocoder.config import VocoderConfig
from rtserver.voices.base import SpeechControls, SynthesisRequest, VoiceInfo
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.token_voice import chunk_timing, mark_model_output, resolve_device

# What Orpheus does with lexicons, SSML and speed (issue 29): aliases only; its
# model has no phoneme input and no speed control (a ``speed`` is refused).
CONTROLS = SpeechControls()

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

FAMILY = "orpheus"

# Audio tokens of slot i % 7 at output position i; end of speech at frame boundaries.
AUDIO_MASK = CyclicTokenMask(
    slot_ranges=tuple(ot.slot_range(s) for s in range(ot.FRAME_TOKENS)),
    end_ids=ot.STOP_TOKEN_IDS,
)


@dataclass(frozen=True, slots=True)
class OrpheusConfig:
    """The ``[orpheus]`` section: everything the Orpheus family needs."""

    model_dir: str = ""  # HF Llama folder (canopylabs/orpheus-3b-0.1-ft layout)
    snac_dir: str = ""  # SNAC folder (hubertsiuzdak/snac_24khz layout)
    dummy_weights: bool = False
    shape: str = "3b"  # dummy weights without model_dir: "3b" or "tiny"
    speaker: str = "tara"  # the default speaker
    speakers: tuple[str, ...] = ot.VOICES
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    budget: ot.TokenBudget = field(default_factory=ot.TokenBudget)
    device: str = "auto"  # SNAC: "cpu", "cuda", "auto"
    vocoder: VocoderConfig | None = None  # chunking/batching; None: the vocoder's defaults
    # vLLM
    dtype: str = "auto"
    # Weight quantization: "" (the checkpoint's own, or none), "fp8" (bf16
    # weights quantized at load; H100/H200), or the method of a quantized
    # checkpoint ("awq", "gptq", "compressed-tensors", ...; see
    # rtserver.engine.quantization): must agree with its config.json.
    quantization: str = ""
    max_model_len: int = 4096  # prompt (<~300 tokens) + up to 60 s of audio (4,900 tokens)
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.8  # the rest: SNAC and its batched decodes
    kv_cache_gib: float | None = None
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    priority_scheduling: bool = True
    # "mask" | "allowed" | "none" (see engine.vllm_engine), or "auto": "none" for
    # a checkpoint (the fine-tuned model writes audio tokens; no logits processor
    # lets vLLM run its V2 model runner: 23.5k vs 16.9k tokens/s at 128 streams on
    # an H200, bench/results/h200-orpheus-v2-2026-12-02), "mask" for vLLM's dummy
    # weights, which write any token.
    token_guard: str = "auto"
    # An audio token of the wrong slot (possible unless token_guard is "mask"):
    # "reslot" takes its code for the right slot (counted), "fail" fails the
    # context with engine_failed. A token that is not audio always fails it.
    wrong_slot: str = "reslot"
    stream_interval: int = 1  # vLLM: tokens per delta after the first (see vllm_engine)
    tensor_parallel_size: int = 1
    seed: int = 0
    warm_up_frames: int = 4

    def check(self) -> None:
        """Cross-field checks, once every source of settings is applied."""
        if self.speaker not in self.speakers:
            raise ValueError(f"speaker {self.speaker!r} is not one of speakers "
                             f"({', '.join(self.speakers)})")
        for name, allowed in (("token_guard", ("auto", "mask", "allowed", "none")),
                              ("wrong_slot", ("reslot", "fail")), ("shape", ("3b", "tiny"))):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        check_setting(self.quantization)
        if not self.model_dir:  # the dummy layout written at load declares none
            resolve_quantization(self.quantization, None)
        elif (Path(self.model_dir) / "config.json").is_file():  # else: the loader says so
            resolve_quantization(self.quantization, declared_quantization(self.model_dir))


SnacFrames = npt.NDArray[np.int64]  # (frames, 7) codes in SNAC order


class OrpheusRuntime:
    """The shared parts: token engine, SNAC vocoder, tokenizer."""

    def __init__(self, config: OrpheusConfig, engine: SingleCodebookEngine,
                 vocoder: Vocoder[SnacFrames], tokenizer: Tokenizer, *, max_model_len: int,
                 temp_dir: str | None = None) -> None:
        self.config = config
        self.engine = engine
        self.vocoder = vocoder
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self._temp_dir = temp_dir
        self._users = 0
        self._voices: dict[str, OrpheusVoice] = {}
        self.reslotted_tokens = 0  # wrong-slot audio tokens taken for the right slot

    def counters(self) -> dict[str, tuple[str, float]]:
        """The voice's and its vocoder's counters for /metrics: name -> (doc, value)."""
        out: dict[str, tuple[str, float]] = {"orpheus_reslotted_tokens": (
            "Audio tokens of the wrong slot taken for the right one", self.reslotted_tokens)}
        stats = getattr(self.vocoder, "stats", None)
        if stats is not None:
            out |= {
                "vocoder_calls": ("Batched decoder calls", stats.calls),
                "vocoder_windows": ("Code windows decoded", stats.windows),
                "vocoder_frames": ("Frames decoded, context and lookahead included",
                                   stats.frames),
                "vocoder_padded_frames": ("Frames computed, batch padding included",
                                          stats.padded_frames),
                "vocoder_decode_seconds": ("Wall time inside decoder calls",
                                           stats.decode_seconds),
                "vocoder_first_lane_calls": ("Decoder calls of first chunks on the first "
                                             "lane (beside the main calls)",
                                             stats.first_lane_calls),
            }
        return out

    def prompt_ids(self, speaker: str, text: str) -> list[int]:
        """Upstream prompt: tokenizer(f"{speaker}: {text}") with BOS, wrapped."""
        enc = self.tokenizer.encode(ot.voice_prefix(speaker) + text, add_special_tokens=True)
        return ot.build_prompt(enc.ids)

    def voice(self, speaker: str) -> OrpheusVoice:
        if speaker not in self.config.speakers:
            raise UnknownVoice(f"orpheus has no speaker {speaker!r}; one of "
                               f"{', '.join(self.config.speakers)}")
        v = self._voices.get(speaker)
        if v is None:
            v = self._voices[speaker] = OrpheusVoice(self, speaker)
            self._users += 1
        return v

    def all_voices(self) -> list[OrpheusVoice]:
        """A voice per configured speaker (``orpheus:tara``, ``orpheus:leah``, ...)."""
        return [self.voice(name) for name in self.config.speakers]

    async def release(self) -> None:
        """One voice closed; the last one closes engine and vocoder."""
        self._users -= 1
        if self._users > 0:
            return
        _RUNTIMES.pop(_runtime_key(self.config), None)
        try:
            await self.vocoder.close()
        finally:
            await self.engine.close()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)


class OrpheusVoice:
    """A ``Voice``: one Orpheus speaker (``orpheus:<speaker>``)."""

    def __init__(self, runtime: OrpheusRuntime, speaker: str) -> None:
        self._rt = runtime
        self.speaker = speaker
        dummy = " (random weights: the speed is real, the sound is noise)" \
            if runtime.config.dummy_weights else ""
        plan_ms, cost_ms = chunk_timing(
            getattr(runtime.vocoder, "chunking", None), ot.SAMPLE_RATE,
            frame_ms=1000.0 * ot.SAMPLES_PER_FRAME / ot.SAMPLE_RATE)
        self._info = VoiceInfo(name=f"{FAMILY}:{speaker}", family=FAMILY,
                               sample_rate=ot.SAMPLE_RATE, language="en",
                               description=f"Orpheus TTS speaker {speaker}{dummy}",
                               chunk_plan_ms=plan_ms, chunk_cost_ms=cost_ms,
                               controls=CONTROLS)
        self._closed = False

    @property
    def info(self) -> VoiceInfo:
        return self._info

    @property
    def runtime(self) -> OrpheusRuntime:
        return self._rt

    async def warm_up(self) -> None:
        """A few frames through engine and vocoder (first-call costs paid here)."""
        frames = self._rt.config.warm_up_frames
        req = SynthesisRequest(text="Warming up.", request_id=f"warmup-{self.speaker}",
                               first=True)
        async for _ in self.stream(req, max_tokens=frames * ot.FRAME_TOKENS):
            pass

    def token_request(self, request: SynthesisRequest, *, max_tokens: int | None = None
                      ) -> TokenRequest:
        """The engine request for one segment (exposed for tests and benchmarks)."""
        rt = self._rt
        prompt = rt.prompt_ids(self.speaker, request.text)
        room = rt.max_model_len - len(prompt)
        if room < ot.FRAME_TOKENS + 1:
            raise EngineFailed(f"segment of {len(request.text)} characters leaves no room "
                               f"for audio in a {rt.max_model_len}-token context")
        budget = rt.config.budget.max_tokens(request.text, limit=room)
        return TokenRequest(
            request_id=request.request_id,
            prompt_token_ids=tuple(prompt),
            max_tokens=min(budget, max_tokens) if max_tokens is not None else budget,
            sampling=rt.config.sampling,
            stop_token_ids=ot.STOP_TOKEN_IDS,
            priority=0 if request.first else 1,
            mask=AUDIO_MASK,
        )

    def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        return self.stream(request)

    async def stream(self, request: SynthesisRequest, *, max_tokens: int | None = None
                     ) -> AsyncGenerator[PcmChunk, None]:
        """``synthesize`` with the token budget capped at ``max_tokens`` (warm-up,
        tests, benchmarks)."""
        if self._closed:
            raise EngineFailed("the voice is closed")
        treq = self.token_request(request, max_tokens=max_tokens)
        frames = ot.FrameAssembler(ot.STOP_TOKEN_IDS,
                                   reslot=self._rt.config.wrong_slot == "reslot")
        stream: VocoderStream[SnacFrames] = self._rt.vocoder.open_stream()
        try:
            tokens = self._rt.engine.generate(treq)
            async with contextlib.aclosing(tokens):
                async for delta in tokens:
                    try:
                        complete = frames.feed(delta)
                    except ot.MalformedStream as exc:
                        raise EngineFailed(f"request {request.request_id}: {exc}") from exc
                    if len(complete):
                        mark_model_output(request)
                        for chunk in await stream.push(complete):
                            yield chunk
            if frames.finish() or frames.dropped_tokens:
                log.debug("request %s: dropped a partial frame", request.request_id)
            for chunk in await stream.finish():
                yield chunk
        finally:
            stream.close()
            if frames.reslotted_tokens:
                self._rt.reslotted_tokens += frames.reslotted_tokens
                log.debug("request %s: %d audio tokens of the wrong slot re-slotted",
                          request.request_id, frames.reslotted_tokens)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._rt.release()


# --- loading -----------------------------------------------------------------

_RUNTIMES: dict[tuple[Any, ...], asyncio.Future[OrpheusRuntime]] = {}


def _runtime_key(cfg: OrpheusConfig) -> tuple[Any, ...]:
    d = dataclasses.asdict(cfg)
    d.pop("speaker")
    return tuple(sorted((k, repr(v)) for k, v in d.items()))


def _resolve_model_dir(cfg: OrpheusConfig) -> tuple[str, str | None]:
    """(folder vLLM loads, temporary folder to delete afterwards or None)."""
    if cfg.model_dir:
        path = Path(cfg.model_dir)
        if not (path / "config.json").is_file():
            raise ConfigError(f"Orpheus model folder {path} has no config.json")
        if not (path / "tokenizer.json").is_file():
            raise ConfigError(f"Orpheus model folder {path} has no tokenizer.json")
        return str(path), None
    if not cfg.dummy_weights:
        raise ConfigError("Orpheus needs a model folder (orpheus model_dir), or dummy weights")
    from rtserver.voices.orpheus.layout import write_tiny_orpheus

    tmp = tempfile.mkdtemp(prefix="rtserver-orpheus-")
    write_tiny_orpheus(tmp, shape="3b" if cfg.shape == "3b" else "tiny", with_weights=False)
    return tmp, tmp


async def _build_runtime(cfg: OrpheusConfig) -> OrpheusRuntime:
    from tokenizers import Tokenizer

    from rtserver.engine.vllm_engine import VllmEngine, VllmEngineConfig
    from rtserver.voices.orpheus.snac_stream import SnacVocoder

    try:
        cfg.check()
    except ValueError as exc:
        raise ConfigError(f"[orpheus] {exc}") from None
    guard = cfg.token_guard
    if guard == "auto":
        guard = "mask" if cfg.dummy_weights else "none"
    model_dir, temp_dir = _resolve_model_dir(cfg)
    try:
        tokenizer = await asyncio.to_thread(Tokenizer.from_file,
                                            str(Path(model_dir) / "tokenizer.json"))
        engine = VllmEngine(VllmEngineConfig(
            model=model_dir, dummy_weights=cfg.dummy_weights, dtype=cfg.dtype,
            quantization=cfg.quantization,
            max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            gpu_memory_utilization=cfg.gpu_memory_utilization, kv_cache_gib=cfg.kv_cache_gib,
            enforce_eager=cfg.enforce_eager, enable_prefix_caching=cfg.enable_prefix_caching,
            priority_scheduling=cfg.priority_scheduling,
            token_guard=guard,  # type: ignore[arg-type]
            tensor_parallel_size=cfg.tensor_parallel_size, seed=cfg.seed,
            stream_interval=cfg.stream_interval))
        snac_dir = Path(cfg.snac_dir) if cfg.snac_dir else None
        if snac_dir is None and not cfg.dummy_weights:
            raise ConfigError("Orpheus needs a SNAC folder (orpheus snac_dir), or dummy weights")
        # vLLM first: it sizes its KV cache from the free GPU memory it finds.
        await engine.start()
        try:
            vocoder = await asyncio.to_thread(SnacVocoder.load, snac_dir,
                                              dummy=snac_dir is None,
                                              device=resolve_device(cfg.device),
                                              config=cfg.vocoder)
            await vocoder.start()
        except BaseException:
            await engine.close()
            raise
    except BaseException:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    return OrpheusRuntime(cfg, engine, vocoder, tokenizer, max_model_len=engine.max_model_len,
                          temp_dir=temp_dir)


async def load_orpheus_runtime(cfg: OrpheusConfig) -> OrpheusRuntime:
    """The process's runtime for ``cfg`` (speaker aside): started once, shared."""
    key = _runtime_key(cfg)
    fut = _RUNTIMES.get(key)
    if fut is None:
        if _RUNTIMES:
            raise ConfigError("one Orpheus engine per process: every orpheus voice must use "
                              "the same model settings")
        fut = asyncio.get_running_loop().create_future()
        _RUNTIMES[key] = fut
        try:
            fut.set_result(await _build_runtime(cfg))
        except BaseException as exc:
            _RUNTIMES.pop(key, None)
            fut.set_exception(exc)
            fut.exception()  # retrieved: waiters get it from ``await fut``
            raise
    return await fut


async def load_orpheus_voice(cfg: OrpheusConfig, speaker: str | None = None) -> OrpheusVoice:
    """Load (or share) the runtime and return the speaker's voice."""
    runtime = await load_orpheus_runtime(cfg)
    return runtime.voice(speaker or cfg.speaker)
