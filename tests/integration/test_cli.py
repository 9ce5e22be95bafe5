"""The command line as a user runs it: ``rtserver say`` and ``rtserver serve``
(with a graceful drain on SIGTERM)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rtserver.client import AudioFrames, RtClient
from rtserver.testing.server_thread import ServerThread
from rtserver.testing.wait import scaled, wait_until, wait_until_async


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def test_say_writes_a_wav_of_speech(tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "rtserver", "say", "Hello there, this is rtserver speaking.",
         "-o", str(out), "--sample-rate", "16000"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with wave.open(str(out)) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    seconds = len(pcm) / 16000
    assert 1.2 < seconds < 6.0, seconds
    assert np.sqrt(np.mean((pcm / 32768.0) ** 2)) > 0.02
    assert "segment" in proc.stderr


def test_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version

    import rtserver

    out = subprocess.run([sys.executable, "-m", "rtserver", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"rtserver {rtserver.__version__}"
    assert rtserver.__version__ == version("rtserver")


def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[server]\nport = 'eighty'\n")
    proc = subprocess.run([sys.executable, "-m", "rtserver", "voices", "--config", str(cfg)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "configuration error" in proc.stderr and "port" in proc.stderr


@pytest.fixture
def served() -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    env = dict(os.environ, RTSERVER_SERVER_DRAIN_TIMEOUT_S="20")
    proc = subprocess.Popen([sys.executable, "-m", "rtserver", "serve", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wait_until(lambda: status(f"http://127.0.0.1:{port}/ready") == 200
               or proc.poll() is not None, "the server is ready", 120)
    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    yield proc, port
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


async def test_sigterm_drains_open_contexts_then_closes_1001(
        served: tuple[subprocess.Popen[str], int]) -> None:
    proc, port = served
    async with RtClient.connect(f"ws://127.0.0.1:{port}/v1/stream") as client:
        ctx = await client.start()
        await ctx.send_text("This turn began before the server was told to stop, ")
        async for event in ctx.events():
            if isinstance(event, AudioFrames):
                break
        # the context stays open (no end yet): the drain waits for it
        proc.send_signal(signal.SIGTERM)
        ready = f"http://127.0.0.1:{port}/ready"
        await wait_until_async(lambda: status(ready) != 200, "/ready no longer 200 after SIGTERM")
        assert status(ready) == 503  # out of the load balancer
        await ctx.send_text("and it still finishes speaking.")
        await ctx.end()
        result = await ctx.collect()
        assert result.ok, (result.error, result.failure)
        await wait_until_async(lambda: client.closed, "the server closes the connection")
        assert client.close_code == 1001
    assert proc.wait(timeout=scaled(30)) == 0


def test_say_speaks_through_a_running_server(tmp_path: Path, server: ServerThread) -> None:
    out = tmp_path / "remote.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "rtserver", "say", "Hello there, from the server.",
         "-o", str(out), "--url", server.url],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert 1.0 < len(pcm) / 24000 < 6.0
    assert np.sqrt(np.mean((pcm / 32768.0) ** 2)) > 0.02
    assert "voice piper:en_US-joe-medium" in proc.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "rtserver", "say", "Hi.", "-o", str(out), "--url",
         f"ws://127.0.0.1:{free_port()}/v1/stream"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "rtserver:" in refused.stderr  # no traceback
    assert "Traceback" not in refused.stderr
