"""What every connection of one server shares: config, the speech core, metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

from rtserver import __version__
from rtserver.clock import SYSTEM_CLOCK, Clock
from rtserver.config import Config
from rtserver.core import ServerLoad, SpeechCore, VoiceStats, voice_lexicons
from rtserver.metrics import Metrics
from rtserver.protocol.messages import Limits, Ready
from rtserver.server.gate import Gate, VoiceHealth
from rtserver.server.guarded import GuardedVoice
from rtserver.server.workers import current as current_worker
from rtserver.voices.base import Voice
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
        voices = {self.default_voice: self.voices[self.default_voice], **self.voices}
        self.core = SpeechCore(voices, segmenter_config=cfg.segmenter, hint_config=cfg.hints,
                               opus_config=cfg.opus, metrics=self.metrics, clock=self.clock,
                               encode_pool=self.encode_pool,
                               max_text_chars=cfg.server.max_text_chars,
                               lexicons=voice_lexicons(cfg.voice.lexicons, list(voices)))
        # one count of running contexts: the hints' load, and the gauge
        self.metrics.contexts.set_function(lambda: self.core.load.active)
        # short names: "<name>" for "<family>:<name>", and "default"
        self.voice_aliases.setdefault("default", self.default_voice)
        for name in self.voices:
            _, _, short = name.partition(":")
            if short and short not in self.voices:
                self.voice_aliases.setdefault(short, name)

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

    def _engine_died(self, voice: str, exc: BaseException) -> None:
        log.critical("the engine of voice %s died (%s): draining, then exiting non-zero "
                     "so that the orchestrator restarts this process", voice, exc)
        self.engine_dead.set()

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
            limits=Limits(max_message_bytes=s.max_message_bytes,
                          max_text_chars=s.max_text_chars, max_contexts=s.max_contexts))

    def voices_json(self) -> list[dict[str, object]]:
        out: list[dict[str, object]] = []
        for name, voice in self.voices.items():
            info = voice.info
            out.append({"name": name, "family": info.family, "sample_rate": info.sample_rate,
                        "language": info.language, "description": info.description,
                        "default": name == self.default_voice})
        return out
