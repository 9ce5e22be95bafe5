"""What every connection of one server shares: config, the speech core, metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

import msgspec

from rtserver import __version__
from rtserver.clock import SYSTEM_CLOCK, Clock
from rtserver.config import Config
from rtserver.core import ServerLoad, SpeechCore, VoiceStats, voice_lexicons
from rtserver.metrics import Metrics
from rtserver.protocol.messages import Limits, Ready
from rtserver.server.breaker import BreakerState
from rtserver.server.gate import Gate, SharedRate, SharedStarts, VoiceHealth
from rtserver.server.guarded import GuardedVoice
from rtserver.server.workers import current as current_worker
from rtserver.voices.base import Voice, VoiceMaker
from rtserver.voices.registry import families

log = logging.getLogger("rtserver.server")


@dataclass
class AppState:
    config: Config
    voices: dict[str, Voice]
    default_voice: str
    metrics: Metrics = field(default_factory=Metrics)
    voice_aliases: dict[str, str] = field(default_factory=dict)
    families: tuple[str, ...] = field(default_factory=lambda: tuple(families()))
    # Opus encoding of many streams runs here, off the event loop
    encode_pool: Executor | None = None
    clock: Clock = SYSTEM_CLOCK
    ready: bool = False
    draining: bool = False
    connections: int = 0  # WebSockets admitted at the handshake and not yet ended
    # family -> its maker of voices at run time (LoRA adapters; POST /v1/admin/voices)
    makers: Mapping[str, VoiceMaker] = field(default_factory=dict)
    # admission, breakers, tokens (rtserver.server.gate); voices report to it
    gate: Gate = field(init=False)
    # set when a voice's engine died: the server drains and exits non-zero
    engine_dead: asyncio.Event = field(default_factory=asyncio.Event)
    core: SpeechCore = field(init=False)

    def __post_init__(self) -> None:
        self.gate = Gate(self.config.admission, self.voices)
        for name, voice in self.voices.items():
            if isinstance(voice, VoiceHealth):  # a voice behind a GPU worker process
                self.gate.health[name] = voice
        self.voices = {name: GuardedVoice(voice, self.gate, self.clock.now,
                                          on_dead=self._engine_died)
                       for name, voice in self.voices.items()}
        for name in self.voices:
            self.metrics.engine_up.labels(name).set_function(self._engine_up_of(name))
        cfg = self.config
        # one dict, default first, shared with the core (and live in every
        # session): voices added or removed at run time are seen by all
        self.voices = {self.default_voice: self.voices[self.default_voice], **self.voices}
        self.core = SpeechCore(self.voices, segmenter_config=cfg.segmenter, hint_config=cfg.hints,
                               opus_config=cfg.opus, metrics=self.metrics, clock=self.clock,
                               encode_pool=self.encode_pool,
                               max_text_chars=cfg.server.max_text_chars,
                               lexicons=voice_lexicons(cfg.voice.lexicons, list(self.voices)))
        self.gate.starting = self.core.load.starting_now  # a burst's starts, for admission
        # a GPU worker's voice: other front ends' starts there count in first hints
        self.core.load.starting_elsewhere = self._starting_elsewhere
        # ... and the r every front end's requests ran at there, until ours have
        self.core.rtf_elsewhere = self._rtf_elsewhere
        served = self.voices
        self.gate.start_limited = lambda name: (
            name in served and served[name].info.parallel_segments > 0)
        # one count of running contexts: the hints' load, and the gauge
        self.metrics.contexts.set_function(lambda: self.core.load.active)
        # short names: "<name>" for "<family>:<name>", and "default"
        self.voice_aliases.setdefault("default", self.default_voice)
        for name in self.voices:
            _, _, short = name.partition(":")
            if short and short not in self.voices:
                self.voice_aliases.setdefault(short, name)

    def _starting_elsewhere(self, name: str) -> int:
        voice = self.gate.health.get(name)  # the voices behind a GPU worker, unwrapped
        return voice.starting_elsewhere() if isinstance(voice, SharedStarts) else 0

    def _rtf_elsewhere(self, name: str) -> float | None:
        voice = self.gate.health.get(name)
        return voice.rtf_elsewhere() if isinstance(voice, SharedRate) else None

    def add_voice(self, voice: Voice) -> str:
        """Serve a voice made at run time (a LoRA voice); returns its name."""
        name = voice.info.name
        if name in self.voices:
            raise ValueError(f"voice {name} exists")
        self.gate.add_voice(name)
        if isinstance(voice, VoiceHealth):  # a voice behind a GPU worker process
            self.gate.health[name] = voice
        self.voices[name] = GuardedVoice(voice, self.gate, self.clock.now,
                                         on_dead=self._engine_died)
        self.core.stats_for(name)
        self.metrics.engine_up.labels(name).set_function(self._engine_up_of(name))
        _, _, short = name.partition(":")
        if short and short not in self.voices:
            self.voice_aliases.setdefault(short, name)
        return name

    def apply_voice_changes(self, added: dict[str, Voice], removed: list[str]) -> None:
        """Voices made or dropped elsewhere (a GPU worker, at run time):
        serve the new ones, stop offering the gone ones (never the default)."""
        for name, voice in added.items():
            if name not in self.voices:
                self.add_voice(voice)
        for name in removed:
            if name != self.default_voice:
                self.remove_voice(name)

    def remove_voice(self, name: str) -> None:
        """Stop offering a voice added at run time: new contexts on it are
        ``unknown_voice``; contexts speaking with it finish."""
        self.voices.pop(name, None)
        self.gate.remove_voice(name)
        for alias in [a for a, n in self.voice_aliases.items() if n == name]:
            del self.voice_aliases[alias]
        try:
            self.metrics.engine_up.remove(name)
        except KeyError:
            pass

    def _engine_up_of(self, voice: str) -> Callable[[], float]:
        return lambda: float(self.gate.engine_up(voice, self.clock.now()))

    def begin_drain(self) -> None:
        """``/ready`` 503, new WebSockets 503, new contexts ``overloaded``."""
        self.draining = True
        self.gate.draining = True

    def is_ready(self) -> tuple[bool, str]:
        """What ``/ready`` answers: warm, not draining, every voice up."""
        if not self.ready:
            return False, "warming up"
        return self.gate.ready(self.clock.now())

    def _engine_died(self, voice: str, exc: BaseException | str) -> None:
        log.critical("the engine of voice %s died (%s): draining, then exiting non-zero "
                     "so that the orchestrator restarts this process", voice, exc)
        self.engine_dead.set()

    def engine_gone(self, voice: str, why: str) -> None:
        """The engine behind ``voice`` is gone for good (its family's probe
        says so, with or without a request in flight): the voice is down for
        good (``/ready`` 503, new contexts ``engine_failed``) and the server
        drains and exits ``ENGINE_DEAD_EXIT``. Once per voice."""
        breaker = self.gate.breakers.get(voice)
        if breaker is not None and breaker.state is BreakerState.DEAD:
            return
        self.gate.voice_failed(voice, self.clock.now(), why, dead=True)
        self._engine_died(voice, why)

    @property
    def load(self) -> ServerLoad:
        """Contexts running now, all voices (the core's count)."""
        return self.core.load

    @property
    def voice_stats(self) -> dict[str, VoiceStats]:
        return self.core.voice_stats

    def ready_message(self) -> Ready:
        s = self.config.server
        worker = current_worker()  # several processes on one port: which one this is
        server = f"rtserver/{__version__}" + (f" ({worker.describe()})" if worker else "")
        return Ready(
            server=server, voices=tuple(self.voices),
            default_voice=self.default_voice,
            voice_info={name: v.info.describe() for name, v in self.voices.items()},
            limits=Limits(messages_per_s=s.messages_per_s, input_bytes_per_s=s.input_bytes_per_s,
                          max_message_bytes=s.max_message_bytes,
                          max_text_chars=s.max_text_chars, max_contexts=s.max_contexts))

    def voices_json(self) -> list[dict[str, object]]:
        """``GET /v1/voices``' list (``voices_json`` builds each entry)."""
        return voices_json(self.voices, self.default_voice)


def voices_json(voices: Mapping[str, Voice], default: str) -> list[dict[str, object]]:
    """One object per voice: its name, description, whether it is the default,
    and ``ready.voice_info``'s fields (family, languages, sample rate,
    capabilities), so both say the same."""
    out: list[dict[str, object]] = []
    for name, voice in voices.items():
        info = voice.info
        out.append({"name": name, "language": info.language, "description": info.description,
                    "default": name == default, **msgspec.to_builtins(info.describe())})
    return out
