"""The Piper family: ``piper:en_US-joe-medium`` (the embedded voice, also
``piper`` and ``default``), ``piper:<path>`` or a bare path to a Piper
``.onnx`` voice (its ``.onnx.json`` beside it) or a folder holding one.

Every Piper voice of a server shares one ``SynthesisPool`` (``[voice]
threads``). The ``[piper]`` section sets the chunked decoding
(``plan.PiperChunking``), the decoder's precision and where the split
graphs are cached.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rtserver.errors import ConfigError
from rtserver.voices.piper.plan import PiperChunking
from rtserver.voices.piper.voice import DECODER_PRECISIONS, EMBEDDED_NAME
from rtserver.voices.registry import FamilyVoices, VoiceFamily, VoiceSettings

EMBEDDED_SPECS = ("piper", "default", f"piper:{EMBEDDED_NAME}", EMBEDDED_NAME)


_CHUNKING = PiperChunking()


@dataclass(frozen=True, slots=True)
class PiperSection:
    """``[piper]``: chunked decoding (see ``PiperChunking``), the decoder's
    precision and the cache."""

    first_chunk_ms: float = _CHUNKING.first_chunk_ms
    growth: float = _CHUNKING.growth
    max_chunk_ms: float = _CHUNKING.max_chunk_ms
    eager_slack_ms: float = _CHUNKING.eager_slack_ms
    near_chunk_ms: float = _CHUNKING.near_chunk_ms
    # "auto": bfloat16 (OpenVINO, ``bf16``) where the CPU has native bf16
    # and OpenVINO is installed, else float32 (onnxruntime).
    decoder_precision: str = "auto"
    # How much nicer than the server the threads run that make audio after a
    # context's first chunk (``SynthesisPool``), so first chunks get the core
    # they share with them. 0: all equal.
    background_nice: int = 10
    # Where the split graphs go ("": $XDG_CACHE_HOME/rtserver, ~/.cache/rtserver).
    cache_dir: str = ""

    def chunking(self) -> PiperChunking:
        return PiperChunking(first_chunk_ms=self.first_chunk_ms, growth=self.growth,
                             max_chunk_ms=self.max_chunk_ms, eager_slack_ms=self.eager_slack_ms,
                             near_chunk_ms=self.near_chunk_ms)

    def check(self) -> None:
        self.chunking()  # raises ValueError naming the field
        if not 0 <= self.background_nice <= 19:
            raise ValueError(f"background_nice must be in 0..19, not {self.background_nice}")
        if self.decoder_precision not in ("auto", *DECODER_PRECISIONS):
            raise ValueError(f"decoder_precision must be auto, float32 or bfloat16, not "
                             f"{self.decoder_precision!r}")

    def precision(self) -> str:
        """The decoder precision to load: ``auto`` resolved on this machine."""
        from rtserver.voices.piper.bf16 import native_bf16

        if self.decoder_precision == "float32":
            return "float32"
        native = native_bf16()
        if self.decoder_precision == "bfloat16":
            if not native:
                raise ConfigError("piper decoder_precision bfloat16: this CPU has no native "
                                  "bf16 (avx512_bf16 or amx_bf16); use auto or float32")
            return "bfloat16"
        return "bfloat16" if native and importlib.util.find_spec("openvino") else "float32"


def _claims(spec: str) -> bool:
    """Specs without a prefix: the embedded voice's names, and paths."""
    return spec in EMBEDDED_SPECS or spec.endswith(".onnx") or "/" in spec \
        or os.sep in spec or Path(spec).exists()


async def _load(specs: Sequence[str], section: object, settings: VoiceSettings,
                progress: Callable[[str], None]) -> FamilyVoices:
    from rtserver.voices.piper.synthesis_pool import SynthesisPool
    from rtserver.voices.piper.voice import PiperVoice, embedded_voice_files, voice_files_from_path

    cfg = section if isinstance(section, PiperSection) else PiperSection()
    cache = Path(cfg.cache_dir) if cfg.cache_dir else None  # "~" expanded by split_voice
    precision = cfg.precision()
    pool = SynthesisPool(settings.threads or (os.cpu_count() or 1), name="piper",
                         background_nice=cfg.background_nice)
    out = FamilyVoices(voices={}, by_spec={},
                       release=lambda: asyncio.to_thread(pool.close),
                       engine_dead=lambda: pool.dead)
    try:
        for spec in specs:
            path = spec.removeprefix("piper:")
            files = (embedded_voice_files() if spec in EMBEDDED_SPECS
                     else voice_files_from_path(path))
            if f"piper:{files.name}" in out.voices:
                raise ConfigError(f"voice piper:{files.name} is configured twice")
            voice = await asyncio.to_thread(PiperVoice, files, pool,
                                            intra_op_threads=settings.intra_op_threads,
                                            cache_dir=cache, chunking=cfg.chunking(),
                                            decoder_precision=precision)
            out.voices[voice.info.name] = voice
            out.by_spec[spec] = voice.info.name
            out.warm_up_via.append(voice)
    except BaseException:
        await asyncio.to_thread(pool.close)
        raise
    return out


FAMILY = VoiceFamily(
    name="piper", load=_load, claims=_claims, section=PiperSection,
    description="Piper ONNX VITS voices on the CPU")
