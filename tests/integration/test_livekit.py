"""The LiveKit Agents TTS plugin in a minimal AgentSession against a real rtserver."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("livekit.agents")

from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities
from rtserver_livekit import TTS

from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import scaled, wait_until_async

LONG = ("Here is a long answer that keeps going for quite a while, so that there is "
        "time to interrupt it. It has several sentences. Each one adds a few more "
        "seconds of speech. The listener will cut in long before this ends. ") * 3


class Speaker(AudioOutput):
    """A loudspeaker that plays instantly: it keeps the frames it is given."""

    def __init__(self) -> None:
        super().__init__(label="test", next_in_chain=None, sample_rate=None,
                         capabilities=AudioOutputCapabilities(pause=False))
        self.frames: list[rtc.AudioFrame] = []
        self.first = asyncio.Event()
        self._segment_s = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self.first.is_set():
            self.on_playback_started(created_at=0.0)
        self.frames.append(frame)
        self._segment_s += frame.duration
        self.first.set()

    def flush(self) -> None:
        super().flush()
        self.on_playback_finished(playback_position=self._segment_s, interrupted=False)
        self._segment_s = 0.0

    def clear_buffer(self) -> None:
        self.on_playback_finished(playback_position=self._segment_s, interrupted=True)
        self._segment_s = 0.0

    @property
    def seconds(self) -> float:
        return sum(f.duration for f in self.frames)


async def session_with(server: ServerThread) -> tuple[AgentSession, Speaker]:
    session: AgentSession = AgentSession(tts=TTS(url=server.url, sample_rate=24000))
    speaker = Speaker()
    session.output.audio = speaker
    await session.start(Agent(instructions="Say what you are told."), record=False)
    return session, speaker


def cancelled_count(server: ServerThread) -> float:
    def read() -> float:
        assert server.server is not None and server.server.app is not None
        return server.server.app.metrics.contexts_total.labels("cancelled")._value.get()
    return float(server.call(read))


async def test_say_streams_audio_frames(server: ServerThread) -> None:
    session, speaker = await session_with(server)
    try:
        handle = session.say("Hello from rtserver. This is a LiveKit agent.")
        await asyncio.wait_for(handle.wait_for_playout(), scaled(30))
    finally:
        await session.aclose()
    assert speaker.frames
    assert all(f.sample_rate == 24000 and f.num_channels == 1 for f in speaker.frames)
    assert 1.5 < speaker.seconds < 8.0


async def test_an_interruption_cancels_the_context(server: ServerThread) -> None:
    before = cancelled_count(server)
    session, speaker = await session_with(server)
    try:
        handle = session.say(LONG)
        await asyncio.wait_for(speaker.first.wait(), scaled(30))
        handle.interrupt()
        await asyncio.wait_for(handle.wait_for_playout(), scaled(10))
        n = len(speaker.frames)  # what was played until the interruption took effect
        await wait_until_async(lambda: cancelled_count(server) == before + 1,
                               "the server cancels the interrupted speech's context")
    finally:
        await session.aclose()
    # the session is closed: every frame it was going to play is here
    assert len(speaker.frames) == n, "audio played after the interruption"
    assert speaker.seconds < 20  # the whole reply is ~50 s of speech
    assert cancelled_count(server) == before + 1


async def test_stream_carries_word_timestamps(server: ServerThread) -> None:
    rt = TTS(url=server.url, sample_rate=16000)
    stream = rt.stream()
    for word in "Hello there. Timing for the words.".split():
        stream.push_text(word + " ")
    stream.end_input()
    words = []
    async for ev in stream:
        assert ev.frame.sample_rate == 16000
        words.extend(ev.frame.userdata.get("lk.timed_transcripts", []))
    await stream.aclose()
    await rt.aclose()
    assert [str(w).strip() for w in words] == ["Hello", "there.", "Timing", "for", "the",
                                               "words."]
    starts = [w.start_time for w in words]
    assert starts == sorted(starts) and starts[0] == 0.0
    assert all(w.end_time >= w.start_time for w in words)
