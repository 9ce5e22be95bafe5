"""Build the server's voices from configuration.

A voice spec is one of:
- ``piper:en_US-joe-medium`` (or ``piper``/``default``): the embedded voice;
- a path to a Piper ``.onnx`` file (its ``.onnx.json`` beside it) or a folder
  holding one;
- ``orpheus:<speaker>`` (e.g. ``orpheus:tara``): the vLLM Orpheus family,
  with the model and SNAC folders from ``[voice]`` settings.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.registry import Collector

from rtserver.config import Config
from rtserver.errors import ConfigError
from rtserver.voices.base import Voice
from rtserver.voices.piper import (
    EMBEDDED_NAME,
    PiperVoice,
    embedded_voice_files,
    voice_files_from_path,
)
from rtserver.voices.synthesis_pool import SynthesisPool

EMBEDDED_SPECS = ("piper", "default", f"piper:{EMBEDDED_NAME}", EMBEDDED_NAME)


@dataclass
class VoiceSet:
    voices: dict[str, Voice]
    default: str
    pools: list[SynthesisPool] = field(default_factory=list)
    # Prometheus collectors the voices' engines bring (vLLM's own stats)
    collectors: list[Collector] = field(default_factory=list)
    # voices that share one model warm up through one of them
    warm_up_via: list[Voice] = field(default_factory=list)

    async def warm_up(self) -> None:
        await asyncio.gather(*(v.warm_up() for v in self.warm_up_via))

    async def close(self) -> None:
        for voice in self.voices.values():
            await voice.close()
        for pool in self.pools:
            await asyncio.to_thread(pool.close)


async def load_voices(config: Config, progress: Callable[[str], None]) -> VoiceSet:
    """Load the default voice and the extra ones; the default's name comes first."""
    vc = config.voice
    specs = [vc.default, *[s for s in vc.extra if s != vc.default]]
    pool: SynthesisPool | None = None
    voices: dict[str, Voice] = {}
    pools: list[SynthesisPool] = []
    default_name = ""
    collectors: list[Collector] = []
    runtimes: list[object] = []
    warm: list[Voice] = []
    for spec in specs:
        progress(f"loading voice {spec}")
        if spec.startswith("orpheus"):
            voice, speakers, runtime, collector = await _load_orpheus(config, spec)
            if all(runtime is not r for r in runtimes):  # one engine, one collector
                runtimes.append(runtime)
                collectors.append(collector)
                warm.append(voice)
            for other in speakers:  # every speaker of the one engine is a voice
                if other.info.name not in voices and other.info.name != voice.info.name:
                    voices[other.info.name] = other
        else:
            if pool is None:
                workers = vc.threads or (os.cpu_count() or 1)
                pool = SynthesisPool(workers, name="piper")
                pools.append(pool)
            files = (embedded_voice_files() if spec in EMBEDDED_SPECS
                     else voice_files_from_path(spec))
            voice = await asyncio.to_thread(PiperVoice, files, pool,
                                            intra_op_threads=vc.intra_op_threads)
            warm.append(voice)
        name = voice.info.name
        if name in voices:
            raise ConfigError(f"voice {name} is configured twice")
        voices[name] = voice
        default_name = default_name or name
    # the default first, so ready.voices and /v1/voices list it first
    ordered = {default_name: voices[default_name],
               **{n: v for n, v in voices.items() if n != default_name}}
    return VoiceSet(voices=ordered, default=default_name, pools=pools, collectors=collectors,
                    warm_up_via=warm)


async def _load_orpheus(config: Config, spec: str
                        ) -> tuple[Voice, list[Voice], object, Collector]:
    """The voice for ``spec``, every speaker of its engine, the shared runtime and
    a collector of vLLM's stats."""
    try:
        from rtserver.engine.base import EngineCollector
        from rtserver.voices.orpheus import load_orpheus_voice_from_config
    except ImportError as exc:  # vllm / torch / snac missing
        raise ConfigError(f"voice {spec} needs the vLLM extras: {exc}") from None
    voice = await load_orpheus_voice_from_config(config, spec)
    runtime = voice.runtime
    collector = EngineCollector(runtime.engine.stats, engine="vllm",
                                extra_counters=runtime.counters)
    return voice, list(runtime.all_voices()), runtime, collector
