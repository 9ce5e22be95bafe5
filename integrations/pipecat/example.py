"""Speak a few LLM-like tokens through a Pipecat pipeline into a WAV file.

    python integrations/pipecat/example.py --url ws://127.0.0.1:8765/v1/stream --out hello.wav
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner
from rtserver_pipecat import RtserverTTSService

RATE = 24000


class WavWriter(FrameProcessor):
    """Stands in for a transport's output: writes the bot's audio to a file."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.wav = wave.open(path, "wb")
        self.wav.setnchannels(1)
        self.wav.setsampwidth(2)
        self.wav.setframerate(RATE)
        self.done = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.wav.writeframes(frame.audio)
        elif isinstance(frame, TTSStoppedFrame):
            self.done.set()
        await self.push_frame(frame, direction)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/stream")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--out", default="pipecat.wav")
    parser.add_argument("--text", default="Hello! This reply streams from an LLM, token by token.")
    args = parser.parse_args()

    tts = RtserverTTSService(url=args.url, voice=args.voice)
    out = WavWriter(args.out)
    worker = PipelineWorker(Pipeline([tts, out]), params=PipelineParams(audio_out_sample_rate=RATE),
                            idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    # what an LLM service pushes for one reply
    await worker.queue_frame(LLMFullResponseStartFrame())
    for word in args.text.split(" "):
        await worker.queue_frame(LLMTextFrame(word + " "))
    await worker.queue_frame(LLMFullResponseEndFrame())
    async with asyncio.timeout(60):
        await out.done.wait()
    await worker.queue_frame(EndFrame())
    await run
    out.wav.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
