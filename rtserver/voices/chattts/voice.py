"""ChatTTS voices on rtserver's torch engine and chattts-dec's streaming decoder.

A segment is normalised (``text``), laid out as upstream's code prompt
(``[Stts][spk_emb][speed_5]...[Ptts]``), tokenized, and sent to the engine
with the speaker vector (L2-normalised) in place of ``[spk_emb]``. Each step's
hidden state (route ``decoder``) or four codes (route ``dvae``) goes to the
segment's decoder stream as it arrives; the EOS step is not pushed (upstream
drops it). Cancelling ``synthesize`` aborts the engine request, which frees
its slot before the next step, and closes the decoder stream.

One engine and one decoder per process serve every speaker (``ChatTTSRuntime``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import tomllib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from rtserver.audio.pcm import PcmChunk
from rtserver.engine.base import CodeDelta, PromptEmbedding, SamplingSettings, TokenRequest
from rtserver.errors import ConfigError, EngineFailed, UnknownVoice
from rtserver.vocoder.base import Vocoder
from rtserver.voices.base import SPEED_RANGE, SpeechControls, SynthesisRequest, VoiceInfo
from rtserver.voices.chattts import text as ct
from rtserver.voices.chattts.capabilities import CAPABILITIES
from rtserver.voices.chattts.config import ChatTTSConfig
from rtserver.voices.chattts.speaker import decode_speaker, normalised
from rtserver.voices.token_voice import chunk_timing, mark_model_output, resolve_device

# What ChatTTS does with lexicons, SSML and speed (issue 29): aliases only (no
# phoneme input), speed through its ``[speed_N]`` prompt token (``speed_level``).
CONTROLS = SpeechControls(speed_range=SPEED_RANGE)

log = logging.getLogger(__name__)

FAMILY = "chattts"
SAMPLE_RATE = 24_000
SAMPLES_PER_STEP = 512  # one GPT step = 2 mel frames of hop 256 (upstream Vocos config)
STEPS_PER_SECOND = SAMPLE_RATE / SAMPLES_PER_STEP  # 46.875


class CodeEngineLike(Protocol):
    """The engine seam as the voice uses it (``TorchCodeEngine``)."""

    def generate(self, request: TokenRequest) -> AsyncIterator[CodeDelta[Any]]: ...

    def release_hidden(self, request_id: str) -> None: ...

    async def close(self) -> None: ...


class TokenizerLike(Protocol):
    spk_emb_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def has_token(self, token: str) -> bool: ...

    def token_id(self, token: str) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Speaker:
    name: str
    vector: npt.NDArray[np.float32]  # L2-normalised
    source: str  # "voices file" | "seed N"


def read_voices_file(path: str | Path, dim: int) -> dict[str, npt.NDArray[np.float32]]:
    """``name -> speaker vector`` from a TOML (``[speakers]`` table) or JSON
    object of upstream speaker strings; a bad string is ``UnknownVoice`` naming
    the speaker and the reason."""
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
        data: Any = json.loads(raw) if p.suffix == ".json" else tomllib.loads(raw)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ChatTTS voices file {p}: {exc}") from None
    if p.suffix != ".json":
        data = data.get("speakers", data)
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ConfigError(f"ChatTTS voices file {p}: expected name = \"speaker string\" pairs")
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, text in data.items():
        if not name or ":" in name or name.startswith("seed_"):
            raise ConfigError(f"ChatTTS voices file {p}: bad speaker name {name!r}")
        try:
            out[name] = decode_speaker(text, dim)
        except UnknownVoice as exc:
            raise UnknownVoice(f"ChatTTS speaker {name!r} in {p}: {exc.message}") from None
    return out


NO_STATS = ("no speaker statistics: the model folder has no asset/spk_stat.pt and "
            "chattts.speaker_stats is empty (upstream 0.2.5 keeps them in its package, "
            "ChatTTS/config/config.py Config.spk_stat, not in the files it downloads: put "
            "that string in chattts.speaker_stats)")


def read_homophones(path: str | Path) -> dict[str, str]:
    """Upstream's ``homophones_map.json`` (``ChatTTS/res/``, in its package, not
    in the model download): character -> character."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"chattts.homophones_file {path}: {exc}") from None
    if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) == 1 and len(v) == 1
            for k, v in data.items()):
        raise ConfigError(f"chattts.homophones_file {path}: not a map of single characters")
    return data


def step_budget(text: str, cfg: ChatTTSConfig) -> int:
    """Steps a segment may take: base + per character (CJK ones slower)."""
    cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    other = sum(1 for ch in text if ch.isalnum()) - cjk
    seconds = cfg.budget_base_s + cfg.budget_s_per_cjk * cjk + cfg.budget_s_per_char * other
    return max(1, math.ceil(seconds * STEPS_PER_SECOND))


class ChatTTSRuntime:
    """The shared parts: engine, decoder, tokenizer, speakers."""

    def __init__(self, cfg: ChatTTSConfig, engine: CodeEngineLike, decoder: Vocoder[Any],
                 tokenizer: TokenizerLike, speakers: dict[str, Speaker], *,
                 eos_id: int, max_len: int, chunking: Any = None,
                 sample_stats: Callable[[int], npt.NDArray[np.float32]] | None = None,
                 homophones: Mapping[str, str] | None = None,
                 collector_stats: Callable[[], Any] | None = None) -> None:
        self.config = cfg
        self.engine = engine
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.speakers = speakers
        self.eos_id = eos_id
        self.max_len = max_len
        self.chunking = chunking
        self._sample = sample_stats
        self.homophones = homophones
        self._voices: dict[str, ChatTTSVoice] = {}
        self._users = 0
        self.closed = False
        self.failed_pushes = 0
        self.sampling = SamplingSettings(
            temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            repetition_penalty=cfg.repetition_penalty,
            seed=None if cfg.seed < 0 else cfg.seed)

    def speaker(self, name: str) -> Speaker:
        """A named speaker, or ``seed_<N>`` sampled from the speaker statistics."""
        sp = self.speakers.get(name)
        if sp is not None:
            return sp
        if name.startswith("seed_") and name[5:].isdigit():
            if self._sample is None:
                raise UnknownVoice(f"ChatTTS speaker {name}: {NO_STATS}")
            sp = Speaker(name, normalised(self._sample(int(name[5:]))), f"seed {name[5:]}")
            self.speakers[name] = sp
            return sp
        known = ", ".join(self.speakers) or "none"
        raise UnknownVoice(f"ChatTTS has no speaker {name!r} (named: {known}; or seed_<N>)")

    def voice(self, name: str) -> ChatTTSVoice:
        v = self._voices.get(name)
        if v is None:
            v = self._voices[name] = ChatTTSVoice(self, self.speaker(name))
            self._users += 1
        return v

    def all_voices(self) -> list[ChatTTSVoice]:
        return [self.voice(n) for n in list(self.speakers)]

    def counters(self) -> dict[str, tuple[str, float]]:
        out: dict[str, tuple[str, float]] = {}
        extra = getattr(self.engine, "counters", None)
        if callable(extra):
            out |= extra()
        stats = getattr(self.decoder, "stats", None)
        for name in ("calls", "windows", "frames", "padded_frames", "decode_seconds"):
            value = getattr(stats, name, None)
            if isinstance(value, int | float):
                out[f"chattts_decoder_{name}"] = (f"ChatTTS decoder {name.replace('_', ' ')}",
                                                  value)
        window_decoder = getattr(self.decoder, "decoder", None)
        computed = getattr(window_decoder, "computed_steps", None)
        if isinstance(computed, int):
            out["chattts_decoder_computed_frames"] = (
                "ChatTTS decoder frames computed, batch and CUDA-graph padding included",
                computed)
        return out

    def prompt_ids(self, text: str, speed: float = 1.0) -> list[int]:
        """The code prompt of ``text`` (normalised), no refine pass; [] if nothing is left.
        ``speed``: a context's speed, scaling the configured ``[speed_N]``."""
        norm = ct.normalise(text, homophones=self.homophones)
        return self._code_ids(norm, speed) if norm else []

    def _code_ids(self, text: str, speed: float = 1.0) -> list[int]:
        return self.tokenizer.encode(ct.code_prompt(text, prompt=ct.speed_prompt(
            ct.speed_level(self.config.speed, speed))))

    async def refined_prompt_ids(self, text: str, request_id: str, speed: float = 1.0
                                 ) -> list[int]:
        """``prompt_ids`` after upstream's refine-text pass (``Chat._refine_text``):
        the GPT rewrites the normalised text with prosody tokens, ids from
        ``[break_0]`` up are dropped (upstream ``i.less(break_0_ids)``), and the
        decoded text becomes the code prompt."""
        norm = ct.normalise(text, homophones=self.homophones)
        if not norm:
            return []
        refine = getattr(self.engine, "refine", None)
        stop = self.tokenizer.token_id("[Ebreak]")
        if refine is None or stop is None:
            raise EngineFailed("this ChatTTS engine or tokenizer cannot refine text")
        cfg = self.config
        ids = await refine(TokenRequest(
            request_id=f"{request_id}-refine",
            prompt_token_ids=tuple(self.tokenizer.encode(ct.refine_prompt(norm))),
            max_tokens=cfg.refine_max_tokens, stop_token_ids=(stop,),
            sampling=SamplingSettings(temperature=cfg.refine_temperature, top_p=cfg.top_p,
                                      top_k=cfg.top_k, repetition_penalty=1.0,
                                      seed=self.sampling.seed)))
        cut = self.tokenizer.token_id("[break_0]")
        kept = [t for t in ids if cut is None or t < cut]
        refined = self.tokenizer.decode(kept).strip()
        return self._code_ids(refined or norm, speed)

    async def release(self) -> None:
        self._users -= 1
        if self._users > 0 or self.closed:
            return
        self.closed = True
        try:
            await self.decoder.close()
        finally:
            await self.engine.close()


class ChatTTSVoice:
    """A ``Voice``: one ChatTTS speaker (``chattts:<speaker>``)."""

    def __init__(self, runtime: ChatTTSRuntime, speaker: Speaker) -> None:
        self._rt = runtime
        self.speaker = speaker
        # every request's [spk_emb] vector: one frozen tuple of the voice's, not a
        # 768-float tuple built again a segment (~80 us on the worker's event loop)
        self._embedding = PromptEmbedding(runtime.tokenizer.spk_emb_id,
                                          tuple(speaker.vector.tolist()))
        plan_ms, cost_ms = chunk_timing(runtime.chunking, SAMPLE_RATE,
                                        frame_ms=1000.0 / STEPS_PER_SECOND)
        self._info = VoiceInfo(
            name=f"{FAMILY}:{speaker.name}", family=FAMILY, sample_rate=SAMPLE_RATE,
            language="zh", description=f"ChatTTS speaker {speaker.name} ({speaker.source})",
            chunk_plan_ms=plan_ms, chunk_cost_ms=cost_ms, capabilities=CAPABILITIES,
            controls=CONTROLS, languages=("zh", "en"),  # upstream's normalizer reads either
            batch_rows=runtime.config.slots)
        self._closed = False

    @property
    def info(self) -> VoiceInfo:
        return self._info

    @property
    def runtime(self) -> ChatTTSRuntime:
        return self._rt

    async def warm_up(self) -> None:
        req = SynthesisRequest(text="Warming up.", request_id=f"warmup-{self.speaker.name}",
                               first=True)
        async for _ in self.stream(req, max_steps=self._rt.config.warm_up_steps):
            pass

    def token_request(self, request: SynthesisRequest, *, max_steps: int | None = None,
                      ids: list[int] | None = None) -> TokenRequest | None:
        """The engine request of a segment (``ids``: its prompt, already built);
        None when nothing in it is speakable."""
        rt = self._rt
        if ids is None:
            ids = rt.prompt_ids(request.text, request.speed)
        if not ids:
            return None
        room = rt.max_len - len(ids) - 1
        if room < 1:
            raise EngineFailed(f"segment of {len(request.text)} characters leaves no room "
                               f"for audio in a {rt.max_len}-position slot")
        budget = min(step_budget(request.text, rt.config), room)
        if max_steps is not None:
            budget = min(budget, max_steps)
        return TokenRequest(
            request_id=request.request_id, prompt_token_ids=tuple(ids), max_tokens=budget,
            sampling=rt.sampling, stop_token_ids=(rt.eos_id,),
            priority=0 if request.first else 1,
            want_hidden=rt.config.decoder == "decoder",
            embeddings=(self._embedding,))

    def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]:
        return self.stream(request)

    async def stream(self, request: SynthesisRequest, *, max_steps: int | None = None
                     ) -> AsyncGenerator[PcmChunk, None]:
        """``synthesize`` with the step budget capped at ``max_steps``."""
        if self._closed:
            raise EngineFailed("the voice is closed")
        ids = (await self._rt.refined_prompt_ids(request.text, request.request_id,
                                                 request.speed)
               if self._rt.config.refine_text else None)
        treq = self.token_request(request, max_steps=max_steps, ids=ids)
        if treq is None:
            return
        eos = self._rt.eos_id
        hidden_route = treq.want_hidden
        stream = self._rt.decoder.open_stream(held_s=request.held_s())
        try:
            steps = self._rt.engine.generate(treq)
            async with contextlib.aclosing(steps):  # type: ignore[type-var]
                async for delta in steps:
                    # hidden states (or their indices in the engine's store), or codes;
                    # the EOS step is not audio. Plain tuple tests: a delta holds a few
                    # steps, and this runs for every delta of every stream on the loop
                    x = delta.hidden if hidden_route else np.asarray(delta.codes,
                                                                     dtype=np.int64)
                    if any(eos in step for step in delta.codes):
                        keep = [eos not in step for step in delta.codes]
                        if not any(keep):
                            continue
                        x = np.asarray(x)[np.asarray(keep)]
                    mark_model_output(request)
                    try:
                        chunks = await stream.push(x)
                    except ValueError as exc:
                        self._rt.failed_pushes += 1
                        raise EngineFailed(f"request {request.request_id}: the decoder "
                                           f"refused the model output: {exc}") from exc
                    for chunk in chunks:
                        yield chunk
            for chunk in await stream.finish():
                yield chunk
        finally:
            stream.close()
            # its store rows are read no more (decodes of a closed stream are dropped)
            self._rt.engine.release_hidden(treq.request_id)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._rt.release()


# --- loading -----------------------------------------------------------------

_RUNTIME: asyncio.Future[ChatTTSRuntime] | None = None


async def build_runtime(cfg: ChatTTSConfig, progress: Callable[[str], None] = lambda m: None
                        ) -> ChatTTSRuntime:
    """Load the assets, start the engine and the decoder."""
    import torch

    from rtserver.voices.chattts.assets import load_lm_assets
    from rtserver.voices.chattts.decoder.config import ChatTTSDecodeConfig
    from rtserver.voices.chattts.decoder.stream import ChatTTSVocoder
    from rtserver.voices.chattts.engine.engine import TorchCodeEngine, TorchEngineConfig
    from rtserver.voices.chattts.engine.model import ChatLM

    try:
        cfg.check()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not cfg.asset_dir:
        raise ConfigError("ChatTTS needs chattts.asset_dir (the folder holding asset/)")
    device = resolve_device(cfg.device)
    dtype_name = cfg.dtype if cfg.dtype != "auto" else (
        "bfloat16" if device.startswith("cuda") else "float32")
    dtype = getattr(torch, dtype_name)
    progress(f"loading ChatTTS from {cfg.asset_dir}")
    assets = await asyncio.to_thread(load_lm_assets, cfg.asset_dir,
                                     speaker_stats=cfg.speaker_stats)
    gcfg = assets.config
    if cfg.seeds and assets.speaker_stats is None:  # before any engine starts
        raise UnknownVoice(f"ChatTTS seeded speakers {list(cfg.seeds)}: {NO_STATS}")
    named: dict[str, Speaker] = {}
    if cfg.voices_file:
        for name, vec in read_voices_file(cfg.voices_file, gcfg.hidden_size).items():
            named[name] = Speaker(name, normalised(vec), "voices file")
    max_len = min(cfg.max_len, gcfg.max_position_embeddings)
    if max_len < cfg.max_len:
        log.info("chattts.max_len %d capped at the model's max_position_embeddings %d",
                 cfg.max_len, max_len)

    def factory() -> ChatLM:
        return ChatLM(gcfg, assets.gpt, assets.embed, slots=cfg.slots, max_len=max_len,
                      device=device, dtype=dtype, attention=cfg.decode_attention)

    engine = TorchCodeEngine(factory, TorchEngineConfig(
        slots=cfg.slots, max_len=max_len, cuda_graphs=cfg.cuda_graphs,
        move_graphs=cfg.move_graphs, prefill_tokens=cfg.prefill_tokens, max_waiting=cfg.max_waiting,
        max_queue_s=cfg.max_queue_s, retry_after_ms=cfg.retry_after_ms,
        ignore_eos=cfg.ignore_eos, eager_steps=cfg.eager_steps,
        hidden_store=cfg.hidden_store,
        text_slots=cfg.refine_slots if cfg.refine_text else 0,
        text_max_len=min(max_len, 1024),
        stream_interval=max(1, cfg.stream_interval)),
        eos_id=gcfg.eos_id, name="chattts")
    progress("starting the ChatTTS engine")
    await engine.start()
    try:
        bf16 = cfg.decoder_dtype == "bfloat16" or (
            cfg.decoder_dtype == "auto" and str(device).startswith("cuda"))
        hold_s = cfg.decoder_hold_ms / 1000 if cfg.decoder_hold_ms >= 0 else -1.0
        dec_cfg = ChatTTSDecodeConfig(route=cfg.decoder, bf16=bf16, hold_s=hold_s,
                                      deep_chunk_frames=cfg.decoder_deep_steps,
                                      finite_input=engine.hands_over_finite)
        vocoder = await asyncio.to_thread(ChatTTSVocoder.load, Path(cfg.asset_dir),
                                          device=device, config=dec_cfg)
        if engine.hidden_store is not None:
            vocoder.attach_store(engine.hidden_store, engine.store_zero_index)
        await vocoder.start()
    except BaseException:
        await engine.close()
        raise
    stats = assets.speaker_stats
    homophones = read_homophones(cfg.homophones_file) if cfg.homophones_file else None
    runtime = ChatTTSRuntime(cfg, engine, vocoder, assets.tokenizer, named,
                             homophones=homophones,
                             eos_id=gcfg.eos_id, max_len=max_len,
                             chunking=getattr(vocoder, "chunking", None),
                             sample_stats=stats.sample if stats is not None else None)
    for seed in cfg.seeds:
        runtime.speaker(f"seed_{seed}")
    return runtime


async def load_runtime(cfg: ChatTTSConfig, progress: Callable[[str], None] = lambda m: None
                       ) -> ChatTTSRuntime:
    """The process's runtime (one engine per process), started once and shared."""
    global _RUNTIME
    fut = _RUNTIME
    if fut is not None and fut.done() and fut.result().closed:
        fut = None
    if fut is None:
        fut = _RUNTIME = asyncio.get_running_loop().create_future()
        try:
            fut.set_result(await build_runtime(cfg, progress))
        except BaseException as exc:
            _RUNTIME = None
            fut.set_exception(exc)
            fut.exception()  # retrieved: waiters get it from ``await fut``
            raise
        return fut.result()
    rt = await fut
    if rt.config != cfg:
        raise ConfigError("one ChatTTS engine per process: every chattts voice must use the "
                          "same settings")
    return rt


def speaker_of(spec: str, cfg: ChatTTSConfig, named: Sequence[str]) -> str:
    """``chattts:<speaker>`` -> speaker name; plain ``chattts``: the default one."""
    _, _, name = spec.partition(":")
    if name:
        return name
    if cfg.speaker:
        return cfg.speaker
    if named:
        return named[0]
    if cfg.seeds:
        return f"seed_{cfg.seeds[0]}"
    raise UnknownVoice("chattts: no speaker configured (voices_file, seeds or speaker)")
