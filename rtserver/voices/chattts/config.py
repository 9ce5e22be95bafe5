"""The ``[chattts]`` config section (light: no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from rtserver.voices.chattts.decoder.config import ChatTTSDecodeConfig

# Deep chunks longer than this (5.5 s of audio) would keep a stream's audio back
# for seconds at a time.
MAX_DEEP_STEPS = 256


@dataclass(frozen=True, slots=True)
class ChatTTSConfig:
    """Settings of the ChatTTS family: one engine and one decoder per process.

    Voices are ``chattts:<speaker>``: a name from ``voices_file`` (upstream
    speaker strings) or ``seed_<N>`` (a sample of the model's speaker
    statistics, the same for the same N).
    """

    asset_dir: str = ""  # the folder holding asset/ (upstream 2Noise/ChatTTS layout)
    device: str = "auto"  # "cpu", "cuda", "cuda:1", "auto"
    dtype: str = "auto"  # "float32", "bfloat16", "auto": bfloat16 on CUDA, float32 on CPU
    decoder: str = "decoder"  # "decoder" (hidden states) or "dvae" (codes)
    # The decoder + Vocos pass: "auto" (bfloat16 on CUDA, float32 on CPU),
    # "float32", "bfloat16" (CUDA; its error: chattts.decoder.config ``bf16``).
    decoder_dtype: str = "auto"
    # A later chunk may wait this long for others to share its decoder call;
    # < 0: 40 ms on CUDA, 0 on CPU (chattts.decoder.config ``hold_s``).
    decoder_hold_ms: float = -1.0
    # Steps a later decode waits for while the stream's listener holds that
    # much audio (chattts.decoder.config ``deep_chunk_frames``; 63,
    # ``DEEP_CHUNK_STEPS``: 19-40 % less decoder time per step of audio on the
    # CPU); 0: always the plan's 32, the default until an A/B on a GPU.
    decoder_deep_steps: int = 0
    # A TOML or JSON file: name -> upstream speaker string (TOML: a [speakers] table).
    voices_file: str = ""
    # Seeded speakers listed as voices (chattts:seed_N); any N may be configured.
    seeds: tuple[int, ...] = (1, 2)
    speaker: str = ""  # the default speaker; empty: the first named one, else seed_<first>
    # Upstream's spk_stat string (config.py), when the folder has no spk_stat.pt.
    speaker_stats: str = ""
    # Upstream's homophones_map.json (ChatTTS/res/ in the chattts package; not part
    # of the model download): Chinese characters the model misreads, replaced by
    # homophones it reads right, as upstream's normaliser does. Empty: none.
    homophones_file: str = ""
    speed: int = 5  # [speed_N], upstream's prompt default is [speed_5]
    # Upstream's refine-text pass (the GPT adds prosody tokens before speaking);
    # off: it runs before the first audio, so it adds to TTFA.
    refine_text: bool = False
    refine_slots: int = 8  # refine requests at once (their own small KV cache)
    refine_max_tokens: int = 384  # upstream RefineTextParams.max_new_token
    refine_temperature: float = 0.7  # upstream RefineTextParams.temperature
    # Sampling (upstream Chat.InferCodeParams defaults)
    temperature: float = 0.3
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    seed: int = -1  # sampling seed for every request; -1: a fresh one per request
    # Step budget per segment (46.875 steps per second of audio): upstream caps
    # at 2048 steps; here base + per character, generous for slow speech.
    budget_base_s: float = 2.0
    budget_s_per_cjk: float = 0.6
    budget_s_per_char: float = 0.15
    # Engine
    slots: int = 64
    max_len: int = 2048  # positions per slot (prompt + steps); upstream max_new_token 2048
    cuda_graphs: bool = True
    # a step's KV moves (batch compaction) as CUDA graphs too (engine.runner)
    move_graphs: bool = True
    prefill_tokens: int = 4096
    max_waiting: int = 4096
    max_queue_s: float = 10.0
    retry_after_ms: int = 500
    warm_up_steps: int = 8
    # Steps handed to the decoder one by one at a segment's start, then in
    # blocks (chattts.engine.engine.TorchEngineConfig)
    eager_steps: int = 24
    stream_interval: int = 4
    # Benchmarks on random weights: EOS never sampled, speech runs to the budget.
    ignore_eos: bool = False
    # The GPT's hidden states stay on the device (the engine's store) and the
    # decoder gathers its windows there, instead of each step's crossing to the
    # host and back (decoder route only; engine.engine.TorchEngineConfig).
    hidden_store: bool = False
    # A decode step's attention: "sdpa" (torch's, dense up to the step's length
    # bucket), "triton" (each row's own positions only, CUDA:
    # chattts.engine.attention) or "auto": "triton" where engine.triton_usable (CUDA
    # sm_80+ with Triton), "sdpa" elsewhere (engine.model.resolve_attention has the
    # H100 figures).
    decode_attention: str = "auto"

    def check(self) -> None:
        """``ValueError`` naming the field."""
        if self.decoder not in ("decoder", "dvae"):
            raise ValueError(f"chattts.decoder {self.decoder!r}: 'decoder' or 'dvae'")
        if self.decoder_dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"chattts.decoder_dtype {self.decoder_dtype!r}: auto, float32, "
                             "bfloat16")
        if self.hidden_store and self.decoder != "decoder":
            raise ValueError("chattts.hidden_store keeps hidden states for the 'decoder' "
                             "route; chattts.decoder is 'dvae' (codes)")
        if self.decode_attention not in ("auto", "sdpa", "triton"):
            raise ValueError(f"chattts.decode_attention {self.decode_attention!r}: auto, sdpa, "
                             "triton")
        if self.decoder_hold_ms > 1000:
            raise ValueError("chattts.decoder_hold_ms must be <= 1000")
        steady = ChatTTSDecodeConfig().max_chunk_frames
        if self.decoder_deep_steps and not steady < self.decoder_deep_steps <= MAX_DEEP_STEPS:
            raise ValueError(f"chattts.decoder_deep_steps {self.decoder_deep_steps}: 0 (off) or "
                             f"{steady + 1}..{MAX_DEEP_STEPS} (more than the plan's {steady}-step "
                             "chunks)")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"chattts.dtype {self.dtype!r}: auto, float32, bfloat16, float16")
        if not 0 <= self.speed <= 9:
            raise ValueError(f"chattts.speed {self.speed}: 0..9")
        if self.slots < 1 or self.max_len < 16:
            raise ValueError("chattts.slots must be >= 1 and chattts.max_len >= 16")
        if self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("chattts sampling: temperature > 0, 0 < top_p <= 1, top_k >= 0")
        if self.repetition_penalty <= 0:
            raise ValueError("chattts.repetition_penalty must be > 0")
