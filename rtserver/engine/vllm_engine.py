"""The vLLM token engine: one ``AsyncLLM`` per process, token-id prompts in,
DELTA streams of token ids out.

- Prompts are ``TokensPrompt`` (we tokenize), outputs ``RequestOutputKind.DELTA``
  with ``detokenize=False``: each delta is handed on as soon as it is sampled.
- Cancel: closing or cancelling the consumer of ``generate`` aborts the request
  (vLLM frees its KV blocks at once); ``abort(request_id)`` does it from outside.
- ``scheduling_policy="priority"``: a context's first segment (priority 0) is
  scheduled ahead of later segments (1). Prefix caching keeps the voice's prompt
  prefix (``<custom_token_3><|begin_of_text|>tara:``) warm.
- Valid tokens only: a ``CyclicTokenMask`` is enforced while sampling by
  ``CyclicMaskLogitsProcessor`` (engine/vllm_mask.py). Registering a custom
  logits processor makes vLLM 0.26 pick its V1 model runner; its V2 runner
  rejects custom processors, and caps ``allowed_token_ids`` at 1024 ids
  (``MAX_NUM_ALLOWED_TOKEN_IDS``), less than Orpheus' 28,672 audio tokens.
  ``token_guard="allowed"`` uses ``allowed_token_ids`` (V1 runner only)
  instead; ``"none"`` leaves checking to the voice and lets vLLM pick the V2
  runner, whose penalties and sampling run on the GPU: on an H200 at 128
  streams, Orpheus-3B shapes, 23.5k tokens/s against 16.9k with the mask on V1
  (bench/results/h200-orpheus-v2-2026-12-02).
- Logits head (``head``, engine/head_vocab.py and engine/vllm_head.py): the
  model computes logits for a few ids only (Orpheus' audio and end tokens);
  its vocabulary is renumbered head first, so prompts and stop ids are mapped
  on the way in and every delta on the way out: callers keep the
  checkpoint's ids.
- LoRA (``max_loras`` > 0): each request may carry an ``Adapter``, sent as its
  ``LoRARequest``; vLLM batches up to ``max_loras`` adapters in one step.
  ``add_adapter`` loads an adapter through vLLM's ``add_lora`` first, which
  reads and checks it (PEFT config, rank, target modules, shapes) and raises
  without harm; a request carrying an adapter vLLM cannot load would
  instead fail inside the engine step and kill the engine (vLLM 0.32 on the
  CPU did: ``EngineDeadError``), so ``generate`` refuses adapters not added.
  ``max_cpu_loras`` (``max_adapters``) bounds the adapters kept loaded; more
  than that are refused rather than evicted (an evicted adapter is read again
  from its folder at request time, with the same risk).
- ``engine_process = "inproc"``: an ``LLMEngine`` in this process stepped by
  a thread of ours behind the same surface (``engine/vllm_inproc.py``), so a
  vocoder in this process shares vLLM's CUDA context (two contexts on one GPU
  are time-sliced).
- Stats (engine/vllm_stats.py): a ``StatLoggerBase`` fed by vLLM after every
  engine step (running, waiting, KV cache usage, prefix cache, tokens, steps
  and those that gave a request its first token) plus our own time to the
  first, the 7th and the 28th token, measured from submitting to the delta
  that carries it, as the voice sees it.
- CUDA graphs (``cudagraph_mode``, engine/graph_mode.py): "auto" is vLLM's FULL
  mode on a CUDA GPU, which graphs the many steps that hold a prefill (each
  text segment is a request) whole instead of piecewise, with the tokens a
  step capped at vLLM's largest graph.
- ``later_hold_s`` > 0: a request of priority > 0 waits at a ``SubmitGate``
  (engine/submit_gate.py) to go to vLLM with the next urgent one or with the
  others held, so fewer steps hold a prefill.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from vllm import SamplingParams, TokensPrompt
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind

from rtserver.clock import SYSTEM_CLOCK, Clock
from rtserver.engine.base import (
    Adapter,
    EngineStats,
    TokenRequest,
)
from rtserver.engine.graph_mode import graph_settings
from rtserver.engine.head_vocab import HeadVocab
from rtserver.engine.quantization import declared_quantization, resolve_quantization
from rtserver.engine.submit_gate import SubmitGate
from rtserver.engine.vllm_mask import CyclicMaskLogitsProcessor, mask_extra_args
from rtserver.engine.vllm_stats import LiveStats, StepCounters, stat_loggers
from rtserver.errors import BadAdapter, ConfigError, EngineDead, EngineFailed

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

    from rtserver.engine.vllm_inproc import InprocLLM

log = logging.getLogger(__name__)

TokenGuard = Literal["mask", "allowed", "none"]
GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """Settings of the one ``AsyncLLM``. ``model``: a local HF folder."""

    model: str
    dummy_weights: bool = False  # vLLM load_format="dummy": random weights, real speed
    dtype: str = "auto"
    # Weight quantization ("" or a method of rtserver.engine.quantization):
    # reconciled with the checkpoint's own quantization_config before it
    # reaches vLLM's ``quantization`` (see that module).
    quantization: str = ""
    max_model_len: int = 4096
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = 0.9
    # KV cache size in GiB; None: vLLM's default (GPU: from gpu_memory_utilization;
    # CPU: VLLM_CPU_KVCACHE_SPACE).
    kv_cache_gib: float | None = None
    # vLLM's kv_cache_dtype: "auto" (the model's dtype) or an fp8 format, which
    # halves what a decode step's attention reads per cached token.
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    # vLLM's CompilationConfig.cudagraph_mode by name (e.g. "FULL"), or "auto":
    # FULL on a CUDA GPU, vLLM's own choice elsewhere (engine/graph_mode.py, which
    # also caps max_num_batched_tokens under FULL). vLLM itself falls back to
    # FULL_AND_PIECEWISE where the attention backend cannot graph mixed batches
    # (FlashAttention 2: before Hopper).
    cudagraph_mode: str = "auto"
    # A request of priority > 0 (a later segment) waits up to this long to go
    # to vLLM together with others (engine/submit_gate.py): fewer steps hold a
    # prefill. 0: each request goes at once.
    later_hold_s: float = 0.0
    enable_prefix_caching: bool = True
    priority_scheduling: bool = True
    token_guard: TokenGuard = "mask"
    tensor_parallel_size: int = 1
    seed: int = 0
    # Tokens per streamed delta after the first (vLLM's stream_interval): fewer,
    # larger deltas cost the frontend less under load; 1: every token at once.
    stream_interval: int = 1
    # vLLM's own request logging (one line per request); off for speed.
    log_requests: bool = False
    # LoRA: adapters in one batch (vLLM max_loras); 0: LoRA off.
    max_loras: int = 0
    max_lora_rank: int = 64  # the largest adapter rank (vLLM: 1, 8, 16, 32, 64, 128, ...)
    max_adapters: int = 32  # adapters kept loaded at once (vLLM max_cpu_loras)
    # "separate": EngineCore in its own process (AsyncLLM); "inproc": in this
    # process, stepped by a thread of ours (engine/vllm_inproc.py), so the
    # vocoder's kernels share its CUDA context instead of time-slicing with it.
    engine_process: Literal["separate", "inproc"] = "separate"
    # A folder: EngineCore records torch profiler traces there between
    # start_profile and stop_profile (GPU timelines, issue 24); "": off.
    profile_dir: str = ""
    # Logits for these ids only (engine/vllm_head.py): the model's vocabulary is
    # renumbered head first; prompts, stop ids and outputs are mapped here, so
    # requests and deltas keep the checkpoint's ids. Only where ``head_refusal``
    # finds nothing; None: the whole vocabulary.
    head: HeadVocab | None = None
    # vLLM's V1 model runner (the CPU's) cannot serve a head with penalties:
    # True lets the head model start there and refuses requests with a
    # repetition penalty (the CPU tests' setting).
    head_without_penalties: bool = False



def head_refusal(config: VllmEngineConfig) -> str:
    """Why a logits head (``VllmEngineConfig.head``) cannot serve these
    settings, "" when it can: the head model (engine/vllm_head.py) keeps out
    every other id itself, and its reordered rows assume one GPU, no LoRA and
    an unquantized embedding (a checkpoint's own quantization, or a method
    other than fp8, which leaves the embedding alone)."""
    if config.token_guard != "none":
        return f"token_guard is {config.token_guard!r}, not 'none'"
    if config.tensor_parallel_size != 1:
        return "tensor_parallel_size is not 1"
    if config.max_loras > 0:
        return "LoRA is on"
    if config.quantization not in ("", "fp8"):
        return f"quantization is {config.quantization!r}"
    try:
        declared = declared_quantization(config.model)
    except ValueError as exc:
        return str(exc)
    return f"the checkpoint is quantized ({declared})" if declared is not None else ""


def v2_model_runner_expected() -> bool:
    """Whether vLLM will run its V2 model runner for a dense model here, by
    vLLM's own rule (0.26 ``VllmConfig.use_v2_model_runner``): the
    ``VLLM_USE_V2_MODEL_RUNNER`` override if set, else a CUDA GPU with
    Triton usable (``vllm.triton_utils.HAS_TRITON``)."""
    import vllm.envs as envs
    from vllm.triton_utils import HAS_TRITON

    forced = envs.VLLM_USE_V2_MODEL_RUNNER
    if forced is not None:
        return bool(forced)
    return bool(HAS_TRITON) and torch.cuda.is_available()


# --- the engine ----------------------------------------------------------------

class VllmEngine:
    """``TokenEngine`` over vLLM's ``AsyncLLM`` (see the module docstring).

    Create the engine in the process's ``__main__`` guard: vLLM starts its
    engine-core process with ``spawn`` on the CPU.
    """

    def __init__(self, config: VllmEngineConfig, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self._clock = clock  # times to the first, 7th and 28th token
        self._llm: AsyncLLM | InprocLLM | None = None
        self._live = LiveStats()
        self._open: set[str] = set()
        self._dead: BaseException | None = None
        self._adapters: dict[int, Adapter] = {}  # added, by id
        self.gate = SubmitGate(config.later_hold_s)

    # lifecycle -------------------------------------------------------------

    def engine_args(self) -> AsyncEngineArgs:
        c = self.config
        if not os.path.isdir(c.model):
            raise ConfigError(f"model folder {c.model} does not exist")
        if c.head is not None and (why := head_refusal(c)):
            raise ConfigError(f"a logits head cannot serve model {c.model}: {why}")
        kwargs: dict[str, Any] = {}
        quantization = self.quantization()
        if quantization is not None:
            kwargs["quantization"] = quantization
        if c.kv_cache_gib is not None:
            kwargs["kv_cache_memory_bytes"] = int(c.kv_cache_gib * GiB)
        mode, tokens = graph_settings(c.cudagraph_mode, c.max_num_seqs,
                                      c.max_num_batched_tokens,
                                      cuda=current_platform.is_cuda(), eager=c.enforce_eager)
        if tokens is not None:
            kwargs["max_num_batched_tokens"] = tokens
        if mode is not None:
            kwargs["compilation_config"] = {"cudagraph_mode": mode}
        if c.token_guard == "mask":
            kwargs["logits_processors"] = [CyclicMaskLogitsProcessor]
        if c.head is not None:
            from rtserver.engine import vllm_plugin

            vllm_plugin.register()  # this process resolves the architecture too
            kwargs["hf_overrides"] = {
                "architectures": [vllm_plugin.HEAD_ARCHITECTURE],
                vllm_plugin.HF_HEAD_RANGES: [list(r) for r in c.head.ranges],
                vllm_plugin.HF_HEAD_ALLOW_V1: c.head_without_penalties}
        if c.max_loras > 0:
            kwargs |= {"enable_lora": True, "max_loras": c.max_loras,
                       "max_lora_rank": c.max_lora_rank,
                       "max_cpu_loras": max(c.max_adapters, c.max_loras)}
        return AsyncEngineArgs(
            model=c.model,
            load_format="dummy" if c.dummy_weights else "auto",
            skip_tokenizer_init=True,  # prompts arrive as ids; outputs stay ids
            dtype=c.dtype,  # type: ignore[arg-type]
            seed=c.seed,
            max_model_len=c.max_model_len,
            max_num_seqs=c.max_num_seqs,
            kv_cache_dtype=c.kv_cache_dtype,  # type: ignore[arg-type]
            gpu_memory_utilization=c.gpu_memory_utilization,
            enforce_eager=c.enforce_eager,
            enable_prefix_caching=c.enable_prefix_caching,
            scheduling_policy="priority" if c.priority_scheduling else "fcfs",
            tensor_parallel_size=c.tensor_parallel_size,
            stream_interval=c.stream_interval,
            **self._profiler_args(),
            # Stats reach us through our StatLoggerBase; vLLM's own periodic
            # log lines stay off.
            disable_log_stats=True,
            enable_log_requests=c.log_requests,
            **kwargs,
        )

    def _profiler_args(self) -> dict[str, Any]:
        if not self.config.profile_dir:
            return {}
        from vllm.config import ProfilerConfig

        # the engine core only: the worker records its own process itself
        # (rtserver/worker/profile.py), with CUDA kernels, which vLLM's
        # frontend profiler leaves out (CPU activity only)
        return {"profiler_config": ProfilerConfig(
            profiler="torch", torch_profiler_dir=self.config.profile_dir,
            torch_profiler_with_stack=False, ignore_frontend=True)}

    async def start_profile(self) -> None:
        if self._llm is not None and self.config.profile_dir:
            await self._llm.start_profile()

    async def stop_profile(self) -> None:
        if self._llm is not None and self.config.profile_dir:
            await self._llm.stop_profile()

    def quantization(self) -> str | None:
        """vLLM's ``quantization`` argument: None leaves the choice to vLLM (no
        quantization, or the checkpoint's). ``ConfigError`` when the setting
        contradicts the checkpoint."""
        try:
            return resolve_quantization(self.config.quantization,
                                        declared_quantization(self.config.model))
        except ValueError as exc:
            raise ConfigError(f"model {self.config.model}: {exc}") from None

    async def start(self) -> None:
        if self._llm is not None:
            return
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self.engine_args()
        loggers = stat_loggers(self._live)
        # Loading takes seconds to minutes: keep the event loop serving /health.
        try:
            if self.config.engine_process == "inproc":
                from rtserver.engine.vllm_inproc import InprocLLM

                inproc = await asyncio.to_thread(InprocLLM.from_engine_args, args,
                                                 stat_loggers=loggers)
                inproc.start(asyncio.get_running_loop())
                self._llm = inproc
            else:
                self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, args,
                                                    stat_loggers=loggers)
        except Exception as exc:
            raise ConfigError(f"vLLM failed to start on {self.config.model}: {exc}") from exc

    async def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)

    @property
    def max_model_len(self) -> int:
        llm = self._llm
        return int(llm.model_config.max_model_len) if llm else self.config.max_model_len

    @property
    def healthy(self) -> bool:
        return self._llm is not None and self._dead is None and not self._llm.errored

    def dead_reason(self) -> str | None:
        """Why vLLM is gone for good (a request saw ``EngineDeadError``, or its
        engine core process died: ``AsyncLLM.errored``, which vLLM's monitor
        of the core's process sets with no request in flight), else None."""
        if self._dead is not None:
            return f"vLLM died: {type(self._dead).__name__}: {self._dead}"
        llm = self._llm
        if llm is not None and llm.errored:
            return "vLLM's engine core died"
        return None

    # requests --------------------------------------------------------------

    def sampling_params(self, request: TokenRequest) -> SamplingParams:
        s = request.sampling
        extra: dict[str, Any] | None = None
        allowed: list[int] | None = None
        if request.mask is not None:
            if self.config.token_guard == "mask":
                extra = mask_extra_args(request.mask)
            elif self.config.token_guard == "allowed":
                allowed = request.mask.allowed_ids()
        head = self.config.head
        stop = list(request.stop_token_ids)
        top_k = max(s.top_k, 0)
        if head is not None:
            if any(not head.in_head(t) for t in stop):
                raise EngineFailed(f"stop ids {stop} lie outside the model's logits head")
            if self.config.head_without_penalties and s.repetition_penalty != 1.0:
                raise EngineFailed("this engine's logits head serves no repetition penalty "
                                   f"(asked {s.repetition_penalty})")
            stop = head.to_model(stop)
            top_k = min(top_k, head.head_size)
        return SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=top_k,
            repetition_penalty=s.repetition_penalty,
            seed=s.seed,
            max_tokens=request.max_tokens,
            stop_token_ids=stop,
            allowed_token_ids=allowed,
            extra_args=extra,
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
        )

    async def generate(self, request: TokenRequest) -> AsyncGenerator[Sequence[int], None]:
        llm = self._llm
        if llm is None:
            raise EngineFailed("the vLLM engine is not started")
        if self._dead is not None or llm.errored:
            raise EngineDead("the vLLM engine has died")
        params = self.sampling_params(request)
        lora = self._lora_request(request.adapter)
        head = self.config.head
        prompt = TokensPrompt(prompt_token_ids=head.to_model(request.prompt_token_ids)
                              if head is not None else list(request.prompt_token_ids))
        priority = request.priority if self.config.priority_scheduling else 0
        rid = request.request_id
        live = self._live
        now = self._clock.now
        started = now()  # the gate's hold counts in the time to the first token
        await self.gate.wait(urgent=request.priority <= 0)
        live.requests += 1
        self._open.add(rid)
        count = 0  # tokens so far, for the times to the first, 7th and 28th
        finished = False
        try:
            stream = llm.generate(prompt, params, rid, priority=priority, lora_request=lora)
            async with contextlib.aclosing(stream):
                async for out in stream:
                    completion = out.outputs[0] if out.outputs else None
                    ids = completion.token_ids if completion is not None else ()
                    if out.finished:
                        finished = True
                    if ids:
                        before, count = count, count + len(ids)
                        live.times.observe(before, count, now() - started)
                        yield head.from_model(ids) if head is not None else ids
                    if completion is not None and completion.finish_reason == "abort":
                        live.aborted += 1
        except Exception as exc:
            finished = True  # vLLM aborts a request whose generate() failed
            live.failed += 1
            from vllm.v1.engine.exceptions import EngineDeadError

            if isinstance(exc, EngineDeadError) or llm.errored:
                self._dead = exc
                raise EngineDead(f"vLLM died during request {rid}: {type(exc).__name__}: "
                                 f"{exc}") from exc
            raise EngineFailed(f"vLLM failed request {rid}: {type(exc).__name__}: {exc}"
                               ) from exc
        finally:
            self._open.discard(rid)
            if not finished:
                # Consumer gone (cancel, aclose): vLLM's generate() aborts on
                # CancelledError/GeneratorExit; abort again by id in case the
                # stream was closed between two outputs. Unknown ids are no-ops.
                live.aborted += 1
                await self._abort_quietly(llm, rid)

    # LoRA -----------------------------------------------------------------------

    @property
    def adapters(self) -> list[Adapter]:
        """The adapters added and not removed."""
        return list(self._adapters.values())

    async def add_adapter(self, adapter: Adapter) -> None:
        """Load ``adapter`` in vLLM (it reads and checks the folder now);
        ``BadAdapter`` with vLLM's reason if it cannot serve."""
        from vllm.lora.request import LoRARequest

        llm = self._llm
        if llm is None:
            raise EngineFailed("the vLLM engine is not started")
        if self.config.max_loras <= 0:
            raise BadAdapter(f"adapter {adapter.name}: LoRA is off for this model "
                             "(set max_loras)")
        if adapter.id in self._adapters:
            raise BadAdapter(f"adapter {adapter.name}: id {adapter.id} is taken")
        if len(self._adapters) >= self.config.max_adapters:
            raise BadAdapter(f"adapter {adapter.name}: {self.config.max_adapters} adapters are "
                             "loaded already (max_adapters); remove one first")
        try:
            await llm.add_lora(LoRARequest(adapter.name, adapter.id, adapter.path))
        except Exception as exc:
            if llm.errored:
                raise EngineDead(f"vLLM died loading adapter {adapter.name}: {exc}") from exc
            raise BadAdapter(f"adapter {adapter.name}: {_lora_reason(exc)}") from None
        self._adapters[adapter.id] = adapter

    async def remove_adapter(self, adapter: Adapter) -> None:
        if self._adapters.pop(adapter.id, None) is None:
            return
        llm = self._llm
        if llm is not None and not llm.errored:
            try:
                await llm.remove_lora(adapter.id)
            except Exception as exc:
                log.warning("removing adapter %s from vLLM failed: %s", adapter.name, exc)

    def _lora_request(self, adapter: Adapter | None) -> Any:
        if adapter is None:
            return None
        if self._adapters.get(adapter.id) != adapter:
            # never let vLLM meet an adapter it has not checked (see the module docstring)
            raise BadAdapter(f"adapter {adapter.name} is not loaded")
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter.name, adapter.id, adapter.path)

    async def _abort_quietly(self, llm: AsyncLLM | InprocLLM, request_id: str) -> None:
        try:
            await llm.abort(request_id)
        except Exception as exc:  # engine already gone: nothing is held any more
            log.debug("abort of %s failed: %s", request_id, exc)

    async def abort(self, request_id: str) -> None:
        llm = self._llm
        if llm is not None:
            await self._abort_quietly(llm, request_id)

    def stats(self) -> EngineStats:
        return self._live.snapshot(in_flight=len(self._open))

    def step_counters(self) -> StepCounters:
        """Running totals of engine steps; the difference of two is a window's
        decode step time (``StepCounters.since``)."""
        live = self._live
        return StepCounters(steps=live.steps, generation_tokens=live.generation_tokens,
                            itl_sum_s=live.itl_sum, itl_count=live.itl_n,
                            prefill_steps=live.prefill_steps)

    def unfinished_requests(self) -> int:
        """Requests vLLM's frontend still tracks (0 once every abort landed)."""
        llm = self._llm
        return llm.get_num_unfinished_requests() if llm is not None else 0


def _lora_reason(exc: BaseException) -> str:
    """vLLM's reason for refusing an adapter, without its wrapping ("Call to
    add_lora method failed: Worker failed with error '...', please check ...")."""
    text = str(exc)
    start, end = text.find("error '"), text.rfind("', please")
    return text[start + 7:end] if 0 <= start < end else text
