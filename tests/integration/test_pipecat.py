"""The Pipecat TTS service in a minimal Pipecat pipeline against a real rtserver.

``rtserver_pipecat`` is imported as installed (from its wheel: scripts/setup.sh
installs it; tests/integration/test_plugin_wheels.py runs this file in a fresh
venv with only the wheels)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

pytest.importorskip("pipecat")

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner
from rtserver_pipecat import RtserverTTSService

from rtserver.testing.server_thread import ServerThread
from rtserver.testing.tcp_proxy import CutProxy
from rtserver.testing.wait import scaled, wait_until_async

LONG = ("Here is a long answer that keeps going for quite a while, so that there is "
        "time to interrupt it. It has several sentences. Each one adds a few more "
        "seconds of speech. The listener will cut in long before this ends. ") * 3


class Collect(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.first_audio = asyncio.Event()
        self.stopped = asyncio.Event()
        self.interrupted = asyncio.Event()
        self.interrupted_by: Frame | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        if isinstance(frame, TTSAudioRawFrame):
            self.first_audio.set()
        if isinstance(frame, TTSStoppedFrame):
            self.stopped.set()
        if isinstance(frame, InterruptionFrame) and self.interrupted_by is None:
            self.interrupted_by = frame
            self.interrupted.set()
        await self.push_frame(frame, direction)

    def audio(self) -> list[TTSAudioRawFrame]:
        return [f for f in self.frames if isinstance(f, TTSAudioRawFrame)]

    def words(self) -> list[str]:
        return [f.text for f in self.frames if isinstance(f, TTSTextFrame)]


    def stops(self) -> int:
        return sum(isinstance(f, TTSStoppedFrame) for f in self.frames)


@contextlib.asynccontextmanager
async def pipeline(server: ServerThread, rate: int = 24000, url: str | None = None,
                   voice: str | None = None):
    tts = RtserverTTSService(url=url or server.url, voice=voice)
    sink = Collect()
    task = PipelineWorker(Pipeline([tts, sink]),
                          params=PipelineParams(audio_out_sample_rate=rate),
                          idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    run = asyncio.create_task(runner.run())
    try:
        yield task, sink
    finally:
        await task.queue_frame(EndFrame())
        await asyncio.wait_for(run, scaled(30))


async def say(task: PipelineWorker, tokens: list[str]) -> None:
    await task.queue_frame(LLMFullResponseStartFrame())
    for token in tokens:
        await task.queue_frame(LLMTextFrame(token))
    await task.queue_frame(LLMFullResponseEndFrame())


async def test_a_turn_streams_audio_frames_and_word_timestamps(server: ServerThread) -> None:
    async with pipeline(server, rate=16000) as (task, sink):
        text = "Hello from rtserver. This is a Pipecat pipeline."
        await say(task, [w + " " for w in text.split()])
        await asyncio.wait_for(sink.stopped.wait(), scaled(30))
        # word frames follow the audio's play clock: the last comes after the audio
        await wait_until_async(lambda: "pipeline." in sink.words(), "the last word's frame")
    audio = sink.audio()
    assert audio and all(f.sample_rate == 16000 and f.num_channels == 1 for f in audio)
    seconds = sum(len(f.audio) for f in audio) / 2 / 16000
    assert 1.5 < seconds < 8.0
    assert "Hello" in sink.words()


def cancelled_count(server: ServerThread) -> float:
    def read() -> float:
        assert server.server is not None and server.server.app is not None
        return float(server.server.app.metrics.contexts_total.labels("cancelled")._value.get())
    return float(server.call(read))


async def test_an_interruption_cancels_the_turn(server: ServerThread) -> None:
    before = cancelled_count(server)
    async with pipeline(server) as (task, sink):
        await say(task, [w + " " for w in LONG.split()])
        await asyncio.wait_for(sink.first_audio.wait(), scaled(30))
        await task.queue_frame(InterruptionFrame())
        await asyncio.wait_for(sink.interrupted.wait(), scaled(30))
        await wait_until_async(lambda: cancelled_count(server) == before + 1,
                               "the server cancels the interrupted turn's context")
    # the pipeline has ended (EndFrame): every frame it was going to deliver is here
    after_interruption = sink.frames[sink.frames.index(sink.interrupted_by) + 1:]
    late = [f for f in after_interruption if isinstance(f, TTSAudioRawFrame)]
    assert not late, f"{len(late)} audio frames after the interruption"
    heard_s = sum(len(f.audio) for f in sink.audio()) / 2 / 24000
    assert heard_s < 20  # the whole reply is ~50 s of speech
    assert cancelled_count(server) == before + 1


async def test_the_connection_opens_when_the_pipeline_starts(server: ServerThread) -> None:
    proxy = await CutProxy.start("127.0.0.1", server.port)
    try:
        async with pipeline(server, url=f"ws://127.0.0.1:{proxy.port}/v1/stream") as (task, sink):
            # no text yet: the StartFrame alone opens the WebSocket
            await wait_until_async(lambda: proxy.open == 1, "the service's connection")
            await say(task, ["Connected before the first turn."])
            await asyncio.wait_for(sink.stopped.wait(), scaled(30))
            assert proxy.accepted == 1  # the turn used that connection
        assert sink.audio()
    finally:
        await proxy.close()


async def test_a_dropped_connection_is_reopened_and_the_next_turn_speaks(
        server: ServerThread) -> None:
    proxy = await CutProxy.start("127.0.0.1", server.port)
    try:
        async with pipeline(server, url=f"ws://127.0.0.1:{proxy.port}/v1/stream") as (task, sink):
            await say(task, ["Before the drop."])
            await wait_until_async(lambda: sink.stops() == 1, "the first turn's end")
            await proxy.cut()  # the network drops: no close frame
            await wait_until_async(lambda: proxy.accepted == 2 and proxy.open == 1,
                                   "the service reconnects on its own")
            heard = len(sink.audio())
            await say(task, ["After the drop, on the new connection."])
            await wait_until_async(lambda: sink.stops() == 2, "the second turn's end")
            assert len(sink.audio()) > heard
            assert proxy.accepted == 2
    finally:
        await proxy.close()


async def test_a_refused_turn_ends_without_audio(server: ServerThread) -> None:
    async with pipeline(server, voice="piper:no-such-voice") as (task, sink):
        await say(task, ["Nobody speaks this."])
        # the server refuses the start (unknown_voice): the turn ends, nothing waits on it
        await wait_until_async(lambda: sink.stops() == 1, "the refused turn's end")
    assert not sink.audio()
