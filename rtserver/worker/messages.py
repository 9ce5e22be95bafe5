"""What front ends and a GPU worker say to each other: typed msgspec Structs
in msgpack, a tagged union each way (the way vLLM V1's ``EngineCoreRequest`` /
``EngineCoreOutputs`` travel: msgspec over ZMQ, pickle nowhere).

A message is one ZMQ frame; a ``Chunk`` is followed by a second frame, its
PCM (mono float32, native byte order, ``sample_rate`` Hz), sent without a copy
and read in place. Times (``deadline``, ``model_output_at``, ``sent_at``) are
CLOCK_MONOTONIC seconds, which Linux shares between processes.

Down (front end -> worker): ``Hello``, ``Synthesize``, ``Cancel``, ``Ping``,
``MakeVoice``, ``DropVoice``.
Up (worker -> front end): ``Ready`` (to every ``Hello``), ``Load`` (to every
``Ping``), ``Chunk``, ``End``, ``Failed``, ``Voices`` (to every front end,
after a voice was made or dropped; then ``End`` or ``Failed`` answers the
``MakeVoice`` / ``DropVoice``).
"""

from __future__ import annotations

import msgspec

from rtserver.protocol.messages import VoiceCapabilities
from rtserver.voices.base import SpeechControls


class VoiceEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A voice the worker serves (``rtserver.voices.base.VoiceInfo``'s fields).

    Not ``word_timing``: the word times a voice puts on its chunks
    (``PcmChunk.words``) do not cross the link, so a worker's voices give
    estimated words (the default)."""

    name: str
    family: str
    sample_rate: int
    language: str = "en"
    description: str = ""
    chunk_plan_ms: tuple[float, ...] = ()
    chunk_cost_ms: tuple[float, ...] = ()
    first_chunk_plan_ms: tuple[float, ...] = ()
    first_chunk_cost_ms: tuple[float, ...] = ()
    parallel_segments: int = 0
    batch_rows: int = 0
    capabilities: VoiceCapabilities = VoiceCapabilities()
    languages: tuple[str, ...] = ()
    controls: SpeechControls = SpeechControls()


class Hello(msgspec.Struct, frozen=True, kw_only=True, tag="hello"):
    """A front end (re)introduces itself; the worker answers ``Ready``."""

    pid: int


class Synthesize(msgspec.Struct, frozen=True, kw_only=True, tag="synthesize"):
    """Speak ``text`` with ``voice``: a ``SynthesisRequest`` across the seam.
    ``request_id`` is unique within the sending front end."""

    request_id: str
    voice: str
    text: str
    first: bool = False
    deadline: float | None = None  # CLOCK_MONOTONIC
    want_marks: bool = False  # send back when the model's first output came
    # the request id of the context it speaks for (rtserver.logs): the
    # worker's log lines about it carry it too
    log_id: str | None = None
    speed: float = 1.0  # SynthesisRequest.speed


class Cancel(msgspec.Struct, frozen=True, kw_only=True, tag="cancel"):
    """Stop ``request_id`` and free what it holds (its engine row, vocoder state)."""

    request_id: str


class MakeVoice(msgspec.Struct, frozen=True, kw_only=True, tag="make_voice"):
    """Make the voice ``<family>:<name>`` at run time (a LoRA adapter in the
    worker's file system, prompted as ``speaker``); answered ``End`` or ``Failed``."""

    request_id: str
    family: str
    name: str
    adapter: str
    speaker: str = ""


class DropVoice(msgspec.Struct, frozen=True, kw_only=True, tag="drop_voice"):
    """Drop a voice made at run time (its full name); answered ``End`` or ``Failed``."""

    request_id: str
    name: str


class Ping(msgspec.Struct, frozen=True, kw_only=True, tag="ping"):
    """The front end's heartbeat; the worker answers ``Load``."""


class Ready(msgspec.Struct, frozen=True, kw_only=True, tag="ready"):
    """The worker's voices, loaded and warm. ``epoch`` changes with each start
    of a worker (a front end that sees a new one knows the old one is gone)."""

    epoch: str
    pid: int
    voices: tuple[VoiceEntry, ...]
    by_spec: dict[str, str]  # configured spec -> voice name
    default: str
    capacity: dict[str, int]  # family -> requests it serves at once
    makers: tuple[str, ...] = ()  # families that make voices at run time (MakeVoice)


class Voices(msgspec.Struct, frozen=True, kw_only=True, tag="voices"):
    """The worker's voices changed (one made or dropped at run time): all of them now."""

    epoch: str
    voices: tuple[VoiceEntry, ...]


class Load(msgspec.Struct, frozen=True, kw_only=True, tag="load"):
    """Requests the worker holds now, per family, against ``capacity``; and
    of them, the contexts' first segments whose first output has not come
    yet (``starting``: every front end's; ``starting_yours``: the share of
    the front end this ``Load`` goes to). A start storm spread over several
    front ends is queued here, where each front end sees only its part: a
    front end adds the others' part to its first ``buffer`` hints and its
    predicted first heard audio. Sent to every ``Ping``, and to every front
    end within ``proc.LOAD_PUSH_S`` of a change of ``starting``. A worker
    that does not send the two (an older one) counts as none starting.

    ``rtf``: per family, the r (generation time / audio time) of the requests
    completed here lately, every front end's, at the present load
    (``WorkerServer.rtf``). A front end that has measured none of a voice's
    segments yet plans its hints with it rather than ``[hints] default_rtf``."""

    epoch: str
    active: dict[str, int]
    capacity: dict[str, int]
    starting: dict[str, int] = msgspec.field(default_factory=dict)
    starting_yours: dict[str, int] = msgspec.field(default_factory=dict)
    rtf: dict[str, float] = msgspec.field(default_factory=dict)


class Chunk(msgspec.Struct, frozen=True, kw_only=True, tag="chunk"):
    """The next PCM of ``request_id``; the samples are the next frame."""

    request_id: str
    sample_rate: int
    sent_at: float = 0.0  # CLOCK_MONOTONIC, when the worker sent it
    model_output_at: float | None = None  # CLOCK_MONOTONIC, with the first chunk


class End(msgspec.Struct, frozen=True, kw_only=True, tag="end"):
    """``request_id`` is complete."""

    request_id: str


class Failed(msgspec.Struct, frozen=True, kw_only=True, tag="failed"):
    """``request_id`` failed; ``code`` is an ``rtserver.errors.ErrorCode`` value."""

    request_id: str
    code: str
    message: str
    retry_after_ms: int | None = None


Down = Hello | Synthesize | Cancel | Ping | MakeVoice | DropVoice
Up = Ready | Load | Chunk | End | Failed | Voices

encode = msgspec.msgpack.Encoder().encode
decode_down = msgspec.msgpack.Decoder(Down).decode
decode_up = msgspec.msgpack.Decoder(Up).decode

__all__ = ["Cancel", "Chunk", "Down", "DropVoice", "End", "Failed", "Hello", "Load",
           "MakeVoice", "Ping", "Ready", "Synthesize", "Up", "VoiceEntry", "Voices",
           "decode_down", "decode_up", "encode"]
