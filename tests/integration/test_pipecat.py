"""The Pipecat TTS service in a minimal Pipecat pipeline against a real rtserver."""

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

LONG = ("Here is a long answer that keeps going for quite a while, so that there is "
        "time to interrupt it. It has several sentences. Each one adds a few more "
        "seconds of speech. The listener will cut in long before this ends. ") * 3


class Collect(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.first_audio = asyncio.Event()
        self.stopped = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        if isinstance(frame, TTSAudioRawFrame):
            self.first_audio.set()
        if isinstance(frame, TTSStoppedFrame):
            self.stopped.set()
        await self.push_frame(frame, direction)

    def audio(self) -> list[TTSAudioRawFrame]:
        return [f for f in self.frames if isinstance(f, TTSAudioRawFrame)]


@contextlib.asynccontextmanager
async def pipeline(server: ServerThread, rate: int = 24000):
    tts = RtserverTTSService(url=server.url)
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
        await asyncio.wait_for(run, 30)


async def say(task: PipelineWorker, tokens: list[str]) -> None:
    await task.queue_frame(LLMFullResponseStartFrame())
    for token in tokens:
        await task.queue_frame(LLMTextFrame(token))
    await task.queue_frame(LLMFullResponseEndFrame())


async def test_a_turn_streams_audio_frames_and_word_timestamps(server: ServerThread) -> None:
    async with pipeline(server, rate=16000) as (task, sink):
        text = "Hello from rtserver. This is a Pipecat pipeline."
        await say(task, [w + " " for w in text.split()])
        await asyncio.wait_for(sink.stopped.wait(), 30)
        await asyncio.sleep(0.5)  # word frames follow the audio's play clock
    audio = sink.audio()
    assert audio and all(f.sample_rate == 16000 and f.num_channels == 1 for f in audio)
    seconds = sum(len(f.audio) for f in audio) / 2 / 16000
    assert 1.5 < seconds < 8.0
    words = [f.text for f in sink.frames if isinstance(f, TTSTextFrame)]
    assert "Hello" in words and "pipeline." in words


async def test_an_interruption_cancels_the_turn(server: ServerThread) -> None:
    metric = 'rtserver_contexts_total{outcome="cancelled"}'
    before = server.call(lambda: server.server.app.metrics.contexts_total.labels(  # type: ignore
        "cancelled")._value.get())
    async with pipeline(server) as (task, sink):
        await say(task, [w + " " for w in LONG.split()])
        await asyncio.wait_for(sink.first_audio.wait(), 30)
        await task.queue_frame(InterruptionFrame())
        await asyncio.sleep(1.0)
        n = len(sink.audio())
        await asyncio.sleep(1.0)
        assert len(sink.audio()) == n  # nothing more after the interruption
    heard_s = sum(len(f.audio) for f in sink.audio()) / 2 / 24000
    assert heard_s < 20  # the whole reply is ~50 s of speech
    after = server.call(lambda: server.server.app.metrics.contexts_total.labels(  # type: ignore
        "cancelled")._value.get())
    assert after == before + 1, metric

