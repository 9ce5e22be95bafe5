"""Orpheus voices: a Llama that writes SNAC codes as vocabulary tokens.

A segment becomes the upstream Orpheus prompt (``codes.build_prompt``
over the checkpoint's own tokenizer), goes to the token engine (vLLM), and
the tokens stream back as sampled; every complete 7-token frame goes to a
chunked SNAC vocoder stream at once, and its PCM is yielded as it comes.
Cancelling (or closing) ``synthesize`` aborts the engine request, which frees
its KV cache, and closes the vocoder stream.

One engine and one vocoder per process serve every speaker: the voices
``orpheus:tara``, ``orpheus:leah``... share an ``OrpheusRuntime``.

LoRA voices: a voice may name an adapter in PEFT layout on the base model
(``[orpheus] adapters = ["alice=/adapters/alice"]``, or at run time through
``OrpheusRuntime.add_adapter_voice``, behind ``POST /v1/admin/voices``). Each of
its requests carries the adapter (vLLM batches up to ``max_loras`` adapters
in one step, the base model's rows beside them). An adapter is read and
checked by vLLM when it is added, so a broken one is ``unknown_voice`` with
the reason, and never reaches a request. Removing a voice takes it from the
server at once; contexts speaking with it go on, and its adapter is unloaded
after ``RETIRE_GRACE_S`` without a request on it.

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
import json
import logging
import shutil
import tempfile
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import PcmChunk
from rtserver.engine.base import (
    Adapter,
    CyclicTokenMask,
    LoraEngine,
    SingleCodebookEngine,
    TokenRequest,
)
from rtserver.engine.head_vocab import HeadVocab
from rtserver.errors import BadAdapter, ConfigError, EngineFailed, UnknownVoice
from rtserver.vocoder.base import Vocoder, VocoderStream
from rtserver.voices.base import SpeechControls, SynthesisRequest, VoiceInfo
from rtserver.voices.orpheus import codes as ot
from rtserver.voices.orpheus.capabilities import CAPABILITIES, LORA_CAPABILITIES
from rtserver.voices.orpheus.config import OrpheusConfig, check_adapter_folder, check_adapter_name
from rtserver.voices.token_voice import chunk_timing, mark_model_output, resolve_device

# What Orpheus does with lexicons, SSML and speed (issue 29): aliases only; its
# model has no phoneme input and no speed control (a ``speed`` is refused).
CONTROLS = SpeechControls()

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from rtserver.engine.vllm_engine import VllmEngineConfig

log = logging.getLogger(__name__)

FAMILY = "orpheus"
# A removed LoRA voice's adapter is unloaded after this long without a request
# on it: contexts that were speaking with it ask for their next segment sooner.
RETIRE_GRACE_S = 10.0

# Audio tokens of slot i % 7 at output position i; end of speech at frame boundaries.
AUDIO_MASK = CyclicTokenMask(
    slot_ranges=tuple(ot.slot_range(s) for s in range(ot.FRAME_TOKENS)),
    end_ids=ot.STOP_TOKEN_IDS,
)


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
        self._adapter_voices: dict[str, OrpheusVoice] = {}  # LoRA voices, by name
        self._adapter_ids = 0  # the last adapter id given (each add gets a new one)
        self._adapter_lock = asyncio.Lock()
        self._unloading: set[asyncio.Task[None]] = set()

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
        step_counters = getattr(self.engine, "step_counters", None)  # vLLM's engine
        if step_counters is not None:
            steps = step_counters()
            out |= {
                "vllm_steps": ("vLLM engine steps that generated tokens", steps.steps),
                "vllm_prefill_steps": ("vLLM engine steps that gave a request its first "
                                       "token (prefill and decode in one batch)",
                                       steps.prefill_steps),
            }
        gate = getattr(self.engine, "gate", None)  # vLLM's engine
        if gate is not None and gate.hold_s > 0:
            out |= {
                "vllm_held_requests": ("Later segments held to go to vLLM together "
                                       "([orpheus] later_hold_ms)", gate.held),
                "vllm_held_releases": ("Times the held later segments went to vLLM",
                                       gate.releases),
            }
        held = getattr(self.vocoder, "held_starts", None)
        if held is not None:
            out["vocoder_held_starts"] = (
                "Later segments that started with the chunk their listener's held audio "
                "left time for ([orpheus.vocoder] held_start)", held)
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
        """A voice per configured speaker (``orpheus:tara``, ``orpheus:leah``, ...)
        and one per LoRA voice added."""
        return [*(self.voice(name) for name in self.config.speakers),
                *self._adapter_voices.values()]

    # LoRA voices ----------------------------------------------------------------

    async def add_adapter_voice(self, name: str, folder: str,
                                speaker: str | None = None) -> OrpheusVoice:
        """A new voice ``orpheus:<name>``: the base model with the adapter in
        ``folder`` (PEFT layout), prompted as ``speaker`` (default: ``name``).
        ``UnknownVoice`` / ``BadAdapter`` with the reason."""
        cfg = self.config
        engine = self.engine
        if not cfg.lora_on or not isinstance(engine, LoraEngine):
            raise BadAdapter(f"voice orpheus:{name}: LoRA voices are off "
                             "([orpheus] lora = true, or adapters)")
        try:
            check_adapter_name(name, cfg.speakers)
        except ValueError as exc:
            raise BadAdapter(str(exc)) from None
        path = check_adapter_folder(folder, cfg.adapter_root)
        async with self._adapter_lock:
            if name in self._adapter_voices:
                raise BadAdapter(f"voice orpheus:{name} exists; remove it first")
            self._adapter_ids += 1
            adapter = Adapter(name=name, id=self._adapter_ids, path=str(path))
            await engine.add_adapter(adapter)
            voice = OrpheusVoice(self, speaker or name, name=name, adapter=adapter)
            self._adapter_voices[name] = voice
        log.info("LoRA voice %s added (adapter id %d)", voice.info.name, adapter.id)
        return voice

    async def remove_adapter_voice(self, name: str) -> OrpheusVoice:
        """Forget the LoRA voice ``name``; its adapter is unloaded once its
        last request ends. ``UnknownVoice`` if there is none."""
        voice = self._adapter_voices.pop(name, None)
        if voice is None:
            raise UnknownVoice(f"no LoRA voice orpheus:{name}")
        voice.retire()
        return voice

    def unload_when_idle(self, voice: OrpheusVoice, grace_s: float = RETIRE_GRACE_S) -> None:
        """Unload a retired voice's adapter once no request has run on it for
        ``grace_s`` (a context still speaking with it asks for its next
        segment within that)."""
        adapter, engine = voice.adapter, self.engine
        if adapter is None or not isinstance(engine, LoraEngine):
            return

        async def unload() -> None:
            await asyncio.sleep(grace_s)
            if voice.idle:  # else the stream that ends last schedules it again
                voice.unloaded = True
                await engine.remove_adapter(adapter)

        task = asyncio.get_running_loop().create_task(unload(),
                                                      name=f"unload adapter {adapter.name}")
        self._unloading.add(task)
        task.add_done_callback(self._unloading.discard)

    async def release(self) -> None:
        """One voice closed; the last one closes engine and vocoder."""
        self._users -= 1
        if self._users > 0:
            return
        _RUNTIMES.pop(_runtime_key(self.config), None)
        for task in self._unloading:  # the engine closes: nothing is left to unload
            task.cancel()
        try:
            await self.vocoder.close()
        finally:
            await self.engine.close()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)


class OrpheusVoice:
    """A ``Voice``: one Orpheus speaker (``orpheus:<speaker>``), or a LoRA
    voice (``orpheus:<name>``: the adapter, prompted as ``speaker``)."""

    def __init__(self, runtime: OrpheusRuntime, speaker: str, *, name: str | None = None,
                 adapter: Adapter | None = None) -> None:
        self._rt = runtime
        self.speaker = speaker
        self.adapter = adapter
        dummy = " (random weights: the speed is real, the sound is noise)" \
            if runtime.config.dummy_weights else ""
        what = f"LoRA voice {name} (adapter on the base model, as {speaker})" \
            if adapter is not None else f"speaker {speaker}"
        frame_ms = 1000.0 * ot.SAMPLES_PER_FRAME / ot.SAMPLE_RATE
        plan_ms, cost_ms = chunk_timing(
            getattr(runtime.vocoder, "chunking", None), ot.SAMPLE_RATE, frame_ms=frame_ms)
        first_plan_ms, first_cost_ms = chunk_timing(
            getattr(runtime.vocoder, "first_chunking", None), ot.SAMPLE_RATE, frame_ms=frame_ms)
        self._info = VoiceInfo(name=f"{FAMILY}:{name or speaker}", family=FAMILY,
                               sample_rate=ot.SAMPLE_RATE, language="en",
                               description=f"Orpheus TTS {what}{dummy}",
                               chunk_plan_ms=plan_ms, chunk_cost_ms=cost_ms,
                               first_chunk_plan_ms=first_plan_ms,
                               first_chunk_cost_ms=first_cost_ms,
                               capabilities=LORA_CAPABILITIES if adapter is not None
                               else CAPABILITIES, controls=CONTROLS,
                               batch_rows=runtime.config.max_num_seqs)
        self._closed = False
        self._open = 0  # streams in flight
        self._retired = False  # a LoRA voice removed: unload its adapter when idle
        self.unloaded = False  # its adapter is gone from the engine

    @property
    def info(self) -> VoiceInfo:
        return self._info

    @property
    def runtime(self) -> OrpheusRuntime:
        return self._rt

    async def warm_up(self) -> None:
        """A few frames through engine and vocoder, for one request and then for
        each of ``warm_up_batches`` at once (first-call costs paid here)."""
        cfg = self._rt.config
        for n in dict.fromkeys((1, *(min(b, cfg.max_num_seqs) for b in cfg.warm_up_batches))):
            await self._warm(n)

    async def _warm(self, n: int) -> None:
        """``n`` warm-up requests at once, each ``warm_up_frames`` frames."""
        tokens = self._rt.config.warm_up_frames * ot.FRAME_TOKENS

        async def one(i: int) -> None:
            req = SynthesisRequest(text="Warming up.", first=True,
                                   request_id=f"warmup-{self.speaker}-{n}-{i}")
            async for _ in self.stream(req, max_tokens=tokens):
                pass

        await asyncio.gather(*(one(i) for i in range(n)))

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
            adapter=self.adapter,
        )

    def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        return self.stream(request)

    async def stream(self, request: SynthesisRequest, *, max_tokens: int | None = None
                     ) -> AsyncGenerator[PcmChunk, None]:
        """``synthesize`` with the token budget capped at ``max_tokens`` (warm-up,
        tests, benchmarks)."""
        if self._closed:
            raise EngineFailed("the voice is closed")
        if self.unloaded:  # removed, and idle past the grace: the adapter is gone
            raise UnknownVoice(f"voice {self._info.name} was removed")
        treq = self.token_request(request, max_tokens=max_tokens)
        frames = ot.FrameAssembler(ot.STOP_TOKEN_IDS,
                                   reslot=self._rt.config.wrong_slot == "reslot")
        stream: VocoderStream[SnacFrames] = self._rt.vocoder.open_stream(
            first=request.first, held_s=request.held_s())
        self._open += 1
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
            self._open -= 1
            if self._retired and self._open == 0:
                self._rt.unload_when_idle(self)
            if frames.reslotted_tokens:
                self._rt.reslotted_tokens += frames.reslotted_tokens
                log.debug("request %s: %d audio tokens of the wrong slot re-slotted",
                          request.request_id, frames.reslotted_tokens)

    @property
    def idle(self) -> bool:
        return self._open == 0

    def retire(self) -> None:
        """A LoRA voice is removed (the server offers it no more): contexts
        speaking with it go on; its adapter is unloaded once no request has
        run on it for ``RETIRE_GRACE_S``."""
        if self.adapter is None or self._retired:
            return
        self._retired = True
        if self._open == 0:
            self._rt.unload_when_idle(self)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.adapter is not None:  # not a user of the runtime: the speakers are
            self.retire()
        else:
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


def _engine_config(cfg: OrpheusConfig, guard: str, model_dir: str) -> VllmEngineConfig:
    """The vLLM engine's settings for ``cfg`` (token guard resolved), no head yet."""
    from rtserver.engine.vllm_engine import VllmEngineConfig

    return VllmEngineConfig(
        model=model_dir, dummy_weights=cfg.dummy_weights, dtype=cfg.dtype,
        quantization=cfg.quantization,
        max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        gpu_memory_utilization=cfg.gpu_memory_utilization, kv_cache_gib=cfg.kv_cache_gib,
        kv_cache_dtype=cfg.kv_cache_dtype,
        enforce_eager=cfg.enforce_eager, cudagraph_mode=cfg.cudagraph_mode,
        later_hold_s=cfg.later_hold_ms / 1000,
        enable_prefix_caching=cfg.enable_prefix_caching,
        priority_scheduling=cfg.priority_scheduling,
        token_guard=guard,  # type: ignore[arg-type]
        tensor_parallel_size=cfg.tensor_parallel_size, seed=cfg.seed,
        stream_interval=cfg.stream_interval,
        max_loras=cfg.max_loras if cfg.lora_on else 0, max_lora_rank=cfg.max_lora_rank,
        max_adapters=cfg.max_adapters, profile_dir=cfg.profile_dir,
        engine_process=cfg.engine_process)  # type: ignore[arg-type]


def _resolve_head(cfg: OrpheusConfig, engine: VllmEngineConfig) -> VllmEngineConfig:
    """``engine`` with ``[orpheus] audio_head`` resolved into it: the head of
    the audio and end tokens where it can serve (``head_refusal``, the plugin
    installed, and vLLM's V2 model runner or no repetition penalty), else
    unchanged; ``ConfigError`` for "on" where it cannot run."""
    from rtserver.engine import vllm_plugin
    from rtserver.engine.vllm_engine import head_refusal, v2_model_runner_expected

    if cfg.audio_head == "off":
        return engine
    on = cfg.audio_head == "on"
    why = head_refusal(engine) or ("" if vllm_plugin.installed() else
                                   "rtserver's vLLM plugin (entry point "
                                   f"{vllm_plugin.ENTRY_POINT_GROUP}) is not installed: "
                                   "install rtserver (pip install .)")
    v2 = not why and v2_model_runner_expected()
    if not why and not v2 and (not on or cfg.sampling.repetition_penalty != 1.0):
        why = ("vLLM's V1 model runner (no CUDA GPU with Triton) serves it only with "
               "sampling repetition_penalty 1.0")
    if why:
        if on:
            raise ConfigError(f"[orpheus] audio_head 'on': {why}")
        return engine
    config = json.loads((Path(engine.model) / "config.json").read_text(encoding="utf-8"))
    head = HeadVocab.of([*range(ot.AUDIO_TOKENS_START, ot.AUDIO_TOKENS_END),
                         *ot.STOP_TOKEN_IDS], int(config["vocab_size"]))
    return dataclasses.replace(engine, head=head, head_without_penalties=not v2)


async def _build_runtime(cfg: OrpheusConfig) -> OrpheusRuntime:
    from tokenizers import Tokenizer

    from rtserver.engine.vllm_engine import VllmEngine
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
        engine = VllmEngine(_resolve_head(cfg, _engine_config(cfg, guard, model_dir)))
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
    runtime = OrpheusRuntime(cfg, engine, vocoder, tokenizer,
                             max_model_len=engine.max_model_len, temp_dir=temp_dir)
    try:
        for name, speaker, folder in cfg.adapter_specs():
            await runtime.add_adapter_voice(name, folder, speaker)
    except UnknownVoice as exc:  # a configured adapter that cannot serve: say so at start
        await vocoder.close()
        await engine.close()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise ConfigError(f"[orpheus] adapters: {exc.message}") from None
    return runtime


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
