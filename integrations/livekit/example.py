"""Speak a line through a LiveKit Agents AgentSession into a WAV file.

    python integrations/livekit/example.py --url ws://127.0.0.1:8765/v1/stream --out hello.wav

In a real agent the session joins a room (``session.start(agent, room=ctx.room)``)
and the room's audio track plays what the TTS makes; here a file stands in.
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities
from rtserver_livekit import TTS

RATE = 24000


class WavOutput(AudioOutput):
    """Stands in for the room's audio track: writes the agent's speech to a file."""

    def __init__(self, path: str) -> None:
        super().__init__(label="wav", next_in_chain=None, sample_rate=RATE,
                         capabilities=AudioOutputCapabilities(pause=False))
        self.wav = wave.open(path, "wb")
        self.wav.setnchannels(1)
        self.wav.setsampwidth(2)
        self.wav.setframerate(RATE)
        self.pushed_s = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self.pushed_s == 0.0:
            self.on_playback_started(created_at=0.0)
        self.wav.writeframes(bytes(frame.data))
        self.pushed_s += frame.duration

    def flush(self) -> None:
        super().flush()
        self.on_playback_finished(playback_position=self.pushed_s, interrupted=False)

    def clear_buffer(self) -> None:
        self.on_playback_finished(playback_position=self.pushed_s, interrupted=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="ws://127.0.0.1:8765/v1/stream")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--out", default="livekit.wav")
    parser.add_argument("--text", default="Hello! This agent speaks through rtserver.")
    args = parser.parse_args()

    session: AgentSession = AgentSession(tts=TTS(url=args.url, voice=args.voice,
                                                 sample_rate=RATE))
    output = WavOutput(args.out)
    session.output.audio = output
    await session.start(Agent(instructions="Read the text aloud."), record=False)
    await session.say(args.text).wait_for_playout()
    await session.aclose()
    output.wav.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    asyncio.run(main())
