"""The Piper family: ``piper:en_US-joe-medium`` (the embedded voice, also
``piper`` and ``default``), ``piper:<path>`` or a bare path to a Piper
``.onnx`` voice (its ``.onnx.json`` beside it) or a folder holding one.

Every Piper voice of a server shares one ``SynthesisPool`` (``[voice]
threads``); the family has no section of its own.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from rtserver.errors import ConfigError
from rtserver.voices.piper import EMBEDDED_NAME
from rtserver.voices.registry import FamilyVoices, VoiceFamily, VoiceSettings, register_family

EMBEDDED_SPECS = ("piper", "default", f"piper:{EMBEDDED_NAME}", EMBEDDED_NAME)


def _claims(spec: str) -> bool:
    """Specs without a prefix: the embedded voice's names, and paths."""
    return spec in EMBEDDED_SPECS or spec.endswith(".onnx") or "/" in spec \
        or os.sep in spec or Path(spec).exists()


async def _load(specs: Sequence[str], section: object, settings: VoiceSettings,
                progress: Callable[[str], None]) -> FamilyVoices:
    from rtserver.voices.piper import PiperVoice, embedded_voice_files, voice_files_from_path
    from rtserver.voices.synthesis_pool import SynthesisPool

    pool = SynthesisPool(settings.threads or (os.cpu_count() or 1), name="piper")
    out = FamilyVoices(voices={}, by_spec={},
                       release=lambda: asyncio.to_thread(pool.close))
    try:
        for spec in specs:
            path = spec.removeprefix("piper:")
            files = (embedded_voice_files() if spec in EMBEDDED_SPECS
                     else voice_files_from_path(path))
            if f"piper:{files.name}" in out.voices:
                raise ConfigError(f"voice piper:{files.name} is configured twice")
            voice = await asyncio.to_thread(PiperVoice, files, pool,
                                            intra_op_threads=settings.intra_op_threads)
            out.voices[voice.info.name] = voice
            out.by_spec[spec] = voice.info.name
            out.warm_up_via.append(voice)
    except BaseException:
        await asyncio.to_thread(pool.close)
        raise
    return out


FAMILY = register_family(VoiceFamily(
    name="piper", load=_load, claims=_claims,
    description="Piper ONNX VITS voices on the CPU"))
