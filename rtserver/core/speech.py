"""The speech core: loaded voices, their measured rates and the settings every
context shares. Transports (the WebSocket server, the HTTP speech endpoint,
``rtserver say``) open contexts on it and hand each a ``Sink``, and ask it
for a new context's predicted first heard audio (admission)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field

from rtserver.audio.opus import OpusConfig
from rtserver.clock import SYSTEM_CLOCK, Clock
from rtserver.core.context import SpeechContext
from rtserver.core.events import Sink
from rtserver.core.first_heard import predicted_first_heard_ms
from rtserver.core.framing import HeardFormat, encode_rate, make_framer
from rtserver.core.inputs import DEFAULT_MAX_TEXT_CHARS
from rtserver.core.pronounce import Pronouncer, compile_voice_lexicon
from rtserver.core.stats import ServerLoad, VoiceStats
from rtserver.errors import ConfigError, UnknownVoice, UnsupportedFormat
from rtserver.metrics import Metrics
from rtserver.pacing.hints import HintConfig
from rtserver.pacing.rates import FirstChunkTimes, LiveRates, RtfTracker
from rtserver.protocol.messages import AUDIO_FORMATS, FRAME_MS, SAMPLE_RATES, Start
from rtserver.text.lexicon import Entry, Lexicon
from rtserver.text.segmenter import SegmenterConfig
from rtserver.voices.base import Voice


def _no_rate_of(voice: str) -> float | None:
    return None


# A voice's output as heard in one format: (voice, format, rate, frame ms)
_HeardKey = tuple[str, str, int, int]


@dataclass
class SpeechCore:
    """Voices by name (the first is the default) and what their contexts share."""

    voices: Mapping[str, Voice]
    segmenter_config: SegmenterConfig = field(default_factory=SegmenterConfig)
    hint_config: HintConfig = field(default_factory=HintConfig)
    opus_config: OpusConfig = field(default_factory=OpusConfig)
    metrics: Metrics = field(default_factory=Metrics)
    clock: Clock = SYSTEM_CLOCK
    encode_pool: Executor | None = None  # threads for Opus encoding (None: inline)
    load: ServerLoad = field(default_factory=ServerLoad)  # contexts running, all voices
    voice_stats: dict[str, VoiceStats] = field(default_factory=dict)
    # characters of text one context takes in all ([server] max_text_chars)
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
    # each voice's own lexicon ([voice] lexicons), by voice name; a context's
    # ``start.lexicon`` comes before it
    lexicons: Mapping[str, tuple[Entry, ...]] = field(default_factory=dict)
    # a voice's r as another process measured its engine (a GPU worker's
    # ``Load.rtf``), or None; the server sets it (``VoiceStats.rtf_elsewhere``)
    rtf_elsewhere: Callable[[str], float | None] = _no_rate_of
    # bounded: voices x formats x rates x frame sizes, all finite sets
    _heard: dict[_HeardKey, HeardFormat] = field(default_factory=dict, init=False,
                                                 repr=False)
    _compiled: dict[str, Lexicon] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.voices:
            raise ValueError("a speech core needs at least one voice")
        for name in self.voices:
            self.stats_for(name)
        for name, entries in self.lexicons.items():
            voice = self.voices.get(name)
            if voice is None:
                raise ConfigError(f"a lexicon for voice {name!r}, which is not loaded")
            self._compiled[name] = compile_voice_lexicon(entries, voice.info)

    @property
    def default_voice(self) -> str:
        return next(iter(self.voices))

    def stats_for(self, voice: str) -> VoiceStats:
        stats = self.voice_stats.get(voice)
        if stats is None:
            hints = self.hint_config
            stats = self.voice_stats[voice] = VoiceStats(
                rtf=RtfTracker(hints), live=LiveRates(hints),
                first_chunk=FirstChunkTimes(hints), load=self.load,
                parallel=self.voices[voice].info.parallel_segments,
                rtf_elsewhere=lambda: self.rtf_elsewhere(voice))
        return stats

    def open(self, start: Start, sink: Sink, *, stream: int = 0,
             voice: str | None = None) -> SpeechContext:
        """A new context speaking ``voice`` (else ``start.voice``, else the
        default) into ``sink``; run it with ``await ctx.run()`` (in the
        transport's task group). Raises ``UnknownVoice`` / ``UnsupportedFormat``
        for options it cannot serve."""
        name, found = self._voice(start, voice)
        predicted = self.predicted_first_heard_ms(start, name)
        pronouncer = Pronouncer.of(start, found.info, self._compiled.get(name))
        return SpeechContext(self, start, found, self.stats_for(name), sink, stream,
                             predicted_ms=predicted, pronouncer=pronouncer)

    def predicted_first_heard_ms(self, start: Start, voice: str | None = None) -> float:
        """When a listener of a context opened now with ``start`` (on ``voice``,
        chosen as ``open`` does) would first hear audio, in ms after the text
        of its first segment is complete (``first_heard.predicted_first_heard_ms``:
        the context's own first hint, at the r with it counted in the load).
        Raises as ``open`` does."""
        name, found = self._voice(start, voice)
        key = (name, start.format, start.sample_rate, start.frame_ms)
        heard = self._heard.get(key)
        if heard is None:
            framer = make_framer(start, encode_rate(found.info, start), self.opus_config)
            heard = self._heard[key] = HeardFormat.of(found.info, framer)
        return predicted_first_heard_ms(self.stats_for(name), found.info, heard,
                                        self.hint_config, self.segmenter_config.limit,
                                        self.clock.now())

    def admission_first_heard_ms(self, start: Start, voice: str | None = None) -> float:
        """``predicted_first_heard_ms`` corrected by what the voice's listeners
        reported hearing (``heard.ListenerCorrection``): what admission
        compares with its target."""
        name, _ = self._voice(start, voice)
        return self.stats_for(name).heard.corrected_ms(self.predicted_first_heard_ms(start, name))

    def _voice(self, start: Start, voice: str | None) -> tuple[str, Voice]:
        name = voice or start.voice or self.default_voice
        found = self.voices.get(name)
        if found is None:
            raise UnknownVoice(f"unknown voice '{name}'; one of {', '.join(self.voices)}",
                               context=start.context)
        if (start.format not in AUDIO_FORMATS or start.sample_rate not in SAMPLE_RATES
                or start.frame_ms not in FRAME_MS):
            raise UnsupportedFormat(
                f"format {start.format}/{start.sample_rate} Hz/{start.frame_ms} ms: formats "
                f"{', '.join(AUDIO_FORMATS)}, rates {', '.join(map(str, SAMPLE_RATES))}, "
                f"frames {', '.join(map(str, FRAME_MS))} ms", context=start.context)
        return name, found
