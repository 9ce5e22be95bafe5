"""The naive non-streaming baseline: how most HTTP TTS answers.

The server (``python -m rtserver.tools.bench.baseline --port P --voice V``) loads the same
voice as rtserver, through the same registry and synthesis pool, and answers
``POST /v1/tts`` (body: the reply's text, UTF-8) only once the *whole* text
is synthesized, with one WAV file (16-bit PCM at the voice's rate). It never
sees partial text: the client must have the LLM's whole reply first.

The client side (``run_baseline_turn``) uses the same turn plans as the
streaming loads: fragments are "produced" on the same schedule, collected,
and posted when the last one is there. It is measured with the same rules as
rtserver (``rtserver.tools.bench.measure``): the baseline's only segment is the whole text,
so its TTFA is from the last fragment to the first byte of audio;
``ttfa_first_text_ms`` is from the first fragment, the user's wait. The WAV
body, read as it arrives, feeds the same simulated listener.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import random
import signal
import sys
import time
import wave
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from rtserver.tools.bench.loads import (
    LoadConfig,
    RunState,
    Sample,
    TurnPlan,
    listening_pause,
    plan_turn,
)
from rtserver.tools.bench.measure import TurnRecord, analyze

_ids = itertools.count()
MAX_BODY = 1 << 20  # 1 MiB of text is far beyond any chat reply


# --- server -------------------------------------------------------------------------------

def _normalizer() -> Callable[[str], str]:
    """rtserver's own text normalization (markdown, emoji, ...), so both speak
    the same words."""
    from rtserver.text.normalize import normalize

    return normalize


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length > MAX_BODY:
        return None
    body = await reader.readexactly(length) if length else b""
    return method, path, body


def _response(status: str, body: bytes, ctype: str = "text/plain") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n").encode() + body


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    pcm = np.clip(samples, -1.0, 1.0)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes((pcm * 32767.0).astype("<i2").tobytes())
    return buf.getvalue()


async def serve(host: str, port: int, voice_spec: str | None) -> None:
    from rtserver.config import load_config
    from rtserver.voices.base import SynthesisRequest
    from rtserver.voices.registry import load_voices

    config = load_config(None, flags={"voice.default": voice_spec})
    voices = await load_voices(config.voice, config.families,
                               progress=lambda m: print(f"baseline: {m}", file=sys.stderr))
    voice = voices.voices[voices.default]
    await voices.warm_up()
    normalize = _normalizer()
    ready = True

    async def synthesize(text: str) -> bytes:
        chunks = []
        request = SynthesisRequest(text=normalize(text), request_id=f"baseline-{next(_ids)}",
                                   first=True)
        async for chunk in voice.synthesize(request):
            chunks.append(chunk.samples)
        audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        return wav_bytes(audio, voice.info.sample_rate)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    writer.write(_response("413 Payload Too Large", b"too long"))
                    break
                method, path, body = req
                if method == "GET" and path in ("/ready", "/health"):
                    writer.write(_response("200 OK" if ready else "503 Service Unavailable",
                                           b"ok"))
                elif method == "POST" and path == "/v1/tts":
                    try:
                        audio = await synthesize(body.decode("utf-8"))
                        writer.write(_response("200 OK", audio, "audio/wav"))
                    except Exception as exc:  # report, keep serving
                        writer.write(_response("500 Internal Server Error", str(exc).encode()))
                else:
                    writer.write(_response("404 Not Found", b"not found"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    print(f"baseline: listening on {host}:{port}", file=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    await voices.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rtserver.tools.bench.baseline", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--voice", default=None)
    args = p.parse_args(argv)
    asyncio.run(serve(args.host, args.port, args.voice))
    return 0


# --- client -------------------------------------------------------------------------------

class BaselineConnection:
    """One keep-alive HTTP/1.1 connection to the baseline server."""

    def __init__(self, base_url: str, clock: Callable[[], float] = time.monotonic) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.clock = clock
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> BaselineConnection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    async def post(self, text: str) -> tuple[float, int, list[tuple[float, int]], bytes]:
        """Send the text; ``(sent_at, status, [(time, bytes)] per body read, body)``."""
        assert self._reader is not None and self._writer is not None
        body = text.encode("utf-8")
        head = (f"POST /v1/tts HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: text/plain; "
                f"charset=utf-8\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        sent_at = self.clock()
        self._writer.write(head + body)
        await self._writer.drain()
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        length = next(int(v.strip()) for n, _, v in (ln.partition(":") for ln in lines[1:])
                      if n.strip().lower() == "content-length")
        reads: list[tuple[float, int]] = []
        parts: list[bytes] = []
        got = 0
        while got < length:
            chunk = await self._reader.read(min(65536, length - got))
            if not chunk:
                raise ConnectionError("baseline server closed mid-body")
            reads.append((self.clock(), len(chunk)))
            parts.append(chunk)
            got += len(chunk)
        return sent_at, status, reads, b"".join(parts)


async def run_baseline_turn(conn: BaselineConnection, plan: TurnPlan, cfg: LoadConfig
                            ) -> Sample:
    """The same turn as ``rtserver.tools.bench.loads.run_turn``, answered the non-streaming way."""
    clock = conn.clock
    began = clock()
    text_sent: list[tuple[float, int, int]] = []
    pos = 0
    t0 = clock()
    for frag, off in zip(plan.fragments, plan.offsets, strict=True):
        delay = t0 + off - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        text_sent.append((clock(), pos, pos + len(frag)))  # produced; held until the end
        pos += len(frag)
    text = "".join(plan.fragments)
    base: dict[str, Any] = {"kind": plan.kind, "utterance": plan.utterance.id,
                            "tags": list(plan.utterance.tags), "began_at": began}
    try:
        sent_at, status, reads, body = await conn.post(text)
    except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration) as exc:
        return {**base, "outcome": "failed", "error": type(exc).__name__,
                "error_message": str(exc)}
    if status != 200:
        return {**base, "outcome": "error", "error": f"http_{status}",
                "error_message": body[:200].decode("utf-8", "replace")}
    with wave.open(io.BytesIO(body), "rb") as w:
        rate = w.getframerate()
        header = len(body) - w.getnframes() * 2
    # bytes of audio -> frames of cfg.frame_ms as they came in (the header first)
    bytes_per_frame = rate * cfg.frame_ms // 1000 * 2
    arrivals: list[tuple[float, int, int]] = []
    audio_bytes = -header
    seq = 0
    for at, n in reads:
        audio_bytes += n
        whole = max(0, audio_bytes) // bytes_per_frame
        if at == reads[-1][0] and audio_bytes > whole * bytes_per_frame:
            whole += 1  # the padded last frame
        if whole > seq:
            arrivals.append((at, seq, whole - seq))
            seq = whole
    record = TurnRecord(text=text, frame_ms=cfg.frame_ms, text_sent=tuple(text_sent),
                        end_sent_at=sent_at, seg0_source=(0, len(text)),
                        arrivals=tuple(arrivals), outcome="done",
                        finished_at=reads[-1][0] if reads else sent_at)
    return {**base, **analyze(record, cfg.listener), "segments": 1, "errors_in_context": 0}


async def closed_loop(base_url: str, cfg: LoadConfig, users: int, duration_s: float,
                      seed: str, state: RunState) -> None:
    """``users`` users posting turns back to back until ``duration_s`` from now
    (the same plans, seeded the same way, as ``rtserver.tools.bench.loads.closed_loop``)."""
    clock = state.clock
    stop_at = clock() + duration_s
    kind = "whole" if cfg.pattern == "whole" else "stream"

    async def user(k: int) -> None:
        rng = random.Random(f"{seed}:user{k}")
        turn = 0
        state.active += 1
        try:
            while clock() < stop_at:
                try:
                    async with BaselineConnection(base_url, clock) as conn:
                        while clock() < stop_at:
                            active = state.active
                            sample = await run_baseline_turn(conn, plan_turn(cfg, rng, kind), cfg)
                            state.record(sample, user=k, turn=turn, active=active)
                            turn += 1
                            if sample["outcome"] == "failed":
                                break
                            pause = listening_pause(cfg, sample, clock(), rng)
                            if pause > 0:
                                await asyncio.sleep(min(pause, max(0.0, stop_at - clock())))
                except OSError as exc:
                    state.record({"outcome": "failed", "error": type(exc).__name__,
                                  "error_message": str(exc), "began_at": clock(),
                                  "kind": "connect"}, user=k, turn=turn, active=state.active)
                    await asyncio.sleep(0.5)
        finally:
            state.active -= 1

    await asyncio.gather(*(user(k) for k in range(users)))


if __name__ == "__main__":
    sys.exit(main())
