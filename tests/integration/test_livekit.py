"""The LiveKit Agents TTS plugin in a minimal AgentSession against a real rtserver.

``rtserver_livekit`` is imported as installed (from its wheel: scripts/setup.sh
installs it; tests/integration/test_plugin_wheels.py runs this file in a fresh
venv with only the wheels)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("livekit.agents")

from livekit import rtc
from livekit.agents import (
    Agent,
    AgentSession,
    APIConnectionError,
    APIConnectOptions,
    APIStatusError,
)
from livekit.agents.tts import TTSError
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities
from rtserver_livekit import TTS

from rtserver.client import RtClient, say_sync
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


def rejected(server: ServerThread, reason: str) -> float:
    def read() -> float:
        assert server.server is not None and server.server.app is not None
        return server.server.app.metrics.rejected.labels(reason)._value.get()
    return float(server.call(read))


async def speak(rt: TTS, text: str, options: APIConnectOptions) -> tuple[float, list[TTSError]]:
    """Stream ``text`` through a new stream: (seconds of audio, the TTS's error events)."""
    errors: list[TTSError] = []
    rt.on("error", errors.append)
    stream = rt.stream(conn_options=options)
    stream.push_text(text)
    stream.end_input()
    try:
        seconds = 0.0
        async for ev in stream:
            seconds += ev.frame.duration
        return seconds, errors
    finally:
        await stream.aclose()


@pytest.fixture(scope="module")
def busy_server() -> Iterator[ServerThread]:
    """Every new context refused as `overloaded` (a first-heard target no context
    can meet) with retry_after_ms 600, once the server has measured its voice
    (admission predicts from what it measured: the first context is let in)."""
    srv = ServerThread.with_settings(admission={"first_heard_target_ms": 0.001,
                                                "retry_min_ms": 600,
                                                "retry_max_ms": 600}).start()
    assert say_sync(srv.url, "Measure this.").ok
    yield srv
    srv.stop()


async def test_overloaded_is_retried_max_retry_times_after_the_servers_delay(
        busy_server: ServerThread) -> None:
    before = rejected(busy_server, "overloaded")
    rt = TTS(url=busy_server.url, sample_rate=24000)
    options = APIConnectOptions(max_retry=2, retry_interval=0.05, timeout=10.0)
    t0 = time.monotonic()
    with pytest.raises(APIStatusError) as info:
        await speak(rt, "Nobody hears this.", options)
    took = time.monotonic() - t0
    await rt.aclose()
    assert info.value.status_code == 503 and info.value.retryable
    # 1 + max_retry attempts, each refused; the retries waited the server's 600 ms,
    # not the 50 ms retry_interval
    assert rejected(busy_server, "overloaded") == before + 3
    assert took >= 2 * 0.6


@pytest.fixture(scope="module")
def rate_limited_server() -> Iterator[ServerThread]:
    """600 characters a minute per client: a bucket of 600, refilled at 10 a second."""
    srv = ServerThread.with_settings(admission={"chars_per_minute": 600}).start()
    yield srv
    srv.stop()


async def test_rate_limited_text_is_retried_after_the_servers_delay_and_speaks(
        rate_limited_server: ServerThread) -> None:
    srv = rate_limited_server
    async with RtClient.connect(srv.url) as client:  # the same client address: empty the bucket
        ctx = await client.start(format="pcm_s16le", sample_rate=24000)
        await ctx.send_text("Hello. " * 85 + "Hello")  # 600 characters
        await ctx.cancel()
    before = rejected(srv, "rate_limited")
    rt = TTS(url=srv.url, sample_rate=24000)
    text = "Hello there, again."  # 19 characters: about 1.9 s until the bucket has them
    t0 = time.monotonic()
    seconds, errors = await speak(rt, text, APIConnectOptions(max_retry=3, retry_interval=0.05,
                                                              timeout=10.0))
    took = time.monotonic() - t0
    await rt.aclose()
    assert rejected(srv, "rate_limited") == before + 1
    assert [e.recoverable for e in errors] == [True]
    assert isinstance(errors[0].error, APIStatusError) and errors[0].error.status_code == 429
    assert took >= 1.5  # the server's retry_after_ms, not the 50 ms retry_interval
    assert 0.5 < seconds < 5.0


async def test_timeout_and_max_retry_come_from_conn_options() -> None:
    accepted = 0

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.read()  # never answers the handshake; ends when the client gives up
        writer.close()

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = silent.sockets[0].getsockname()[1]
    rt = TTS(url=f"ws://127.0.0.1:{port}/v1/stream", sample_rate=24000)
    t0 = time.monotonic()
    try:
        with pytest.raises(APIConnectionError):
            await speak(rt, "Hello?", APIConnectOptions(max_retry=1, retry_interval=0.05,
                                                        timeout=0.3))
    finally:
        took = time.monotonic() - t0
        await rt.aclose()
        silent.close()
    assert accepted == 2  # 1 + max_retry attempts
    assert took < 5.0  # 0.3 s each, not the default 10 s
