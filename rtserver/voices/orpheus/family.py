"""The ``orpheus`` voice family: the registry's entry (``rtserver.voices``
entry point ``orpheus``).

Specs are ``orpheus[:<speaker>]``; one vLLM engine and one SNAC vocoder serve
every speaker. Importing this module is light: vLLM loads with the first voice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rtserver.errors import ConfigError, UnknownVoice
from rtserver.voices.orpheus.voice import FAMILY as NAME
from rtserver.voices.orpheus.voice import OrpheusConfig, load_orpheus_runtime
from rtserver.voices.registry import FamilyVoices, VoiceFamily, VoiceSettings


async def _load_family(specs: Sequence[str], section: object, settings: VoiceSettings,
                       progress: Callable[[str], None]) -> FamilyVoices:
    """The registry's entry point: every spec is ``orpheus[:<speaker>]``; one
    engine serves them all, and every speaker it has is a voice."""
    assert isinstance(section, OrpheusConfig)
    cfg = section
    speakers: dict[str, str] = {}
    for spec in specs:
        _, _, speaker = spec.partition(":")
        speaker = speaker or cfg.speaker
        if speaker not in cfg.speakers:
            raise UnknownVoice(f"voice {spec}: Orpheus speakers are {', '.join(cfg.speakers)}")
        speakers[spec] = speaker
    try:
        from rtserver.engine.base import EngineCollector
        from rtserver.engine.vllm_engine import VllmEngine  # noqa: F401 (vLLM is installed)
    except ImportError as exc:  # vllm / torch / snac missing
        raise ConfigError(f"voices {', '.join(specs)} need the vLLM extras: {exc}") from None
    runtime = await load_orpheus_runtime(cfg)
    voices = list(runtime.all_voices())
    by_spec = {spec: runtime.voice(sp).info.name for spec, sp in speakers.items()}
    return FamilyVoices(
        voices={v.info.name: v for v in voices}, by_spec=by_spec,
        warm_up_via=[runtime.voice(speakers[specs[0]])],
        collectors=[EngineCollector(runtime.engine.stats, engine="vllm",
                                    extra_counters=runtime.counters)],
        engine_dead=getattr(runtime.engine, "dead_reason", None))


FAMILY = VoiceFamily(
    name=NAME, load=_load_family, section=OrpheusConfig,
    description="Orpheus (a codec-token Llama on vLLM) with a chunked SNAC vocoder")
