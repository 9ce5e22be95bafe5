"""``rtserver say``: one utterance through the whole server pipeline.

Starts the server in-process on an ephemeral loopback port, streams the text
over the real protocol (PCM format, so nothing is lost to the codec) and
collects the audio. Slower to start than a bare voice call, but it is exactly
what a client of the server hears.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass

from websockets.asyncio.client import connect

from rtserver.config import Config
from rtserver.errors import EngineFailed
from rtserver.protocol.wire import decode_audio_message
from rtserver.server.app import RtServer


@dataclass(frozen=True, slots=True)
class OneShotResult:
    pcm_s16le: bytes
    audio_ms: float
    segments: tuple[str, ...]
    voice: str
    ttfa_ms: float | None


async def synthesize_to_pcm(config: Config, text: str, *, sample_rate: int = 24000,
                            progress: Callable[[str], None] | None = None) -> OneShotResult:
    server_cfg = dataclasses.replace(config.server, host="127.0.0.1", port=0,
                                     api_keys=(), max_text_chars=max(len(text),
                                                                     config.server.max_text_chars))
    server = RtServer(dataclasses.replace(config, server=server_cfg))
    await server.start(progress=progress)
    try:
        url = f"ws://127.0.0.1:{server.port}/v1/stream"
        async with connect(url, compression=None, max_size=None) as ws:
            ready = json.loads(await ws.recv())
            assert ready["type"] == "ready"
            await ws.send(json.dumps({"type": "start", "context": "say",
                                      "format": "pcm_s16le", "sample_rate": sample_rate}))
            step = 4000  # stay under max_message_bytes for any text
            for i in range(0, len(text), step):
                await ws.send(json.dumps({"type": "text", "context": "say",
                                          "text": text[i:i + step]}))
            await ws.send(json.dumps({"type": "end", "context": "say"}))
            pcm = bytearray()
            segments: list[str] = []
            voice = ""
            async for message in ws:
                if isinstance(message, bytes):
                    for frame in decode_audio_message(message).frames:
                        pcm.extend(frame)
                    continue
                msg = json.loads(message)
                if msg["type"] == "started":
                    voice = msg.get("voice", "")
                elif msg["type"] == "segment":
                    segments.append(msg["text"])
                elif msg["type"] == "error":
                    raise EngineFailed(f"{msg['code']}: {msg['message']}")
                elif msg["type"] == "done":
                    return OneShotResult(bytes(pcm), float(msg["audio_ms"]), tuple(segments),
                                         voice, msg.get("ttfa_ms"))
        raise EngineFailed("the server closed before the utterance was done")
    finally:
        await server.close()
