"""A voice family from another distribution is found through the ``rtserver.voices``
entry point group and served with no edit inside ``rtserver/``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rtserver.client import say_sync
from rtserver.tools.bench.server_proc import SpawnedServer, free_port, rtserver_command, spawn

TOY = Path(__file__).parent / "toy-voice"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy distribution, installed by pip into a folder of its own."""
    target = tmp_path_factory.mktemp("toy-site")
    source = tmp_path_factory.mktemp("toy-src") / "toy-voice"
    shutil.copytree(TOY, source)  # pip builds in the source folder: not in the repository's
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(target), str(source)],
                   check=True, timeout=300)
    assert (target / "rtserver_toy_voice.py").is_file()
    return target


@pytest.fixture(scope="module")
def server(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnedServer]:
    port = free_port()
    env = {**os.environ, "RTSERVER_TOY_PITCH_HZ": "500", "PYTHONPATH": os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}
    proc = spawn(rtserver_command(port, "toy:beep"), port,
                 tmp_path_factory.mktemp("toy-log") / "server.log", env=env)
    yield proc
    proc.stop()


def test_the_installed_family_is_listed(site: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}
    out = subprocess.run([sys.executable, "-m", "rtserver", "voices", "--voice", "toy:beep"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "toy:beep" in out.stdout


def test_the_installed_family_speaks_with_its_own_section(server: SpawnedServer) -> None:
    result = say_sync(server.url, "Hello from a plug-in.", format="pcm_s16le",
                      sample_rate=16000)
    assert result.ok and result.pcm is not None
    assert result.audio_ms >= 20 * len("Hello from a plug-in.") * 0.9
    spectrum = np.abs(np.fft.rfft(result.pcm))
    peak_hz = np.argmax(spectrum) * 16000 / len(result.pcm)
    assert abs(peak_hz - 500) < 5, peak_hz  # [toy] pitch_hz from RTSERVER_TOY_PITCH_HZ
