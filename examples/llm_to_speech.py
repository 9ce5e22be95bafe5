"""Pipe an LLM's streaming reply into rtserver as it is generated; save the speech.

    python examples/llm_to_speech.py --llm http://127.0.0.1:8000/v1 --model MODEL \
        --tts ws://127.0.0.1:8765/v1/stream --out reply.wav "Tell me about the sea."

Any OpenAI-compatible chat endpoint works as the LLM (vLLM, llama.cpp, Ollama, ...).
The reply's tokens go to rtserver one by one (``send_tokens``); audio comes back
while the LLM is still writing. ``report_played`` tells the server how much the
listener has heard (here the file "plays" as fast as it is written).
"""

from __future__ import annotations

import argparse
import asyncio
import wave

from openai import AsyncOpenAI

from rtserver.client import AudioFrames, RtClient, openai_text, report_played, send_tokens


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("prompt")
    p.add_argument("--llm", default="http://127.0.0.1:8000/v1")
    p.add_argument("--llm-key", default="none")
    p.add_argument("--model", required=True)
    p.add_argument("--tts", default="ws://127.0.0.1:8765/v1/stream")
    p.add_argument("--out", default="reply.wav")
    args = p.parse_args()

    llm = AsyncOpenAI(base_url=args.llm, api_key=args.llm_key)
    reply = await llm.chat.completions.create(
        model=args.model, stream=True, messages=[{"role": "user", "content": args.prompt}])

    pcm: list[bytes] = []
    heard_ms = 0.0
    async with RtClient.connect(args.tts) as tts:
        ctx = await tts.start(format="pcm_s16le", sample_rate=24000)
        sender = asyncio.create_task(send_tokens(ctx, openai_text(reply)))
        reporter = asyncio.create_task(report_played(ctx, lambda: heard_ms))
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                pcm.extend(event.frames)  # a player would play these now
                heard_ms += len(event.frames) * ctx.frame_ms
        await sender
        await reporter

    with wave.open(args.out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(24000)
        wav.writeframes(b"".join(pcm))
    print(f"wrote {args.out}: {heard_ms / 1000:.1f} s of speech")


if __name__ == "__main__":
    asyncio.run(main())
