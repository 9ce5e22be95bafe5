"""The speech core: a context's text becomes timed audio events for a sink.

``SpeechCore`` holds the voices and what contexts share; ``core.open(start,
sink)`` gives a ``SpeechContext`` (``feed``/``flush``/``end``, ``await run()``,
``await cancel()``); ``speak(core, start)`` runs one with a queue to iterate;
``core.predicted_first_heard_ms(start)`` is the one model of first heard
audio (``first_heard``), and ``core.admission_first_heard_ms(start)`` the
same corrected by what listeners reported (``heard``: ``played``), which
admission compares with its target. Modules, top to bottom
(``lint-imports``): stream, speech, context, speaker, segments and
first_heard, inputs and framing and shared and pronounce, events and stats
and words, heard.
No transport here: the WebSocket server, the HTTP endpoint and ``rtserver say``
are sinks.
"""

from rtserver.core.context import SpeechContext
from rtserver.core.events import (
    AudioFrames,
    ControlEvent,
    Event,
    Finished,
    Ledger,
    Sink,
    SinkClosed,
)
from rtserver.core.pronounce import Pronouncer, voice_lexicons
from rtserver.core.speech import SpeechCore
from rtserver.core.stats import ServerLoad, VoiceStats
from rtserver.core.stream import ContextStream, EventQueue, StreamEvent, speak

__all__ = [
    "AudioFrames",
    "ContextStream",
    "ControlEvent",
    "Event",
    "EventQueue",
    "Finished",
    "Ledger",
    "Pronouncer",
    "ServerLoad",
    "Sink",
    "SinkClosed",
    "SpeechContext",
    "SpeechCore",
    "StreamEvent",
    "VoiceStats",
    "speak",
    "voice_lexicons",
]
