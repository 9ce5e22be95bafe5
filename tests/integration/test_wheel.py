"""The package as a user installs it: a wheel built from the sources, installed
(not editable) into a fresh venv without matplotlib (the `bench` extra), run
from a folder that is not the repository."""

from __future__ import annotations

import subprocess
import urllib.request
import wave
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from rtserver.testing.wheels import (
    ROOT,
    build_rtserver_wheel,
    dependency_view,
    fresh_venv,
    user_env,
)
from rtserver.tools.bench.server_proc import free_port, http_get, spawn

# What a pip-installed `rtserver serve` answers, by path: the content type it must have.
SERVED = {"/": "text/html", "/ready": "text/plain", "/docs": "text/html",
          "/openapi.json": "application/json"}


@dataclass(frozen=True)
class Installed:
    wheel: Path
    bin: Path  # the venv's bin/
    work: Path  # a folder outside the repository, the commands' working folder


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_rtserver_wheel(tmp / "dist", tmp / "src")
    view = dependency_view(tmp / "deps", leave_out=["matplotlib", "mpl_toolkits"])
    bin_dir = fresh_venv(tmp / "venv", [wheel], view)
    work = tmp / "elsewhere"
    work.mkdir()
    return Installed(wheel, bin_dir, work)


def run(inst: Installed, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(inst.bin / argv[0]), *argv[1:]], cwd=inst.work, env=user_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def served(installed: Installed) -> Iterator[str]:
    """`rtserver serve` of the installed wheel: its http://127.0.0.1:PORT."""
    port = free_port()
    server = spawn([str(installed.bin / "rtserver"), "serve", "--host", "127.0.0.1",
                    "--port", str(port)], port, installed.work / "server.log", env=user_env())
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.mark.slow
def test_the_wheel_carries_the_demo_and_the_licence(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    demo = sorted(p.name for p in (ROOT / "rtserver" / "web_demo").iterdir())
    assert [n for n in demo if f"rtserver/web_demo/{n}" not in names] == []
    licences = {n.rsplit("/", 1)[-1] for n in names if "/licenses/" in n}
    assert {"LICENSE", "NOTICE"} <= licences
    where = run(installed, "python", "-c", "import rtserver; print(rtserver.__file__)")
    assert where.stdout.startswith(str(installed.bin.parent)), where  # not the repository's


@pytest.mark.slow
def test_version_is_the_distributions(installed: Installed) -> None:
    out = run(installed, "rtserver", "--version")
    assert out.returncode == 0, out.stderr
    wheel_version = installed.wheel.name.split("-")[1]  # rtserver-VERSION-py3-none-any.whl
    assert out.stdout.strip() == f"rtserver {wheel_version}"


@pytest.mark.slow
def test_an_installed_server_serves_the_demo(installed: Installed, served: str) -> None:
    for path, ctype in SERVED.items():
        with urllib.request.urlopen(served + path, timeout=10) as resp:
            assert resp.status == 200, path
            assert resp.headers["content-type"].startswith(ctype), (path, resp.headers)
    demo = ROOT / "rtserver" / "web_demo"
    assert http_get(served + "/") == (200, (demo / "index.html").read_bytes())
    assert http_get(served + "/app.js") == (200, (demo / "app.js").read_bytes())


@pytest.mark.slow
def test_bench_without_matplotlib_runs_and_names_the_extra(installed: Installed,
                                                            served: str) -> None:
    ws = served.replace("http://", "ws://") + "/v1/stream"
    out = run(installed, "rtserver", "bench", "--url", ws, "--concurrency", "1",
              "--duration", "1", "--warmup", "0", "--out", "bench-out", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "rtserver[bench]" in out.stderr
    written = {p.name for p in (installed.work / "bench-out").iterdir()}
    assert "summary.md" in written
    assert not [n for n in written if n.endswith(".png")]


@pytest.mark.slow
def test_an_installed_wheel_runs_bench_and_say_from_any_folder(installed: Installed) -> None:
    bench = run(installed, "rtserver", "bench", "--help", timeout=120)
    assert bench.returncode == 0, bench.stderr
    assert "--concurrency" in bench.stdout
    say = run(installed, "rtserver", "say", "Hello there.", "-o", "x.wav")
    assert say.returncode == 0, say.stderr
    with wave.open(str(installed.work / "x.wav")) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert 0.4 < len(pcm) / rate < 3.0  # "Hello there." is about a second of speech
    assert np.sqrt(np.mean((pcm / 32768.0) ** 2)) > 0.02
