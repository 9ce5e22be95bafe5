"""Voice families, found through entry points; the server loads voices through them.

A voice spec is ``<family>:<rest>`` (``piper:en_US-joe-medium``,
``orpheus:tara``); a family may also claim specs without a prefix (a path to a
voice file). An unknown prefix is ``unknown_voice`` listing the families.

A family is a ``VoiceFamily``: its name (the spec prefix), its config section
(a frozen dataclass read from the ``[<name>]`` table, ``RTSERVER_<NAME>_<FIELD>``
and ``--<name>.<field>`` flags; ``rtserver.config`` asks this registry for
them) and a loader. Families are found the way pytest and vLLM find plug-ins:
each distribution names its ``VoiceFamily`` objects in the entry point group
``rtserver.voices`` (``name = "module:OBJECT"``; rtserver's own three are in
its ``pyproject.toml``). Adding a family needs no edit of rtserver: no server
code, no ``Config`` field. ``register_family`` adds one at run time (tests).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.registry import Collector

from rtserver.engine.base import ProfiledEngine
from rtserver.errors import ConfigError, UnknownVoice
from rtserver.voices.base import Voice, VoiceMaker

ENTRY_POINT_GROUP = "rtserver.voices"
BUILTIN_DISTRIBUTION = "rtserver"  # its families are listed first
# rtserver's own entry points (pyproject.toml; tests/unit/test_house_plan.py
# checks they are the same), read from here only when rtserver runs from a
# source tree that was never installed (PYTHONPATH=.), which has no metadata.
BUILTIN_ENTRY_POINTS = {
    "piper": "rtserver.voices.piper.family:FAMILY",
    "orpheus": "rtserver.voices.orpheus.family:FAMILY",
    "chattts": "rtserver.voices.chattts.family:FAMILY",
}
_NAME = re.compile(r"[a-z][a-z0-9]*\Z")  # no "_": RTSERVER_<FAMILY>_<FIELD> must split


@dataclass(frozen=True, slots=True)
class VoiceSettings:
    """The ``[voice]`` section: which voices to load, shared by all families."""

    # The default voice: "piper:<name>" for the embedded voice, a path to an
    # .onnx file (its .onnx.json beside it), or "<family>:<name>" of any family.
    default: str = "piper:en_US-joe-medium"
    # Extra voices to load at start-up (same forms as ``default``).
    extra: tuple[str, ...] = ()
    # Synthesis threads for CPU voices; 0 means one per core.
    threads: int = 0
    # onnxruntime intra-op threads per synthesis call.
    intra_op_threads: int = 1
    # Pronunciation lexicons (W3C PLS files) of the loaded voices: "VOICE=FILE"
    # (a voice's full or short name) or "FILE" for every voice; a context's
    # ``start.lexicon`` comes before them (docs/PROTOCOL-EXTENSIONS.md).
    lexicons: tuple[str, ...] = ()


@dataclass
class FamilyVoices:
    """What a family's loader returns for its specs."""

    voices: dict[str, Voice]  # every voice it serves (all speakers of a shared model)
    by_spec: dict[str, str]  # each requested spec -> the name of its voice
    warm_up_via: list[Voice] = field(default_factory=list)  # one per shared model
    collectors: list[Collector] = field(default_factory=list)  # Prometheus, engine stats
    # after its voices are closed: what the family shares (thread pools)
    release: Callable[[], Awaitable[None]] | None = None
    # why the engine (or thread pool) its voices share is gone for good, None
    # while it runs; the server polls it (``VoiceSet.dead``), so a death is seen
    # with no request in flight
    engine_dead: Callable[[], str | None] | None = None
    # makes voices at run time (LoRA adapters), when the family can
    maker: VoiceMaker | None = None
    # engines that record a GPU timeline of their own process on demand
    profiled: list[ProfiledEngine] = field(default_factory=list)


# loader(specs, the family's section (None without one), [voice], progress)
Loader = Callable[[Sequence[str], Any, VoiceSettings, Callable[[str], None]],
                  Awaitable[FamilyVoices]]


@dataclass(frozen=True, slots=True)
class VoiceFamily:
    """A family of voices: ``name`` is its spec prefix and config table.

    ``section``: a frozen dataclass of the family's settings (defaults must be
    valid); its optional ``check()`` raises ``ValueError`` naming the field,
    after every source of settings is applied. ``claims``: specs without a
    prefix the family takes (a file path)."""

    name: str
    load: Loader
    section: type | None = None
    claims: Callable[[str], bool] | None = None
    description: str = ""


_FAMILIES: dict[str, VoiceFamily] = {}
_RANK: dict[str, int] = {}  # discovery order
_discovered = False


def register_family(family: VoiceFamily) -> VoiceFamily:
    """Add a family at run time (tests; plug-ins use the entry point group)."""
    if not _NAME.match(family.name):
        raise ValueError(f"voice family name {family.name!r}: lowercase letters and digits")
    old = _FAMILIES.get(family.name)
    if old is not None and old != family:
        raise ValueError(f"voice family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def families() -> Mapping[str, VoiceFamily]:
    """Every family: rtserver's own first (in its entry points' order), then
    other distributions', then those registered at run time."""
    global _discovered
    if not _discovered:
        _discovered = True  # before loading: a family module may ask again
        try:
            _discover()
        except BaseException:
            _discovered = False  # a broken family fails every call, not just the first
            raise
    return dict(sorted(_FAMILIES.items(), key=lambda item: _RANK.get(item[0], len(_RANK))))


def _discover() -> None:
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    ordered = sorted(eps, key=lambda ep: (ep.dist is None
                                          or ep.dist.name != BUILTIN_DISTRIBUTION))
    if not any(ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION for ep in eps):
        ordered[:0] = [importlib.metadata.EntryPoint(name, value, ENTRY_POINT_GROUP)
                       for name, value in BUILTIN_ENTRY_POINTS.items()]
    for ep in ordered:
        family = ep.load()
        if not isinstance(family, VoiceFamily):
            raise ConfigError(f"entry point {ep.name} = {ep.value} in {ENTRY_POINT_GROUP} "
                              f"is not a VoiceFamily")
        if family.name != ep.name:
            raise ConfigError(f"entry point {ep.name} = {ep.value} names the family "
                              f"{family.name!r}; the entry point's name must be the same")
        register_family(family)
        _RANK.setdefault(family.name, len(_RANK))


def family_sections() -> dict[str, type]:
    """Family name -> its config section class (for ``rtserver.config``)."""
    return {n: f.section for n, f in families().items() if f.section is not None}


def family_of(spec: str) -> VoiceFamily:
    """The family a spec belongs to; ``UnknownVoice`` (listing them) if none."""
    known = families()
    prefix, sep, _ = spec.partition(":")
    if sep and prefix in known:
        return known[prefix]
    if not sep and spec in known:  # "piper": the family's default voice
        return known[spec]
    for fam in known.values():
        if fam.claims is not None and fam.claims(spec):
            return fam
    raise UnknownVoice(f"unknown voice {spec!r}: no voice family "
                       f"{(prefix if sep else spec)!r}; the families are "
                       f"{', '.join(known)}")


@dataclass
class VoiceSet:
    voices: dict[str, Voice]
    default: str
    # Prometheus collectors the voices' engines bring (vLLM's own stats)
    collectors: list[Collector] = field(default_factory=list)
    # voices that share one model warm up through one of them
    warm_up_via: list[Voice] = field(default_factory=list)
    releases: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # each configured spec -> the name of its voice
    by_spec: dict[str, str] = field(default_factory=dict)
    # the engines that record GPU timelines of their own processes (vLLM)
    profiled: list[ProfiledEngine] = field(default_factory=list)
    # voice name -> its family's ``engine_dead`` probe
    probes: dict[str, Callable[[], str | None]] = field(default_factory=dict)

    def dead(self) -> dict[str, str]:
        """The voices whose engine is gone for good, with why."""
        out: dict[str, str] = {}
        for name, probe in self.probes.items():
            why = probe()
            if why is not None:
                out[name] = why
        return out
    # family -> its maker of voices at run time (LoRA adapters)
    makers: dict[str, VoiceMaker] = field(default_factory=dict)
    # voices that come and go elsewhere (a GPU worker's, made at run time):
    # ``watch(apply)`` calls ``apply(added voices by name, removed names)`` on each change
    watch: Callable[[Callable[[dict[str, Voice], list[str]], None]], None] | None = None

    async def warm_up(self) -> None:
        await asyncio.gather(*(v.warm_up() for v in self.warm_up_via))

    async def close(self) -> None:
        for voice in self.voices.values():
            await voice.close()
        for release in self.releases:
            await release()


async def load_voices(settings: VoiceSettings, sections: Mapping[str, object],
                      progress: Callable[[str], None]) -> VoiceSet:
    """Load the default voice and the extra ones through their families;
    ``sections``: family name -> its config section. The default comes first."""
    specs = [settings.default, *[s for s in settings.extra if s != settings.default]]
    grouped: dict[str, list[str]] = {}
    for spec in specs:
        grouped.setdefault(family_of(spec).name, []).append(spec)
    known = families()
    voices: dict[str, Voice] = {}
    by_spec: dict[str, str] = {}
    out = VoiceSet(voices={}, default="")
    try:
        for name, fam_specs in grouped.items():
            fam = known[name]
            progress(f"loading voice{'s' if len(fam_specs) > 1 else ''} "
                     f"{', '.join(fam_specs)}")
            loaded = await fam.load(fam_specs, sections.get(name), settings, progress)
            if loaded.release is not None:
                out.releases.append(loaded.release)
            out.collectors += loaded.collectors
            out.profiled += loaded.profiled
            out.warm_up_via += loaded.warm_up_via
            if loaded.maker is not None:
                out.makers[name] = loaded.maker
            for vname, voice in loaded.voices.items():
                if vname in voices:
                    raise ConfigError(f"voice {vname} is configured twice")
                voices[vname] = voice
                if loaded.engine_dead is not None:
                    out.probes[vname] = loaded.engine_dead
            by_spec.update(loaded.by_spec)
        names = [by_spec[s] for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"a voice is configured twice: {', '.join(specs)}")
    except BaseException:
        out.voices = voices
        await out.close()
        raise
    default = names[0]
    # the default first, so ready.voices and /v1/voices list it first
    out.voices = {default: voices[default], **{n: v for n, v in voices.items() if n != default}}
    out.default = default
    out.by_spec = {s: by_spec[s] for s in specs}
    return out
