"""The ``chattts`` voice family: the registry's entry (``rtserver.voices`` entry point).

Specs are ``chattts:<speaker>`` (``chattts:alice`` from the voices file,
``chattts:seed_7`` sampled from the model's speaker statistics) or plain
``chattts`` (the default speaker). One engine and one decoder serve them all;
every speaker the runtime knows is a voice (``/v1/voices``, ``ready``).
Importing this module is light: torch loads with the first voice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.registry import Collector

from rtserver.errors import ConfigError
from rtserver.voices.chattts.config import ChatTTSConfig
from rtserver.voices.registry import FamilyVoices, VoiceFamily, VoiceSettings

NAME = "chattts"


async def _load_family(specs: Sequence[str], section: object, settings: VoiceSettings,
                       progress: Callable[[str], None]) -> FamilyVoices:
    cfg = section if isinstance(section, ChatTTSConfig) else ChatTTSConfig()
    try:
        from rtserver.engine.base import EngineCollector
        from rtserver.voices.chattts.voice import load_runtime, speaker_of
    except ImportError as exc:  # torch / tokenizers / pybase16384 missing
        raise ConfigError(f"voices {', '.join(specs)} need the chattts extra: {exc}") from None
    runtime = await load_runtime(cfg, progress)
    named = [n for n, sp in runtime.speakers.items() if sp.source == "voices file"]
    by_spec: dict[str, str] = {}
    first = None
    for spec in specs:
        voice = runtime.voice(speaker_of(spec, cfg, named))
        by_spec[spec] = voice.info.name
        first = first or voice
    voices = runtime.all_voices()
    engine = runtime.engine
    stats = getattr(engine, "stats", None)
    collectors: list[Collector] = []
    if stats is not None:
        collectors.append(EngineCollector(stats, engine="chattts",
                                          extra_counters=runtime.counters))
    return FamilyVoices(voices={v.info.name: v for v in voices}, by_spec=by_spec,
                        warm_up_via=[first] if first is not None else [],
                        collectors=collectors,
                        engine_dead=getattr(engine, "dead_reason", None))


FAMILY = VoiceFamily(
    name=NAME, load=_load_family, section=ChatTTSConfig,
    description="ChatTTS (a 4-codebook GPT on rtserver's torch engine) with a streaming "
                "Decoder/DVAE + Vocos")
