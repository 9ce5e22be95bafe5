"""The ``orpheus`` voice family: the registry's entry (``rtserver.voices``
entry point ``orpheus``).

Specs are ``orpheus[:<speaker>]`` or ``orpheus:<LoRA voice>`` (``[orpheus]
adapters``); one vLLM engine and one SNAC vocoder serve every speaker and
every adapter. With LoRA on, the family makes voices at run time too
(``OrpheusMaker``, behind ``POST /v1/admin/voices``). Importing this module is
light: vLLM loads with the first voice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rtserver.engine.base import ProfiledEngine
from rtserver.errors import ConfigError, UnknownVoice
from rtserver.voices.base import Voice
from rtserver.voices.orpheus.config import OrpheusConfig
from rtserver.voices.orpheus.voice import FAMILY as NAME
from rtserver.voices.orpheus.voice import OrpheusRuntime, load_orpheus_runtime
from rtserver.voices.registry import FamilyVoices, VoiceFamily, VoiceSettings


class OrpheusMaker:
    """The family's ``VoiceMaker``: LoRA voices on the runtime's base model."""

    def __init__(self, runtime: OrpheusRuntime) -> None:
        self.runtime = runtime

    async def add(self, name: str, adapter: str, speaker: str | None = None) -> Voice:
        return await self.runtime.add_adapter_voice(name, adapter, speaker)

    async def remove(self, name: str) -> Voice:
        return await self.runtime.remove_adapter_voice(name)


async def _load_family(specs: Sequence[str], section: object, settings: VoiceSettings,
                       progress: Callable[[str], None]) -> FamilyVoices:
    """The registry's entry point: every spec is ``orpheus[:<speaker>]``; one
    engine serves them all, and every speaker it has is a voice."""
    assert isinstance(section, OrpheusConfig)
    cfg = section
    speakers: dict[str, str] = {}
    try:
        lora_names = {name for name, _, _ in cfg.adapter_specs()}
    except ValueError as exc:
        raise ConfigError(f"[orpheus] {exc}") from None
    for spec in specs:
        _, _, speaker = spec.partition(":")
        speaker = speaker or cfg.speaker
        if speaker not in cfg.speakers and speaker not in lora_names:
            raise UnknownVoice(f"voice {spec}: Orpheus speakers are {', '.join(cfg.speakers)}"
                               + (f"; LoRA voices {', '.join(sorted(lora_names))}"
                                  if lora_names else ""))
        speakers[spec] = speaker
    try:
        from rtserver.engine.base import EngineCollector
        from rtserver.engine.vllm_engine import VllmEngine  # noqa: F401 (vLLM is installed)
    except ImportError as exc:  # vllm / torch / snac missing
        raise ConfigError(f"voices {', '.join(specs)} need the vLLM extras: {exc}") from None
    runtime = await load_orpheus_runtime(cfg)
    voices: dict[str, Voice] = {v.info.name: v for v in runtime.all_voices()}
    by_spec = {spec: f"{NAME}:{sp}" for spec, sp in speakers.items()}
    return FamilyVoices(
        voices=voices, by_spec=by_spec,
        warm_up_via=[voices[by_spec[specs[0]]]],
        collectors=[EngineCollector(runtime.engine.stats, engine="vllm",
                                    extra_counters=runtime.counters)],
        engine_dead=getattr(runtime.engine, "dead_reason", None),
        maker=OrpheusMaker(runtime) if cfg.lora_on else None,
        profiled=[runtime.engine] if isinstance(runtime.engine, ProfiledEngine) else [])


FAMILY = VoiceFamily(
    name=NAME, load=_load_family, section=OrpheusConfig,
    description="Orpheus (a codec-token Llama on vLLM) with a chunked SNAC vocoder")
