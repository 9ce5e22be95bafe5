"""The ``[orpheus]`` section (``OrpheusConfig``) and the checks of a LoRA
voice's name and adapter folder, which both the section and the run-time
``POST /v1/admin/voices`` apply."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from rtserver.engine.base import SamplingSettings
from rtserver.engine.quantization import (
    check_setting,
    declared_quantization,
    resolve_quantization,
)
from rtserver.errors import BadAdapter
from rtserver.vocoder.config import VocoderConfig
from rtserver.voices.orpheus import codes as ot

# [orpheus] kv_cache_dtype: values of vLLM's kv_cache_dtype (0.26 and 0.32) served here
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# [orpheus] later_hold_ms at most: a quarter of a second of the listener's buffer
MAX_LATER_HOLD_MS = 250.0
# [orpheus] cudagraph_mode: "auto" (engine/graph_mode.py: FULL on a CUDA GPU) or a
# name of vLLM's CUDAGraphMode (0.26 and 0.32)
CUDAGRAPH_MODES = ("auto", "NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


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
    # "auto" (the model's dtype) or "fp8" / "fp8_e4m3" / "fp8_e5m2" (vLLM's
    # kv_cache_dtype): half the bytes a step's attention reads per cached token,
    # which at 256 streams on an H200 was the largest kernel of vLLM's steps
    # (FlashAttention decode, 369 of 1,080 ms; bench/results/h200-orpheus-timeline-
    # 2026-12-04); without calibrated scales (scale 1), so its effect on a
    # checkpoint's speech is not measured here. Through the server on an H100 it
    # was no faster at 192 and 256 streams (bench/results/h100-2026-12-07-s26).
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    # vLLM's cudagraph_mode (CUDAGRAPH_MODES). "auto": FULL on a CUDA GPU, with an
    # unset max_num_batched_tokens at vLLM's largest graphed batch; vLLM's own
    # choice elsewhere (engine/graph_mode.py: why, and what it measured).
    cudagraph_mode: str = "auto"
    # A later segment's request waits up to this long (ms) to go to vLLM with the
    # next first segment or with the other later segments held (engine/
    # submit_gate.py), so fewer of vLLM's steps hold a prefill; a context's first
    # segment never waits. 0: off. 30 ms on top of FULL graphs on an H100 at 256
    # streams: no gain (bench/results/h100-2026-12-07-s33).
    later_hold_ms: float = 0.0
    enable_prefix_caching: bool = True
    priority_scheduling: bool = True
    # "mask" | "allowed" | "none" (see engine.vllm_engine), or "auto": "none" for
    # a checkpoint (the fine-tuned model writes audio tokens; no logits processor
    # lets vLLM run its V2 model runner: 23.5k vs 16.9k tokens/s at 128 streams on
    # an H200, bench/results/h200-orpheus-v2-2026-12-02), "mask" for vLLM's dummy
    # weights, which write any token.
    token_guard: str = "auto"
    # "auto" | "on" | "off": vLLM computes logits for the audio tokens and the
    # end tokens only (28,674 of 156,940 ids, engine/vllm_head.py), so its
    # lm_head and sampler (penalties, temperature, top-p, sampling) read 18 %
    # of the vocabulary; the model can then write nothing but audio and an end.
    # "auto": on where vLLM runs its V2 model runner (a CUDA GPU, Triton) and
    # token_guard resolves to "none", with one GPU, LoRA off and no quantized
    # checkpoint; "on" elsewhere (vLLM's V1 runner: the CPU) needs
    # repetition_penalty 1.0.
    audio_head: str = "auto"
    # An audio token of the wrong slot (possible unless token_guard is "mask"):
    # "reslot" takes its code for the right slot (counted), "fail" fails the
    # context with engine_failed. A token that is not audio always fails it.
    wrong_slot: str = "reslot"
    stream_interval: int = 1  # vLLM: tokens per delta after the first (see vllm_engine)
    tensor_parallel_size: int = 1
    seed: int = 0
    warm_up_frames: int = 4
    # After one request, a batch of this many at once, each (capped at
    # max_num_seqs): vLLM 0.26 samples top-k/top-p of 8+ rows with a Triton kernel
    # (torch's sort below 8, `apply_top_k_top_p`) and Triton compiles a kernel per
    # integer specialisation (a row count of 1, a multiple of 16, any other), so
    # 8 and 16 compile every sampler kernel before /ready. Without them the first
    # busy second compiled `_topk_topp_kernel` under traffic: TTFA p99 ~4 s at
    # the first 128 streams (H100, bench/results/h100-2026-12-05-s15).
    warm_up_batches: tuple[int, ...] = (8, 16)
    # LoRA voices: "<name>=<adapter folder>" (PEFT layout) is the voice
    # orpheus:<name>, prompted as the speaker <name>; "<name>@<speaker>=<folder>"
    # prompts as <speaker> (an adapter trained on a stock speaker's name).
    adapters: tuple[str, ...] = ()
    lora: bool = False  # serve LoRA voices (on when adapters are set); added at run time too
    max_loras: int = 8  # adapters in one batch (vLLM max_loras)
    max_lora_rank: int = 64  # the largest rank served (vLLM: 1, 8, 16, 32, 64, 128, ...)
    max_adapters: int = 32  # adapters loaded at once (vLLM max_cpu_loras)
    # "separate": vLLM's EngineCore in a process of its own; "inproc": in this
    # one (engine/vllm_inproc.py), sharing the SNAC vocoder's CUDA context.
    engine_process: str = "separate"
    # vLLM's EngineCore writes torch profiler traces here when the GPU worker
    # is asked for a timeline (rtserver/worker/profile.py); "": off.
    profile_dir: str = ""
    # When set, adapter folders must lie under it (relative ones are read from it).
    adapter_root: str = ""

    @property
    def lora_on(self) -> bool:
        return self.lora or bool(self.adapters)

    def adapter_specs(self) -> list[tuple[str, str, str]]:
        """``adapters`` as (name, speaker, folder); ``ValueError`` naming the bad one."""
        out: list[tuple[str, str, str]] = []
        for entry in self.adapters:
            head, sep, folder = entry.partition("=")
            name, _, speaker = head.strip().partition("@")
            if not sep or not folder.strip():
                raise ValueError(f"adapters entry {entry!r}: '<name>=<folder>' or "
                                 "'<name>@<speaker>=<folder>'")
            out.append((check_adapter_name(name, self.speakers), speaker.strip() or name,
                        folder.strip()))
        names = [n for n, _, _ in out]
        if len(set(names)) != len(names):
            raise ValueError(f"adapters: a name is given twice ({', '.join(names)})")
        return out

    def check(self) -> None:
        """Cross-field checks, once every source of settings is applied."""
        if self.speaker not in self.speakers:
            raise ValueError(f"speaker {self.speaker!r} is not one of speakers "
                             f"({', '.join(self.speakers)})")
        self.adapter_specs()
        if self.lora_on and not 1 <= self.max_loras <= self.max_adapters:
            raise ValueError(f"max_loras {self.max_loras} must be from 1 to max_adapters "
                             f"({self.max_adapters})")
        for name, allowed in (("token_guard", ("auto", "mask", "allowed", "none")),
                              ("audio_head", ("auto", "on", "off")),
                              ("wrong_slot", ("reslot", "fail")), ("shape", ("3b", "tiny")),
                              ("engine_process", ("separate", "inproc")),
                              ("kv_cache_dtype", KV_CACHE_DTYPES),
                              ("cudagraph_mode", CUDAGRAPH_MODES)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        if not 0 <= self.later_hold_ms <= MAX_LATER_HOLD_MS:
            raise ValueError(f"later_hold_ms {self.later_hold_ms}: from 0 (off) to "
                             f"{MAX_LATER_HOLD_MS:.0f}")
        if any(n < 1 for n in self.warm_up_batches):
            raise ValueError(f"warm_up_batches {list(self.warm_up_batches)}: each at least 1")
        check_setting(self.quantization)
        if not self.model_dir:  # the dummy layout written at load declares none
            resolve_quantization(self.quantization, None)
        elif (Path(self.model_dir) / "config.json").is_file():  # else: the loader says so
            resolve_quantization(self.quantization, declared_quantization(self.model_dir))


_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


def check_adapter_name(name: str, speakers: tuple[str, ...]) -> str:
    """A LoRA voice's name (``orpheus:<name>``): 1-64 of letters, digits,
    ``_.-``, not a stock speaker's; ``ValueError`` otherwise."""
    if not _ADAPTER_NAME.match(name):
        raise ValueError(f"voice name {name[:70]!r}: 1-64 letters, digits, '_', '.', '-'")
    if name in speakers:
        raise ValueError(f"voice name {name!r} is a stock speaker's")
    return name


def check_adapter_folder(folder: str, root: str = "") -> Path:
    """The adapter folder, resolved (under ``root`` when set), with a PEFT
    LoRA layout; ``BadAdapter`` saying what is wrong. vLLM checks the rest."""
    path = Path(root, folder) if root else Path(folder)
    path = path.resolve()
    if root and not path.is_relative_to(Path(root).resolve()):
        raise BadAdapter(f"adapter folder {folder!r} is outside the adapter root")
    if not path.is_dir():
        raise BadAdapter(f"adapter folder {folder!r} does not exist")
    cfg = path / "adapter_config.json"
    try:
        meta = json.loads(cfg.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadAdapter(f"adapter folder {folder!r} has no adapter_config.json") from None
    except (OSError, ValueError) as exc:
        raise BadAdapter(f"adapter {folder!r}: adapter_config.json does not read: "
                         f"{exc}") from None
    if not isinstance(meta, dict) or str(meta.get("peft_type", "")).upper() != "LORA":
        raise BadAdapter(f"adapter {folder!r}: adapter_config.json is not a LoRA "
                         "(peft_type \"LORA\")")
    if not any((path / f).is_file() for f in ("adapter_model.safetensors",
                                              "adapter_model.bin")):
        raise BadAdapter(f"adapter folder {folder!r} has no adapter_model.safetensors")
    return path
