"""``rtserver say``: one utterance to 16-bit PCM.

In process (``speak_in_process``): the configured voices are loaded and the
text runs through the speech core (segmenter, voice, resampler, framer), as a
server's context would, with no server and no socket. Through a running
server (``speak_through_server``): the same utterance over the WebSocket
protocol with the project's client. Both ask for ``pcm_s16le``, so nothing
is lost to a codec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rtserver.config import Config
from rtserver.core import AudioFrames, SpeechCore, speak, voice_lexicons
from rtserver.errors import EngineFailed
from rtserver.protocol.messages import Cancelled, Done, ErrorMessage, SegmentStarted, Start
from rtserver.voices.registry import load_voices

TEXT_STEP = 4000  # characters per message to a server: under any max_message_bytes


@dataclass(frozen=True, slots=True)
class OneShotResult:
    pcm_s16le: bytes
    audio_ms: float
    segments: tuple[str, ...]
    voice: str
    ttfa_ms: float | None


async def speak_in_process(config: Config, text: str, *, sample_rate: int = 24000,
                           voice: str | None = None,
                           progress: Callable[[str], None] | None = None) -> OneShotResult:
    """Load the configured voices and speak ``text`` through the core."""
    say = progress or (lambda m: None)
    voices = await load_voices(config.voice, config.families, progress=say)
    try:
        # the whole text is already here (no client grows it): it is the bound
        core = SpeechCore(voices.voices, segmenter_config=config.segmenter,
                          hint_config=config.hints, opus_config=config.opus,
                          max_text_chars=max(config.server.max_text_chars, len(text), 1),
                          lexicons=voice_lexicons(config.voice.lexicons, list(voices.voices)))
        start = Start(context="say", voice=voice, format="pcm_s16le", sample_rate=sample_rate)
        pcm = bytearray()
        segments: list[str] = []
        async with speak(core, start) as stream:
            name = stream.context.voice.info.name
            stream.feed(text)
            stream.end()
            async for event in stream.events():
                if isinstance(event, AudioFrames):
                    for frame in event.frames:
                        pcm += frame
                elif isinstance(event, SegmentStarted):
                    segments.append(event.text)
                elif isinstance(event, ErrorMessage):
                    raise EngineFailed(f"{event.code}: {event.message}")
                elif isinstance(event, Done):
                    return OneShotResult(bytes(pcm), event.audio_ms, tuple(segments), name,
                                         event.ttfa_ms)
                elif isinstance(event, Cancelled):
                    break
        raise EngineFailed("the context ended without done")
    finally:
        await voices.close()


async def speak_through_server(url: str, text: str, *, sample_rate: int = 24000,
                               voice: str | None = None, token: str | None = None
                               ) -> OneShotResult:
    """Speak ``text`` on the server at ``url`` (``ws://HOST:PORT/v1/stream``)."""
    from rtserver.client import RtClient

    async with RtClient.connect(url, token=token) as client:
        ctx = await client.start("say", voice=voice, format="pcm_s16le",
                                 sample_rate=sample_rate)
        for i in range(0, len(text), TEXT_STEP):
            await ctx.send_text(text[i:i + TEXT_STEP])
        await ctx.end()
        result = await ctx.collect(decode=False)
    if result.failure is not None:
        raise EngineFailed(f"the server connection failed: {result.failure}")
    if result.error is not None:
        raise EngineFailed(f"{result.error.code}: {result.error.message}")
    if result.done is None:
        raise EngineFailed("the server ended the context without done")
    pcm = b"".join(f for m in result.frames for f in m.frames)
    segments = tuple(seg.text for _, seg in result.times.segments)
    return OneShotResult(pcm, float(result.done.audio_ms), segments, result.started.voice,
                         result.done.ttfa_ms)
