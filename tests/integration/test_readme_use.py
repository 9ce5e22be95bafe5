"""Every command of README's "Use it from ..." section, run as written against a real
server (its port put in for 8765) and a stand-in OpenAI-compatible LLM (for 8000)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import av
import pytest

from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import scaled

ROOT = Path(__file__).resolve().parents[2]


def section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Use it from ...")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section(), flags=re.S)


def commands() -> list[str]:
    return [line for block in blocks("sh") for line in block.splitlines() if line.strip()]


class FakeLlm:
    """An OpenAI-compatible chat endpoint that streams a fixed reply word by word."""

    REPLY = "The sea is wide and deep. It covers most of the planet."

    def __init__(self) -> None:
        from aiohttp import web

        async def chat(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            assert body["stream"] is True
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for word in self.REPLY.split(" "):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                         "model": body["model"], "choices": [
                             {"index": 0, "delta": {"content": word + " "},
                              "finish_reason": None}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
                await asyncio.sleep(0.02)
            await resp.write(b"data: [DONE]\n\n")
            return resp

        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", chat)
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        from aiohttp import web

        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        runner = web.AppRunner(self.app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> FakeLlm:
        self._thread.start()
        if not self._ready.wait(scaled(30)):
            raise TimeoutError("the fake LLM did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLlm]:
    with FakeLlm() as fake:
        yield fake


def as_run_here(command: str, server: ServerThread, llm: FakeLlm) -> list[str]:
    command = command.replace("127.0.0.1:8765", f"127.0.0.1:{server.port}")
    command = command.replace("127.0.0.1:8000", f"127.0.0.1:{llm.port}")
    argv = shlex.split(command)
    if argv[0] == ".venv/bin/python":
        argv[0] = sys.executable
    for i, arg in enumerate(argv):
        if arg.startswith(("examples/", "integrations/")):
            argv[i] = str(ROOT / arg)
    return argv


def decodes_to_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        return sum(f.samples / f.sample_rate for f in container.decode(audio=0))


def test_the_section_has_every_way_in() -> None:
    text = section()
    for part in ("the browser", "Python", "the OpenAI API", "Pipecat", "LiveKit"):
        assert f"### ... {part}" in text
    assert len(commands()) == 6


@pytest.mark.parametrize("index", range(6))
def test_each_command_works_as_written(server: ServerThread, llm: FakeLlm, tmp_path: Path,
                                       index: int) -> None:
    command = commands()[index]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's rtserver
    proc = subprocess.run(as_run_here(command, server, llm), cwd=tmp_path, env=env,
                          capture_output=True, timeout=180)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    made = {p.name: p for p in tmp_path.iterdir()}
    out = proc.stdout.decode()
    if "say_sync" in command:
        assert out.split()[0] == "True" and float(out.split()[1]) > 500
    elif "hello.mp3" in command:
        assert decodes_to_seconds(made["hello.mp3"].read_bytes()) > 1.0
    elif "stream_format" in command:
        events = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "speech.audio.done"
        assert any(e["type"] == "speech.audio.delta" for e in events)
    else:
        (name,) = [n for n in made if n.endswith(".wav")]
        with wave.open(str(made[name])) as wav:
            assert wav.getnframes() / wav.getframerate() > 1.0


def test_the_openai_client_example_runs(server: ServerThread, tmp_path: Path) -> None:
    (code,) = [b for b in blocks("python") if b.startswith("from openai import OpenAI")]
    code = code.replace("127.0.0.1:8765", f"127.0.0.1:{server.port}")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert decodes_to_seconds((tmp_path / "hello.ogg").read_bytes()) > 1.0
