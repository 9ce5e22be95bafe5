"""The package as a user installs it: a wheel built from the sources, installed
(not editable) into a fresh venv, run from a folder that is not the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import wave
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_an_installed_wheel_runs_bench_and_say_from_any_folder(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a copy: building writes build/ and egg-info beside the sources
    shutil.copytree(ROOT / "rtserver", src / "rtserver",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(dist), str(src)], check=True, timeout=300)
    [wheel] = dist.glob("rtserver-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300)
    # The dependencies: this interpreter's site-packages, appended as a plain path
    # (its .pth files, the editable install's finder among them, are not run).
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    # as a user runs it: no PYTHONPATH of this test run (it may point at the sources)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where = subprocess.run([str(py), "-c", "import rtserver; print(rtserver.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True,
                           check=True).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not the repository's
    rtserver = venv / "bin" / "rtserver"
    bench = subprocess.run([str(rtserver), "bench", "--help"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr
    assert "--concurrency" in bench.stdout
    say = subprocess.run([str(rtserver), "say", "Hello there.", "-o", "x.wav"], cwd=work,
                         env=env, capture_output=True, text=True, timeout=300)
    assert say.returncode == 0, say.stderr
    with wave.open(str(work / "x.wav")) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert 0.4 < len(pcm) / rate < 3.0  # "Hello there." is about a second of speech
    assert np.sqrt(np.mean((pcm / 32768.0) ** 2)) > 0.02
