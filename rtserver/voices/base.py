"""The narrow interface between the speech core and a voice family."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Literal, Protocol

import msgspec

from rtserver.audio.pcm import PcmChunk
from rtserver.clock import SYSTEM_CLOCK, Clock
from rtserver.protocol.messages import VoiceCapabilities, VoiceDescription
from rtserver.text.lexicon import PhonemeSpan

WordTimingKind = Literal["model", "estimated"]

SPEED_RANGE = (0.5, 2.0)  # what ``start.speed`` may ask (docs/PROTOCOL-EXTENSIONS.md)
SSML_ALWAYS = ("speak", "break", "sub")  # the SSML every voice honours (the core does them)


@dataclass(frozen=True, slots=True)
class SpeechControls:
    """What a voice does with a context's pronunciation and speed requests
    (issue 29); each family sets its own (``CONTROLS`` in its voice module).

    Lexicon aliases, SSML ``<speak>``, ``<break>`` and ``<sub>`` work for
    every voice (the core applies them to the text and the audio);
    the rest depends on the voice.
    """

    # The phoneme alphabet of lexicon phonemes and SSML ``<phoneme>`` ("ipa"),
    # "" when the voice takes no phonemes.
    phoneme_alphabet: str = ""
    # The phoneme symbols the voice knows (after NFD); empty: not checked.
    phoneme_symbols: frozenset[str] = frozenset()
    # ``speed`` the voice honours (``start.speed``, SSML ``<prosody rate>``):
    # (slowest, fastest), or None when it has no speed control.
    speed_range: tuple[float, float] | None = None

    @property
    def phonemes(self) -> bool:
        return bool(self.phoneme_alphabet)

    def ssml_elements(self) -> tuple[str, ...]:
        """The SSML elements the voice honours (the core does ``SSML_ALWAYS``)."""
        return (SSML_ALWAYS + (("phoneme",) if self.phonemes else ())
                + (("prosody",) if self.speed_range is not None else ()))

    def capabilities(self) -> dict[str, object]:
        """The capability flags of these features, as ``ready.voice_info`` and
        ``GET /v1/voices`` list them: ``lexicon`` (entry kinds it honours),
        ``ssml`` (the elements), ``speed`` ([slowest, fastest] or None)."""
        ssml = list(self.ssml_elements())
        return {
            "lexicon": ["alias", "phoneme"] if self.phonemes else ["alias"],
            "phoneme_alphabet": self.phoneme_alphabet or None,
            "ssml": ssml,
            "speed": list(self.speed_range) if self.speed_range is not None else None,
        }


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """What ``ready.voices`` and ``GET /v1/voices`` say about a voice."""

    name: str
    family: str  # its family's registry name (the spec prefix)
    sample_rate: int  # native output rate in Hz
    language: str = "en"
    description: str = ""
    # A voice that streams within a segment gives the audio (ms) of the chunks
    # it yields for one segment, in order (the hint maths plans with them);
    # empty: one chunk per sentence, the whole sentence synthesized at once.
    chunk_plan_ms: tuple[float, ...] = ()
    # The audio (ms) of model output each of those chunks waits for (a
    # vocoder's decode emits only up to its lookahead); empty: the chunk's own.
    chunk_cost_ms: tuple[float, ...] = ()
    # The same two for a context's first segment, where a voice cuts its
    # chunks smaller (its first audio decides when the listener starts);
    # empty: the plan above.
    first_chunk_plan_ms: tuple[float, ...] = ()
    first_chunk_cost_ms: tuple[float, ...] = ()
    # How many segments the voice makes at full speed at once (a CPU voice:
    # its worker threads); more at once share them, so each is slower in
    # proportion. 0: not bounded that way (a batching engine on a GPU).
    parallel_segments: int = 0
    # A batching engine's rows: segments it makes at once, each at the r its
    # load is measured at, so contexts starting together share them instead of
    # queueing (``core.first_heard.queued_ahead_ms``). 0: not a batching engine.
    batch_rows: int = 0
    # Where the times of its ``words`` events come from: "model" (the voice
    # puts the model's own word times on its chunks, ``PcmChunk.words``) or
    # "estimated" (the core spreads a segment's words over its expected audio
    # by character count). ``describe`` puts it in the capability flags.
    word_timing: WordTimingKind = "estimated"
    # What the voice can do (its family's ``capabilities.py`` says it).
    capabilities: VoiceCapabilities = field(default_factory=VoiceCapabilities)
    # Every language it speaks (BCP 47 or the model's codes); empty: ``language``.
    languages: tuple[str, ...] = ()

    # Lexicon phonemes, SSML and speed (``SpeechControls.capabilities()``).
    controls: SpeechControls = SpeechControls()

    def describe(self) -> VoiceDescription:
        """The voice as ``ready.voice_info`` and ``GET /v1/voices`` show it: the
        family's flags (``capabilities``) with what this voice's word timing and
        controls say (one source for each)."""
        c = self.controls
        caps = msgspec.structs.replace(
            self.capabilities, word_timing=self.word_timing,
            lexicon=("alias", "phoneme") if c.phonemes else ("alias",),
            ssml=c.ssml_elements(),
            speed=c.speed_range is not None, speed_range=c.speed_range,
            phoneme_alphabet=c.phoneme_alphabet or None)
        return VoiceDescription(family=self.family, languages=self.languages or (self.language,),
                                sample_rate=self.sample_rate, capabilities=caps)


class Marks(dict[str, float]):
    """Times a voice records for a context's first audio, on the core's clock."""

    __slots__ = ("clock",)

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def mark(self, name: str) -> None:
        """Record ``name`` now, unless it is recorded already."""
        if name not in self:
            self[name] = self.clock.now()


@dataclass(frozen=True, slots=True)
class SynthesisRequest:
    """One segment to speak.

    ``first`` marks the first segment of a context: engines schedule it ahead
    of later segments (it decides TTFA). ``request_id`` is unique per server.
    """

    text: str
    request_id: str
    first: bool = False
    # When the listener will need this audio, on ``clock``; voices that queue
    # work serve the earliest deadline first. None: now.
    deadline: float | None = None
    # Set by the core for a context's first segment: a voice that can tell
    # when its model's output for the first audio arrived records it with
    # ``marks.mark(MODEL_OUTPUT_MARK)``; TTFA's parts are reported.
    marks: Marks | None = None
    # The core's clock: the one a voice reads for marks and deadlines.
    clock: Clock = SYSTEM_CLOCK
    # IPA for spans of ``text`` (a lexicon, SSML ``<phoneme>``): only for a
    # voice whose ``controls`` take phonemes, checked against its symbols.
    phonemes: tuple[PhonemeSpan, ...] = ()
    # Speaking rate (1: the voice's own), within ``controls.speed_range``.
    speed: float = 1.0

    def held_s(self) -> float | None:
        """Seconds until ``deadline`` on ``clock``: the audio its listener still
        holds from the context's earlier segments (None without a deadline)."""
        return None if self.deadline is None else self.deadline - self.clock.now()


MODEL_OUTPUT_MARK = "model_output"


class VoiceMaker(Protocol):
    """A family's maker of voices at run time (Orpheus: LoRA adapters on its
    base model), behind ``POST /v1/admin/voices``.

    ``add`` returns the new voice (named ``<family>:<name>``), or raises
    ``rtserver.errors.UnknownVoice`` (``BadAdapter``) with the reason;
    ``remove`` forgets one it made and returns it (requests in flight on it
    finish first), ``UnknownVoice`` if it made none of that name."""

    async def add(self, name: str, adapter: str, speaker: str | None = None) -> Voice: ...

    async def remove(self, name: str) -> Voice: ...


class Voice(Protocol):
    """A loaded voice. ``synthesize`` streams the segment's PCM in order.

    Cancelling the consuming task (or ``aclose()`` on the iterator) must stop
    the work for that request promptly and free what it holds; a failure
    raises ``rtserver.errors.EngineFailed`` and touches no other request.
    """

    @property
    def info(self) -> VoiceInfo: ...

    async def warm_up(self) -> None: ...

    def synthesize(self, request: SynthesisRequest) -> AsyncGenerator[PcmChunk, None]: ...

    async def close(self) -> None: ...
